"""Every hint the login node prints works as printed: each test takes a refusal or warning, does what its
hint says (runs the command it names, or puts the key it names where it says) and checks that the line is
gone and the job carries the fix. Hints that need a registry or a cluster (apptainer pull, registry.sbatch)
are left out; their commands are checked for their words in tests/test_runtime_render.py."""

from __future__ import annotations

import os
import re
import shutil
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


def _run_printed(command: str, tmp_path: Path, **extra: str) -> subprocess.CompletedProcess:
    """Run ``command`` as a user would paste it: env_layers through this checkout's package, the rest as is."""
    argv = command.split()
    if argv[0] == "env_layers":
        argv = [sys.executable, "-m", "envlayers", *argv[1:]]
    return subprocess.run(argv, cwd=tmp_path, timeout=120, capture_output=True, text=True,
                          env={**_environ(tmp_path, **extra), "ENVLAYERS_ROOT": str(REPO),
                               "PYTHONPATH": str(REPO / "src")})


def test_the_key_command_the_length_refusal_prints_makes_a_key_the_job_takes(tmp_path):
    from envlayers.errors import EnvLayersError
    key = tmp_path / "key"
    key.write_text("short\n")
    key.chmod(0o600)
    layer = f"SERVER_API_KEY_FILE={key}\n"
    try:
        _job(tmp_path, layer)
        raise AssertionError("a 5-character key was taken")
    except EnvLayersError as e:
        command = re.search(r"e\.g\. `([^`]+)`", str(e)).group(1)
    assert subprocess.run(["bash", "-c", command.replace("FILE", str(key))], timeout=60).returncode == 0
    job = _job(tmp_path, layer)
    assert f"SERVER_API_KEY_FILE='{key}'" in job.script or str(key) in job.script


def test_chmod_600_as_the_key_warning_prints_silences_it(tmp_path):
    key = tmp_path / "key"
    key.write_text("k" * 32 + "\n")
    key.chmod(0o644)
    layer = f"SERVER_API_KEY_FILE={key}\n"
    (warning,) = [w for w in _job(tmp_path, layer).warnings if "readable or writable by others" in w]
    command = re.search(r"run `([^`]+)`", warning).group(1)
    assert _run_printed(command, tmp_path).returncode == 0
    assert not [w for w in _job(tmp_path, layer).warnings if "readable or writable by others" in w]


def test_chmod_go_w_as_the_trust_refusal_prints_lets_the_layer_in(tmp_path):
    from envlayers.errors import EnvLayersError
    mine = tmp_path / "mine.env"
    mine.write_text("MAX_MODEL_LEN=4096\n")
    mine.chmod(0o664)
    try:
        prepare(REPO, "qwen38", env_file=mine, python=PY, environ=_environ(tmp_path))
        raise AssertionError("a layer others can write was read")
    except EnvLayersError as e:
        command = re.search(r"hint: (chmod go-w \S+)", str(e)).group(1)
    assert _run_printed(command, tmp_path).returncode == 0
    job = prepare(REPO, "qwen38", env_file=mine, python=PY, environ=_environ(tmp_path))
    assert "--context-length 4096" in job.rank_lines[0]


def test_install_edfs_force_as_the_edited_edf_refusal_prints_puts_the_render_back(tmp_path):
    assert _run_printed("env_layers install-edfs", tmp_path).returncode in (0, 1)
    installed = tmp_path / "edf" / "hpcagent-bench-sglang-mi300-latest-intranode.toml"
    text = installed.read_text()
    image = re.search(r'^image = "([^"]+)"', text, re.M).group(1)
    installed.write_text(text.replace(image, image + ".edited"))  # another image, by hand
    (refusal,) = [b for b in _job(tmp_path, "").blockers if "is not what the catalog renders" in b]
    assert "run `env_layers install-edfs`" in refusal and "--force replaces a file env_layers did not write" in refusal
    kept = _run_printed("env_layers install-edfs", tmp_path)
    assert kept.returncode == 1 and ".edited" in installed.read_text()  # kept, with the diff
    assert _run_printed("env_layers install-edfs --force", tmp_path).returncode in (0, 1)
    assert not [b for b in _job(tmp_path, "").blockers if "is not what the catalog renders" in b]


def test_mkdir_as_the_missing_bind_refusal_prints_makes_the_source(tmp_path):
    assert _run_printed("env_layers install-edfs", tmp_path).returncode in (0, 1)
    scratch = tmp_path / "scratch"
    scratch.symlink_to(tmp_path / "elsewhere" / "scratch")  # moved by a link to a folder nobody made
    refusals = [b for b in _job(tmp_path, "", SCRATCH=str(scratch)).blockers if "which does not exist" in b]
    assert refusals
    for refusal in refusals:
        command = re.search(r"(mkdir -p \S+)$", refusal).group(1)
        assert _run_printed(command, tmp_path).returncode == 0
    assert not [b for b in _job(tmp_path, "", SCRATCH=str(scratch)).blockers if "which does not exist" in b]


def test_the_role_the_did_you_mean_names_is_taken(tmp_path):
    from envlayers.errors import EnvLayersError
    try:
        _job(tmp_path, "CONTAINER_ROLE=sglang-mi30\n")
        raise AssertionError("an unknown role was taken")
    except EnvLayersError as e:
        role = re.search(r"did you mean (\S+)\?", str(e)).group(1)
    job = _job(tmp_path, f"CONTAINER_ROLE={role}\n")
    assert role in job.script


def test_check_update_as_the_stale_line_prints_makes_check_pass(tmp_path):
    root = tmp_path / "catalog"
    shutil.copytree(REPO / "experiments", root / "experiments")
    shutil.copytree(REPO / "containers", root / "containers")
    common = root / "experiments" / "layers" / "common.env"
    common.write_text(common.read_text() + "MAX_MODEL_LEN=4096\n")
    stale = _run_printed(f"env_layers --root {root} check", tmp_path)
    assert stale.returncode == 1
    command = re.search(r"run `([^`]+)`", stale.stdout).group(1)
    assert command == "env_layers check --update"
    assert _run_printed(f"env_layers --root {root} check --update", tmp_path).returncode == 0
    assert _run_printed(f"env_layers --root {root} check", tmp_path).returncode == 0
