"""The click-free fast path of `env_layers render` against the click path: same stdout, stderr, exit code
and written file, for a table of command lines (valid, invalid, edge cases). Each line runs twice as a real
process, each in its own copy of the catalog: through `main()` (which takes the fast path when it can) and
through the click group directly.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# main() as the console script calls it; the first argument names a file that receives which way it answered:
# "click" (the click group ran the command), "fast+click" (the fast path, writing with click.echo) or "fast"
VIA_MAIN = ("import sys, atexit; flag = sys.argv.pop(1); "
            "atexit.register(lambda: open(flag, 'w').write('click' if 'cli' in vars(sys.modules['envlayers.cli']) "
            "else 'fast+click' if 'click' in sys.modules else 'fast')); "
            "from envlayers.cli import main; main()")
VIA_CLICK = ("import sys; flag = sys.argv.pop(1); "
             "from envlayers.cli import cli; cli.main(args=sys.argv[1:], prog_name='env_layers')")

FAST, FAST_ECHO, CLICK = "fast", "fast+click", "click"
SETUPS = "version: 1\nexperiments:\n  e:\n    description: x\nmodels:\n  m:\n    description: y\n"


def _mini_root(base: Path, model_env: str) -> Path:
    layers = base / "experiments" / "layers"
    layers.mkdir(parents=True)
    (base / "experiments" / "setups.yaml").write_text(SETUPS)
    (layers / "common.env").write_text("A=1\n")
    (layers / "model-m.env").write_text(model_env, encoding="utf-8")
    return base


@pytest.fixture
def places(tmp_path):
    """Paths the command lines name: {name} in an argument or an environment value is replaced."""
    big = "".join(f"K{i}='{'v' * 40}'\n" for i in range(4000))  # a render larger than a pipe's buffer
    p = {
        "repo": str(REPO),
        "empty": str(tmp_path / "empty"),
        "file": str(tmp_path / "a-file"),
        "dir": str(tmp_path / "a-dir"),
        "missing": str(tmp_path / "no-such-dir"),
        "badlayer": str(_mini_root(tmp_path / "badlayer", "B=1\nC=$(date)\n")),
        "ansi": str(_mini_root(tmp_path / "ansi", "COLOR='\x1b[31mred\x1b[0m'\n")),
        "utf8": str(_mini_root(tmp_path / "utf8", "NAME='café ✓'\n")),
        "big": str(_mini_root(tmp_path / "big", big)),
        "extra": str(tmp_path / "extra.env"),
    }
    (tmp_path / "empty").mkdir()
    (tmp_path / "a-dir").mkdir()
    Path(p["file"]).write_text("x\n")
    Path(p["extra"]).write_text("EXTRA=1\n")
    return p


# (arguments, extra environment, the way main() answers: FAST without click, FAST_ECHO writing with click.echo,
# CLICK through the click group)
CASES = [
    pytest.param(["render", "experiment:glm53"], {}, FAST, id="plain"),
    pytest.param(["render", "experiment:qwen38", "--format", "json"], {}, FAST, id="format-json"),
    pytest.param(["render", "--format", "env", "experiment:qwen38"], {}, FAST, id="format-before-target"),
    pytest.param(["render", "experiment:qwen38", "--format=json"], {}, FAST, id="format-equals"),
    pytest.param(["render", "replicas:qwen38mi200", "--format", "sh"], {}, FAST, id="format-sh-replicas"),
    pytest.param(["--root", "{repo}", "render", "experiment:glm53"], {}, FAST, id="root"),
    pytest.param(["--root={repo}", "render", "experiment:oss120b", "--format", "env"], {}, FAST, id="root-equals"),
    pytest.param(["render", "experiment:glm53", "-o", "{out}"], {}, FAST, id="output-short"),
    pytest.param(["render", "experiment:glm53", "--output", "{out}", "--format", "json"], {}, FAST, id="output-long"),
    pytest.param(["render", "--output={out}", "experiment:kimi27sglang"], {}, FAST, id="output-equals"),
    # a missing folder is an error, which the one-line error printer says with click
    pytest.param(["render", "experiment:glm53", "-o", "{outdir}/new/sub/r.sh"], {}, FAST_ECHO, id="output-new-folder"),
    pytest.param(["--root", "{ansi}", "render", "e:m"], {}, FAST_ECHO, id="ansi-escape-stripped-like-click"),
    pytest.param(["--root", "{utf8}", "render", "e:m"], {}, FAST, id="non-ascii"),
    pytest.param(["--root", "{utf8}", "render", "e:m"], {"PYTHONIOENCODING": "ascii"}, FAST_ECHO, id="ascii-stdout"),
    pytest.param(["--root", "{big}", "render", "e:m"], {}, FAST, id="large-render"),
    pytest.param(["render", "experiment:glm53"], {"ENVLAYERS_ROOT": "{repo}"}, FAST, id="root-from-env"),
    # errors: the fast path declines, click says it
    pytest.param(["render", "nope:glm53"], {}, CLICK, id="unknown-experiment"),
    pytest.param(["render", "experiment:glm5"], {}, CLICK, id="unknown-model-nearest"),
    pytest.param(["render", "experiment"], {}, CLICK, id="not-a-target"),
    pytest.param(["render", "experiment:glm53:x"], {}, CLICK, id="two-colons"),
    pytest.param(["render", ""], {}, CLICK, id="empty-target"),
    pytest.param(["render"], {}, CLICK, id="missing-target"),
    pytest.param(["render", "experiment:glm53", "experiment:qwen38"], {}, CLICK, id="two-targets"),
    pytest.param(["render", "experiment:glm53", "--format", "yaml"], {}, CLICK, id="bad-format"),
    pytest.param(["render", "experiment:glm53", "--format", "JSON"], {}, CLICK, id="format-case"),
    pytest.param(["render", "experiment:glm53", "--format"], {}, CLICK, id="format-without-value"),
    pytest.param(["render", "experiment:glm53", "--format="], {}, CLICK, id="format-empty"),
    pytest.param(["render", "experiment:glm53", "--format", "json", "--format", "sh"], {}, CLICK, id="format-twice"),
    pytest.param(["render", "experiment:glm53", "-o", "{out}", "-o", "{out}2"], {}, CLICK, id="output-twice"),
    pytest.param(["render", "experiment:glm53", "-o", "{dir}"], {}, CLICK, id="output-is-a-folder"),
    pytest.param(["render", "experiment:glm53", "-o"], {}, CLICK, id="output-without-value"),
    pytest.param(["render", "experiment:glm53", "-o{out}"], {}, CLICK, id="output-attached"),
    pytest.param(["render", "experiment:glm53", "-o", "-x"], {}, CLICK, id="output-dash"),
    pytest.param(["render", "experiment:glm53", "--bogus"], {}, CLICK, id="unknown-option"),
    pytest.param(["render", "--", "experiment:glm53"], {}, CLICK, id="double-dash"),
    pytest.param(["render", "experiment:glm53", "--root", "{repo}"], {}, CLICK, id="root-after-command"),
    pytest.param(["--root", "{repo}", "--root", "{repo}", "render", "experiment:glm53"], {}, CLICK, id="root-twice"),
    pytest.param(["--root", "{empty}", "render", "experiment:glm53"], {}, CLICK, id="root-without-catalog"),
    pytest.param(["--root", "{missing}", "render", "experiment:glm53"], {}, CLICK, id="root-missing"),
    pytest.param(["--root", "{file}", "render", "experiment:glm53"], {}, CLICK, id="root-is-a-file"),
    pytest.param(["--root", "", "render", "experiment:glm53"], {}, CLICK, id="root-empty"),
    pytest.param(["render", "experiment:glm53"], {"ENVLAYERS_ROOT": "{empty}"}, CLICK, id="env-root-without-catalog"),
    pytest.param(["--root", "{badlayer}", "render", "e:m"], {}, CLICK, id="layer-syntax-error"),
    pytest.param(["render", "experiment:glm53", "--strict"], {}, CLICK, id="strict"),
    pytest.param(["render", "experiment:glm53", "--layer", "{extra}"], {}, CLICK, id="extra-layer"),
    pytest.param(["render", "experiment:glm53", "--layer", "{missing}"], {}, CLICK, id="extra-layer-missing"),
    pytest.param(["render", "--help"], {}, CLICK, id="render-help"),
    pytest.param(["render", "-h"], {}, CLICK, id="render-h"),
    pytest.param(["--help"], {}, CLICK, id="help"),
    pytest.param([], {}, CLICK, id="no-arguments"),
    pytest.param(["--version"], {}, CLICK, id="version"),
    pytest.param(["rendr", "experiment:glm53"], {}, CLICK, id="misspelled-command"),
    pytest.param(["explain", "experiment:glm53", "INFERENCE_NODES"], {}, CLICK, id="other-command"),
    pytest.param(["render", "experiment:glm53"], {"_ENV_LAYERS_COMPLETE": "bash_source"}, CLICK, id="completion"),
    pytest.param(["render", "nope:glm53"], {"ENVLAYERS_DEBUG": "1"}, CLICK, id="debug"),
]


# answered without click up to the write, which fails: the same one-line error as the click path
FAST_PATH_ERRORS = {"output-new-folder"}


def _run(code: str, args: list[str], env: dict[str, str], tmp: Path, cwd: Path):
    flag = tmp / "click-imported"
    proc = subprocess.run([sys.executable, "-c", code, str(flag), *args], cwd=cwd, env=env, capture_output=True,
                          timeout=60)
    return proc, flag.read_text() if flag.exists() else None


@pytest.mark.parametrize("args, extra_env, way_expected", CASES)
def test_fast_path_matches_click_path(request, tmp_path, places, args, extra_env, way_expected):
    results = {}
    for way, code in (("main", VIA_MAIN), ("click", VIA_CLICK)):
        run_dir = tmp_path / way
        # the working folder: a copy of the catalog, so a relative output path (-o -x) lands in it, not here
        shutil.copytree(REPO / "experiments", run_dir / "experiments")
        names = dict(places, out=str(run_dir / "out.sh"), outdir=str(run_dir))
        argv = [a.format(**names) for a in args]
        env = {k: v for k, v in os.environ.items() if k not in ("ENVLAYERS_ROOT", "ENVLAYERS_DEBUG")}
        env.update({k: v.format(**names) for k, v in extra_env.items()})
        proc, way_taken = _run(code, argv, env, run_dir, run_dir)
        outputs = {p.relative_to(run_dir): p.read_bytes() for p in sorted(run_dir.rglob("*"))
                   if p.is_file() and p.name != "click-imported"}
        # the per-way folder is named in messages about the output path: compare them as {outdir}
        stdout, stderr = (s.replace(str(run_dir).encode(), b"{outdir}") for s in (proc.stdout, proc.stderr))
        if "ENVLAYERS_DEBUG" in extra_env:  # a traceback: main() adds a frame, the error line is what counts
            stderr = stderr.strip().splitlines()[-1]
        results[way] = (proc.returncode, stdout, stderr, outputs)
        if way == "main":
            assert way_taken == way_expected, f"stderr: {proc.stderr[-500:]!r}"
    assert results["main"] == results["click"]
    if way_expected != CLICK and request.node.callspec.id not in FAST_PATH_ERRORS:
        assert results["main"][0] == 0 and (results["main"][1] or results["main"][3])


def _broken_pipe(code: str, args: list[str]):
    proc = subprocess.Popen([sys.executable, "-c", code, os.devnull, *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader leaves before the render (larger than the pipe's buffer) is written
    err = proc.stderr.read()
    return proc.wait(timeout=60), err


def test_reader_leaving_early_is_exit_141_on_both_paths(places):
    args = ["--root", places["big"], "render", "e:m"]
    assert _broken_pipe(VIA_MAIN, args) == _broken_pipe(VIA_CLICK, args) == (141, b"")


def test_console_script_takes_the_fast_path():
    """The installed `env_layers` (beside this interpreter) renders the committed render."""
    script = Path(sys.executable).parent / "env_layers"
    if not script.exists():
        pytest.skip(f"no env_layers console script beside {sys.executable}")
    proc = subprocess.run([str(script), "render", "experiment:qwen38"], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert (proc.returncode, proc.stderr) == (0, "")
    assert proc.stdout == (REPO / "experiments/renders/.env.experiment.qwen38").read_text()


def test_gc_is_restored_after_an_in_process_render(tmp_path):
    import gc

    from envlayers.cli import main

    assert gc.isenabled()
    with pytest.raises(SystemExit) as info:
        main(["--root", str(REPO), "render", "experiment:glm53", "-o", str(tmp_path / "r.sh")])
    assert info.value.code == 0 and gc.isenabled()
    assert (tmp_path / "r.sh").read_text().startswith("# Generated by `env_layers render experiment:glm53")

