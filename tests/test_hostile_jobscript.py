"""Hostile strings through every text path into the job script and the dry run, run in real bash.

Each string goes in as a layer value (twice: a key the engines ignore, and an engine flag that
reaches the per-rank commands of the dry run), in the name of the SERVE_ENV_FILE that holds it, and
in the python path the job ends with. The job script then runs in bash (with a stand-in python that
records what it got) and the dry run is pasted into bash (with a stand-in sbatch). Nothing may run:
a canary file is never created; every value arrives byte-exact, or the input is refused with a
clear error before anything is written.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from envlayers.errors import EnvLayersError
from envlayers.jobscript import prepare
from envlayers.shell import single_quote

REPO = Path(__file__).resolve().parents[1]
CANARY = "@CANARY@"  # replaced by the canary file's path

HOSTILE = [
    pytest.param("$(touch @CANARY@)", id="command-substitution"),
    pytest.param("`touch @CANARY@`", id="backticks"),
    pytest.param("'; touch @CANARY@; '", id="single-quote-break"),
    pytest.param('"; touch @CANARY@; "', id="double-quote-break"),
    pytest.param("x\ntouch @CANARY@\n", id="newlines"),
    pytest.param("ENVLAYERS_ENV\ntouch @CANARY@\nENVLAYERS_ENV", id="env-heredoc-delimiter"),
    pytest.param("ENVLAYERS_JOB\ntouch @CANARY@\nENVLAYERS_JOB", id="job-heredoc-delimiter"),
    pytest.param("${HOME} $HOME ${IFS} ${X:-$(touch @CANARY@)}", id="parameter-expansions"),
    pytest.param("\\'\\\"\\\\ \\$(touch @CANARY@)", id="backslashes"),
    pytest.param("a;touch @CANARY@&|<>()!*?[]{}~#", id="metacharacters"),
    pytest.param("\t\x1b[31m\x7f\x01", id="control-characters"),
    pytest.param("x" * 100_000 + "$(touch @CANARY@)", id="very-long"),
    pytest.param("\u00e9\u4e2d\U0001f600 $(touch @CANARY@)", id="unicode"),
]

FAKE_PYTHON = """#!{python}
import json, os, sys
json.dump({{"argv": sys.argv[1:], "HOSTILE_VALUE": os.environ.get("HOSTILE_VALUE"),
            "TOOL_CALL_PARSER": os.environ.get("TOOL_CALL_PARSER")}}, open({out!r}, "w"))
"""

FAKE_SBATCH = """#!/bin/sh
printf '%s\\n' "$@" > {args!r}
cat > {stdin!r}
echo 4242
"""


def _file_name(text: str) -> str:
    """``text`` as a file name: no '/', no control character (a file name with a newline is refused, see
    test_jobscript), bounded length."""
    return "".join("_" if c == "/" or ord(c) < 0x20 or ord(c) == 0x7F else c for c in text)[:120]


@pytest.fixture
def edf_env(tmp_path):
    (tmp_path / "edf").mkdir()
    return {"EDF_PATH": str(tmp_path / "edf"), "HOME": str(tmp_path)}


def _prepared(tmp_path: Path, value: str, edf_env: dict[str, str]):
    layer = tmp_path / f"mine {_file_name(value)}.env"
    layer.write_text(f"HOSTILE_VALUE={single_quote(value)}\nTOOL_CALL_PARSER={single_quote(value)}\n"
                     "CONTAINER_RUNTIME=none\n")
    out = tmp_path / "launched.json"
    python = tmp_path / f"py {_file_name(value)}"
    python.write_text(FAKE_PYTHON.format(python=sys.executable, out=str(out)))
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    return prepare(REPO, "oss120b", env_file=layer, python=str(python), environ=edf_env), layer, out


@pytest.mark.parametrize("raw", HOSTILE)
def test_hostile_value_reaches_the_job_byte_exact_and_runs_nothing(tmp_path, edf_env, raw):
    canary = tmp_path / "canary"
    value = raw.replace(CANARY, str(canary))
    job, layer, out = _prepared(tmp_path, value, edf_env)
    script = tmp_path / "job.sh"
    script.write_text(job.script)
    env = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "n1",
           "SCRATCH": str(tmp_path / "scratch"), "HOME": str(tmp_path)}
    proc = subprocess.run(["bash", str(script)], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert not canary.exists(), "the job script ran text from a value"
    got = json.loads(out.read_text())
    assert got["HOSTILE_VALUE"] == value and got["TOOL_CALL_PARSER"] == value
    assert got["argv"] == ["-m", "envlayers", "launch", "--run-dir", str(tmp_path / "scratch/inference-server/77")]
    saved = (tmp_path / "scratch/inference-server/77/serve.env").read_text()
    assert f"export HOSTILE_VALUE={single_quote(value)}\n" in saved
    assert f"#   {layer}" in job.script  # the file name, in its comment line and nowhere else as code


@pytest.mark.parametrize("raw", HOSTILE)
def test_pasting_the_dry_run_submits_exactly_the_job_and_runs_nothing(tmp_path, edf_env, raw):
    canary = tmp_path / "canary"
    value = raw.replace(CANARY, str(canary))
    job, _, _ = _prepared(tmp_path, value, edf_env)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sbatch = bin_dir / "sbatch"
    args, stdin = tmp_path / "sbatch.args", tmp_path / "sbatch.stdin"
    sbatch.write_text(FAKE_SBATCH.format(args=str(args), stdin=str(stdin)))
    sbatch.chmod(0o755)
    proc = subprocess.run(["bash"], input=job.dry_run_text(), env={"PATH": f"{bin_dir}:{os.environ['PATH']}"},
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not canary.exists(), "the dry run ran text from a value"
    assert stdin.read_text() == job.script
    assert args.read_text().splitlines() == ["--parsable", *job.sbatch_args]


@pytest.mark.parametrize("value, needle", [
    pytest.param("mi300\ntouch /tmp/x", "is not a partition name", id="newline"),
    pytest.param("$(touch /tmp/x)", "is not a partition name", id="command-substitution"),
    pytest.param("a b", "is not a partition name", id="space"),
])
def test_hostile_partition_is_refused(tmp_path, edf_env, value, needle):
    layer = tmp_path / "mine.env"
    layer.write_text(f"SLURM_PARTITION={single_quote(value)}\n")
    with pytest.raises(EnvLayersError, match=needle) as err:
        prepare(REPO, "oss120b", env_file=layer, python=sys.executable, environ=edf_env)
    assert str(err.value).startswith(f"{layer}:1: SLURM_PARTITION: ") and "\n" not in str(err.value)


def test_carriage_return_in_a_value_is_refused(tmp_path, edf_env):
    layer = tmp_path / "mine.env"
    layer.write_text("HOSTILE_VALUE='a\rb'\n")
    with pytest.raises(EnvLayersError, match=r"mine.env:1: carriage return"):
        prepare(REPO, "oss120b", env_file=layer, python=sys.executable, environ=edf_env)


def test_nul_in_a_layer_is_refused(tmp_path, edf_env):
    layer = tmp_path / "mine.env"
    layer.write_bytes(b"HOSTILE_VALUE='a\0b'\n")
    with pytest.raises(EnvLayersError, match="NUL byte in file"):
        prepare(REPO, "oss120b", env_file=layer, python=sys.executable, environ=edf_env)


def test_nul_in_the_python_path_is_refused(tmp_path, edf_env):
    with pytest.raises(EnvLayersError, match="NUL byte"):
        prepare(REPO, "oss120b", python="/usr/bin/py\0thon", environ=edf_env)


@pytest.mark.parametrize("model", ["qwen38; touch /tmp/x", "qwen38\ntouch /tmp/x", "$(touch /tmp/x)"])
def test_hostile_target_name_is_refused(edf_env, model):
    with pytest.raises(EnvLayersError) as err:
        prepare(REPO, model, python=sys.executable, environ=edf_env)
    assert "unknown model" in str(err.value) or "not EXPERIMENT:MODEL" in str(err.value)


def test_serve_env_names_the_site_and_still_reads_as_the_job_environment(tmp_path, edf_env):
    from envlayers.rundir import read_serve_env

    job, _, _ = _prepared(tmp_path, "plain", edf_env)
    script = tmp_path / "job.sh"
    script.write_text(job.script)
    env = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": "78", "SLURM_JOB_NODELIST": "n1",
           "SCRATCH": str(tmp_path / "scratch"), "HOME": str(tmp_path)}
    proc = subprocess.run(["bash", str(script)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    run_dir = tmp_path / "scratch/inference-server/78"
    saved = (run_dir / "serve.env").read_text()
    assert saved.startswith("# site: mi300a\nexport VLLM_SERVED_MODEL=")
    assert read_serve_env(run_dir)["GPU_VENDOR"] == "amd"
