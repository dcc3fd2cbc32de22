"""The click-free fast path of `env_layers serve --dry-run` against the click path: the same stdout, stderr and
exit code for a table of command lines and environments (valid, invalid, edge cases). Each line runs twice as a
real process, each in its own copy of the catalog (found upward from the working folder): through `main()`,
which takes the fast path when it can, and through the click group directly. Forms that would submit a job are
checked in-process: the fast path must decline them before anything runs.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from test_cli_fastpath import CLICK, FAST, FAST_ECHO, VIA_CLICK, VIA_MAIN, _run

REPO = Path(__file__).resolve().parents[1]
RENDER = REPO / "experiments/renders/.env.experiment.qwen38"


@pytest.fixture
def places(tmp_path):
    """Paths the command lines and environment values name: {name} is replaced."""
    p = {
        "repo": str(REPO),
        "empty": str(tmp_path / "empty"),
        "file": str(tmp_path / "a-file"),
        "dir": str(tmp_path / "a-dir"),
        "missing": str(tmp_path / "no-such-file.env"),
        "mine": str(tmp_path / "mine.env"),
        "ansi": str(tmp_path / "ansi.env"),
        "utf8": str(tmp_path / "utf8.env"),
        "badlayer": str(tmp_path / "bad.env"),
        "unset": str(tmp_path / "unset.env"),
        "base": str(RENDER),
        "edf": str(tmp_path / "edf"),
    }
    for name in ("empty", "dir", "edf"):
        Path(p[name]).mkdir()
    Path(p["file"]).write_text("x\n")
    serve_only = (REPO / "experiments/serve-only.env").read_text()
    Path(p["mine"]).write_text(serve_only + "SERVER_PORT=9001\n")
    Path(p["ansi"]).write_text(serve_only + "COLOR='\x1b[31mred\x1b[0m'\n")
    Path(p["utf8"]).write_text(serve_only + "NAME='caf\u00e9 \u2713'\n", encoding="utf-8")
    Path(p["badlayer"]).write_text("A=1\nB=$(date)\n")
    Path(p["unset"]).write_text(serve_only + "MY_DIR=\"${SOME_UNSET_NAME}/x\"\n")
    return p


# (arguments, extra environment, the way main() answers)
CASES = [
    pytest.param(["serve", "--dry-run"], {}, FAST, id="defaults"),
    pytest.param(["serve", "--model", "glm53", "--dry-run"], {}, FAST, id="model"),
    pytest.param(["serve", "--dry-run", "--model=glm53"], {}, FAST, id="model-equals"),
    pytest.param(["serve", "--dry-run", "--json", "--model", "oss120b"], {}, FAST, id="json"),
    pytest.param(["serve", "--json", "--dry-run"], {}, FAST, id="json-first"),
    pytest.param(["--root", "{repo}", "serve", "--dry-run", "--model", "kimi27sglang"], {}, FAST, id="root"),
    pytest.param(["--root={repo}", "serve", "--dry-run"], {}, FAST, id="root-equals"),
    pytest.param(["serve", "--dry-run", "--experiment", "replicas", "--model", "qwen38"], {}, FAST, id="experiment"),
    pytest.param(["serve", "--dry-run", "--model", "qwen38mi200"], {}, FAST, id="another-engine"),
    pytest.param(["serve", "--dry-run", "--time", "08:00:00"], {}, FAST, id="time"),
    pytest.param(["serve", "--dry-run", "--time=1-00:00:00", "--model", "glm53"], {}, FAST, id="time-equals"),
    pytest.param(["serve", "--dry-run", "--time", "30"], {"AGENT_READY_TIMEOUT_SECONDS": "3600"}, FAST,
                 id="budget-over-the-time-limit-warns"),
    pytest.param(["serve", "--dry-run"], {"MODEL": "glm53"}, FAST, id="model-from-env"),
    pytest.param(["serve", "--dry-run", "--model", "qwen38"], {"MODEL": "glm53"}, FAST, id="option-beats-env"),
    pytest.param(["serve", "--dry-run"], {"EXPERIMENT": "replicas", "SERVE_TIME": "02:00:00"}, FAST,
                 id="experiment-and-time-from-env"),
    pytest.param(["serve", "--dry-run", "--env-file", "{mine}"], {}, FAST, id="env-file"),
    pytest.param(["serve", "--dry-run", "--env-file={mine}"], {}, FAST, id="env-file-equals"),
    pytest.param(["serve", "--dry-run"], {"SERVE_ENV_FILE": "{mine}"}, FAST, id="env-file-from-env"),
    pytest.param(["serve", "--dry-run", "--base-env", "{base}"], {}, FAST, id="base-env"),
    pytest.param(["serve", "--dry-run"], {"SERVE_BASE_ENV": "{base}", "SERVE_ENV_FILE": "{mine}"}, FAST,
                 id="base-env-and-env-file-from-env"),
    pytest.param(["serve", "--dry-run"], {"WAIT": "1", "VERIFY": "no"}, FAST, id="wait-verify-passed-over"),
    pytest.param(["serve", "--dry-run"], {"ENVLAYERS_ROOT": "{repo}"}, FAST, id="root-from-env"),
    pytest.param(["serve", "--dry-run", "--env-file", "{unset}"], {}, FAST, id="unset-reference-warning"),
    pytest.param(["serve", "--dry-run", "--env-file", "{utf8}"], {}, FAST, id="non-ascii"),
    # written with click.echo, as the click path does: escape sequences stripped, an ASCII stdout mended
    pytest.param(["serve", "--dry-run", "--env-file", "{ansi}"], {}, FAST_ECHO, id="ansi-escape"),
    pytest.param(["serve", "--dry-run", "--env-file", "{utf8}"], {"PYTHONIOENCODING": "ascii"}, FAST_ECHO,
                 id="ascii-stdout"),
    # the fast path declines, click answers
    pytest.param(["serve", "--dry-run", "--help"], {}, CLICK, id="help"),
    pytest.param(["serve", "-h"], {}, CLICK, id="h"),
    pytest.param(["serve", "--dry-run", "--model"], {}, CLICK, id="model-without-value"),
    pytest.param(["serve", "--dry-run", "--model", ""], {}, CLICK, id="model-empty"),
    pytest.param(["serve", "--dry-run", "--model="], {}, CLICK, id="model-equals-empty"),
    pytest.param(["serve", "--dry-run", "--model", "-x"], {}, CLICK, id="model-dash"),
    pytest.param(["serve", "--dry-run", "--model", "glm53", "--model", "qwen38"], {}, CLICK, id="model-twice"),
    pytest.param(["serve", "--dry-run", "--dry-run"], {}, CLICK, id="dry-run-twice"),
    pytest.param(["serve", "--dry-run", "--json", "--json"], {}, CLICK, id="json-twice"),
    pytest.param(["serve", "--dry-run=1"], {}, CLICK, id="flag-with-value"),
    pytest.param(["serve", "--dry-run", "--wait"], {}, CLICK, id="wait-flag"),
    pytest.param(["serve", "--dry-run", "--verify"], {}, CLICK, id="verify-flag"),
    pytest.param(["serve", "--dry-run", "--in-allocation"], {}, CLICK, id="in-allocation"),
    pytest.param(["serve", "--dry-run", "glm53"], {}, CLICK, id="positional"),
    pytest.param(["serve", "--dry-run", "--bogus"], {}, CLICK, id="unknown-option"),
    pytest.param(["serve", "--dry-run", "--mod", "glm53"], {}, CLICK, id="abbreviated-option"),
    pytest.param(["serve", "--dry-run", "--", "x"], {}, CLICK, id="double-dash"),
    pytest.param(["serve", "--dry-run", "--root", "{repo}"], {}, CLICK, id="root-after-command"),
    pytest.param(["--root", "{repo}", "--root", "{repo}", "serve", "--dry-run"], {}, CLICK, id="root-twice"),
    pytest.param(["--root", "{file}", "serve", "--dry-run"], {}, CLICK, id="root-is-a-file"),
    pytest.param(["--root", "{empty}", "serve", "--dry-run"], {}, CLICK, id="root-without-catalog"),
    pytest.param(["serve", "--dry-run", "--model", "nope"], {}, CLICK, id="unknown-model"),
    pytest.param(["serve", "--dry-run", "--experiment", "nope"], {}, CLICK, id="unknown-experiment"),
    pytest.param(["serve", "--dry-run", "--time", "soon"], {}, CLICK, id="bad-time"),
    pytest.param(["serve", "--dry-run"], {"SERVE_TIME": "soon"}, CLICK, id="bad-time-from-env"),
    pytest.param(["serve", "--dry-run", "--env-file", "{missing}"], {}, CLICK, id="env-file-missing"),
    pytest.param(["serve", "--dry-run", "--env-file", "{dir}"], {}, CLICK, id="env-file-is-a-folder"),
    pytest.param(["serve", "--dry-run", "--base-env", "{missing}"], {}, CLICK, id="base-env-missing"),
    pytest.param(["serve", "--dry-run"], {"SERVE_ENV_FILE": "{missing}"}, CLICK, id="env-file-from-env-missing"),
    pytest.param(["serve", "--dry-run"], {"SERVE_BASE_ENV": "{dir}"}, CLICK, id="base-env-from-env-is-a-folder"),
    pytest.param(["serve", "--dry-run", "--env-file", "{badlayer}"], {}, CLICK, id="env-file-syntax-error"),
    pytest.param(["serve", "--dry-run"], {"MODEL": ""}, CLICK, id="model-env-empty"),
    pytest.param(["serve", "--dry-run"], {"WAIT": "maybe"}, CLICK, id="wait-env-not-a-boolean"),
    pytest.param(["serve", "--dry-run"], {"VERIFY": ""}, CLICK, id="verify-env-empty"),
    pytest.param(["serve", "--dry-run"], {"ENVLAYERS_ROOT": "{empty}"}, CLICK, id="env-root-without-catalog"),
    pytest.param(["serve", "--dry-run"], {"ENVLAYERS_DEBUG": "1"}, CLICK, id="debug"),
    pytest.param(["serve", "--dry-run"], {"_ENV_LAYERS_COMPLETE": "bash_source"}, CLICK, id="completion"),
]

# the environment both ways start from: no stray settings of the caller's shell, the EDFs looked for in an
# empty folder (the dry run names them as not installed)
_DROPPED = ("ENVLAYERS_ROOT", "ENVLAYERS_DEBUG", "MODEL", "EXPERIMENT", "SERVE_TIME", "SERVE_BASE_ENV",
            "SERVE_ENV_FILE", "WAIT", "VERIFY", "SLURM_JOB_ID", "AGENT_READY_TIMEOUT_SECONDS", "_ENV_LAYERS_COMPLETE")


@pytest.mark.parametrize("args, extra_env, way_expected", CASES)
def test_fast_path_matches_click_path(tmp_path, places, args, extra_env, way_expected):
    results = {}
    for way, code in (("main", VIA_MAIN), ("click", VIA_CLICK)):
        run_dir = tmp_path / way
        for part in ("experiments", "containers"):  # the catalog, found upward from the working folder
            shutil.copytree(REPO / part, run_dir / part)
        argv = [a.format(**places) for a in args]
        env = {k: v for k, v in os.environ.items() if k not in _DROPPED}
        env.update({"EDF_PATH": places["edf"], **{k: v.format(**places) for k, v in extra_env.items()}})
        proc, way_taken = _run(code, argv, env, run_dir, run_dir)
        stdout, stderr = (s.replace(str(run_dir).encode(), b"{run_dir}") for s in (proc.stdout, proc.stderr))
        if "ENVLAYERS_DEBUG" in extra_env and proc.returncode:  # a traceback: main() adds a frame
            stderr = stderr.strip().splitlines()[-1]
        results[way] = (proc.returncode, stdout, stderr)
        if way == "main":
            assert way_taken == way_expected, f"stderr: {proc.stderr[-500:]!r}"
    assert results["main"] == results["click"]
    if way_expected != CLICK:
        assert results["main"][0] == 0 and results["main"][1].startswith((b"# envlayers dry run", b"{"))


@pytest.mark.parametrize("args, env", [
    pytest.param(["serve"], {}, id="submission"),
    pytest.param(["serve", "--model", "glm53"], {}, id="submission-with-model"),
    pytest.param(["serve", "--json"], {}, id="submission-json"),
    pytest.param(["serve", "--wait", "--dry-run"], {}, id="wait"),
    pytest.param(["serve", "--dry-run", "--in-allocation"], {}, id="in-allocation"),
    pytest.param(["serve", "--dry-run"], {"WAIT": "later"}, id="wait-env-unknown-word"),
    pytest.param(["serve", "--dry-run"], {"SERVE_ENV_FILE": ""}, id="empty-env-file"),
    pytest.param(["plan", "--dry-run"], {}, id="other-command"),
    pytest.param(["--version", "serve", "--dry-run"], {}, id="group-option"),
])
def test_forms_that_are_not_the_plain_dry_run_are_declined(monkeypatch, args, env):
    from envlayers.cli.fastpath import _plain_serve_dry_run

    for name in _DROPPED:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert _plain_serve_dry_run(args) is None


def test_the_plain_dry_run_is_parsed_with_the_serve_command_defaults(monkeypatch):
    from envlayers.cli.fastpath import _plain_serve_dry_run
    from envlayers.defaults import DEFAULT_EXPERIMENT, DEFAULT_MODEL, DEFAULT_TIME

    for name in _DROPPED:
        monkeypatch.delenv(name, raising=False)
    assert _plain_serve_dry_run(["serve", "--dry-run"]) == (None, {
        "model": DEFAULT_MODEL, "experiment": DEFAULT_EXPERIMENT, "time": DEFAULT_TIME, "base_env": None,
        "env_file": None}, False)
    monkeypatch.setenv("MODEL", "glm53")
    root, values, as_json = _plain_serve_dry_run(["--root", str(REPO), "serve", "--json", "--dry-run",
                                                  "--time=08:00:00"])
    assert (root, values["model"], values["time"], as_json) == (str(REPO), "glm53", "08:00:00", True)


def test_the_wrapper_dry_run_takes_the_fast_path(tmp_path):
    """`SUBMIT=0 cluster/serve-only.sbatch` runs `env_layers serve --dry-run`: answered without click."""
    import subprocess
    import sys

    flag = tmp_path / "way"
    shim = tmp_path / "bin"
    shim.mkdir()
    # `python3 -m envlayers ARGS` -> main() with ARGS, which records the way it answered in `flag`
    (shim / "python3").write_text(f"#!/bin/sh\n[ \"$1\" = -m ] && shift 2\n"
                                  f"exec {sys.executable} -c \"{VIA_MAIN}\" {flag} \"$@\"\n")
    (shim / "python3").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in _DROPPED}
    # no env_layers on PATH: the wrapper runs "${PYTHON:-python3}" -m envlayers, which the shim answers
    env.update(PATH=f"{shim}:/usr/bin:/bin", SUBMIT="0", MODEL="glm53", EDF_PATH=str(tmp_path))
    proc = subprocess.run(["bash", str(REPO / "cluster/serve-only.sbatch")], env=env, capture_output=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(b"# envlayers dry run") and flag.read_text() == FAST


def test_the_fast_path_reads_the_options_of_the_click_command():
    """Each option the fast path reads has the click command's name, environment variable and default; every
    other option of the command is one the fast path declines."""
    from envlayers.cli import fastpath
    from envlayers.cli.serve_cmds import serve

    options = {opt: p for p in serve.params for opt in p.opts}
    for name, (key, var) in fastpath._SERVE_VALUES.items():
        param = options.pop(name)
        default = param.default if isinstance(param.default, str) else None  # no default: None or click's UNSET
        assert (param.envvar, default) == (var, fastpath._SERVE_DEFAULTS.get(key)), name
    for flag in ("--dry-run", "--json"):
        assert options.pop(flag).is_flag
    assert {p.envvar for p in set(options.values()) if p.envvar} == set(fastpath._SERVE_FLAG_VARS)
    assert not any(p.required for p in serve.params)
