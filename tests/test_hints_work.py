"""Every hint the login node prints works as printed: each test takes a refusal or warning, does what its
hint says (runs the command it names, or puts the key it names where it says) and checks that the line is
gone and the job carries the fix. Hints that need a registry or a cluster (apptainer pull, registry.sbatch)
are left out; their commands are checked for their words in tests/test_runtime_render.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from envlayers.jobscript import prepare

REPO = Path(__file__).resolve().parents[1]
PY = "/usr/bin/python3"


def _environ(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"HOME": str(tmp_path), "PWD": str(tmp_path), "PATH": os.environ["PATH"], "CHECK_WEIGHTS": "0",
            "EDF_PATH": str(tmp_path / "edf"), "SCRATCH": str(tmp_path / "s"), **extra}


def _job(tmp_path, layer: str, model: str = "qwen38", **extra):
    mine = tmp_path / "mine.env"
    mine.write_text(layer)
    return prepare(REPO, model, env_file=mine, python=PY, environ=_environ(tmp_path, **extra))


def test_run_env_layers_install_edfs_as_printed(tmp_path):
    (hint,) = [b for b in _job(tmp_path, "").blockers if "is not installed" in b]
    command = re.search(r"run `([^`]+)`", hint).group(1)
    assert command == "env_layers install-edfs"
    done = subprocess.run([sys.executable, "-m", "envlayers", *command.split()[1:]], cwd=tmp_path, timeout=120,
                          env={**_environ(tmp_path), "ENVLAYERS_ROOT": str(REPO), "PYTHONPATH": str(REPO / "src")},
                          capture_output=True, text=True)
    assert done.returncode in (0, 1), done.stderr  # 1: images are missing, which the next line names
    assert not [b for b in _job(tmp_path, "").blockers if "is not installed" in b]


def test_a_shell_key_put_in_serve_env_file_as_the_warning_says_reaches_the_job(tmp_path):
    (warning,) = [w for w in _job(tmp_path, "", IDLE_STOP_AFTER_S="1800").warnings if "submitting shell" in w]
    assert "put IDLE_STOP_AFTER_S=<value> in a SERVE_ENV_FILE layer" in warning
    job = _job(tmp_path, "IDLE_STOP_AFTER_S=1800\n", IDLE_STOP_AFTER_S="1800")
    assert not [w for w in job.warnings if "submitting shell" in w]
    assert "export IDLE_STOP_AFTER_S='1800'\n" in job.script


def test_the_did_you_mean_key_takes_effect(tmp_path):
    (warning,) = [w for w in _job(tmp_path, "TENSOR_PARALEL_SIZE=2\n").warnings if "did you mean" in w]
    key = re.search(r"did you mean (\w+)\?", warning).group(1)
    job = _job(tmp_path, f"{key}=2\n")
    assert not [w for w in job.warnings if "did you mean" in w] and job.plan.tp == 2


def test_set_the_role_the_engine_refusal_names(tmp_path):
    (refusal,) = [b for b in _job(tmp_path, "INFERENCE_ENGINE=vllm\n").blockers if "CONTAINER_ROLE=" in b]
    fix = re.search(r"set (CONTAINER_ROLE=\S+) with it", refusal).group(1)
    job = _job(tmp_path, f"INFERENCE_ENGINE=vllm\n{fix}\nTOOL_CALL_PARSER=hermes\nREASONING_PARSER=qwen3\n")
    assert not [b for b in job.blockers if "CONTAINER_ROLE=" in b or "refuses" in b], job.blockers


def test_set_server_host_instead_of_the_extra_flag(tmp_path):
    (refusal,) = [b for b in _job(tmp_path, "SERVER_EXTRA_ARGS='--host 127.0.0.1'\n").blockers if "--host" in b]
    assert "set SERVER_HOST instead and take the flag out" in refusal
    job = _job(tmp_path, "SERVER_HOST=127.0.0.1\n")
    assert not [b for b in job.blockers if "--host" in b] and "--host 127.0.0.1" in job.rank_lines[0]


def test_set_the_partition_the_sbatch_warning_names(tmp_path):
    (warning,) = [w for w in _job(tmp_path, "", SBATCH_PARTITION="debug").warnings if "SBATCH_PARTITION" in w]
    assert "set SLURM_PARTITION in a SERVE_ENV_FILE layer instead" in warning
    job = _job(tmp_path, "SLURM_PARTITION=debug\n", SBATCH_PARTITION="debug")
    assert not [w for w in job.warnings if "SBATCH_PARTITION" in w] and "--partition=debug" in job.sbatch_args


def test_the_serve_time_the_short_limit_warning_spells_out(tmp_path):
    mine = tmp_path / "mine.env"
    mine.write_text("")
    job = prepare(REPO, "qwen38", env_file=mine, python=PY, environ=_environ(tmp_path), time="4:00")
    (warning,) = [w for w in job.warnings if "SERVE_TIME=4:00" in w]
    spelled = re.search(r"4 h is (\S+?)\)", warning).group(1)
    job = prepare(REPO, "qwen38", env_file=mine, python=PY, environ=_environ(tmp_path), time=spelled)
    assert not [w for w in job.warnings if "SERVE_TIME" in w] and "--time=04:00:00" in job.sbatch_args
