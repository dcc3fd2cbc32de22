"""The layers' and the job script's bad inputs, through the real command line: each a clear one-line error.

Unreadable layer files, bad `render -o` targets, refused keys, control characters in a partition or a
file name, SERVER_API_KEY in a layer on every path that writes a render, and unusable key files.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from malformed_tools import assert_clean_error, run_cli

LAYER = "experiments/layers/model-qwen38.env"


def _append(root: Path, text: str) -> int:
    """Append ``text`` to the qwen38 model layer; the line number it starts on."""
    layer = root / LAYER
    old = layer.read_text()
    layer.write_text(old + text)
    return old.count("\n") + 1


@pytest.fixture
def edf_env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "edf").mkdir(exist_ok=True)
    return {"EDF_PATH": str(tmp_path / "edf"), "SERVE_ENV_FILE": "", "SERVE_BASE_ENV": ""}


@pytest.mark.parametrize("key", ["BASH_ENV", "ENV", "PS4", "PROMPT_COMMAND", "SHELLOPTS", "BASHOPTS",
                                 "LD_PRELOAD", "LD_AUDIT", "GCONV_PATH", "PYTHONSTARTUP"])
def test_refused_key_in_a_layer(repo_copy, key):
    line = _append(repo_copy, f"{key}=/tmp/evil\n")
    proc = run_cli("--root", str(repo_copy), "render", "experiment:qwen38")
    assert_clean_error(proc, f"{LAYER}:{line}: '{key}' is refused in a layer", "hint:")


def test_unreadable_layer_file_is_exit_2_with_its_path(repo_copy):
    layer = repo_copy / LAYER
    layer.unlink()
    layer.mkdir()  # unreadable as a file even for root
    proc = run_cli("--root", str(repo_copy), "render", "experiment:qwen38")
    assert_clean_error(proc, LAYER)


def test_unreadable_extra_layer_is_exit_2_with_its_path(tmp_path, repo_copy):
    if os.geteuid() == 0:
        pytest.skip("root reads a mode-000 file")
    extra = tmp_path / "locked.env"
    extra.write_text("A=1\n")
    extra.chmod(0)
    proc = run_cli("--root", str(repo_copy), "render", "experiment:qwen38", "--layer", str(extra))
    assert_clean_error(proc, str(extra), "cannot read the layer file")


@pytest.mark.parametrize("target, needle", [
    pytest.param("/proc/envlayers-x.env", "cannot write /proc/envlayers-x.env", id="proc-file-system"),
    pytest.param("/sys/kernel/envlayers-x.env", "cannot write /sys/kernel/envlayers-x.env", id="sysfs"),
    pytest.param("{tmp}/no/such/dir/x.env", "does not exist", id="missing-folder"),
    pytest.param("{tmp}", "is a directory", id="a-folder"),
])
def test_bad_render_output_target(tmp_path, target, needle):
    path = target.format(tmp=tmp_path)
    proc = run_cli("render", "experiment:qwen38", "-o", path)
    assert_clean_error(proc, needle)


@pytest.mark.parametrize("args", [("render", "experiment:qwen38"), ("render", "experiment:qwen38", "-o", "x.env"),
                                  ("check", "--update")], ids=["render", "render-o", "check-update"])
def test_api_key_in_a_layer_on_every_render_path(repo_copy, args):
    line = _append(repo_copy, "SERVER_API_KEY=hunter22-s3cret\n")
    proc = run_cli("--root", str(repo_copy), *args, cwd=repo_copy)
    assert_clean_error(proc, f"{LAYER}:{line}: SERVER_API_KEY in a layer")
    assert "hunter22" not in proc.stderr + proc.stdout and not (repo_copy / "x.env").exists()


def test_partition_with_a_newline(repo_copy, edf_env):
    line = _append(repo_copy, "SLURM_PARTITION='mi300\ntouch /tmp/envlayers-pwned'\n")
    proc = run_cli("--root", str(repo_copy), "serve", "--dry-run", env=edf_env)
    assert_clean_error(proc, f"{LAYER}:{line}: SLURM_PARTITION", "is not a partition name")


def test_env_file_path_with_a_newline(tmp_path, edf_env):
    bad = tmp_path / "mine\ntouch pwned\n.env"
    bad.write_text("SERVER_PORT=9000\n")
    proc = run_cli("serve", "--dry-run", "--env-file", str(bad), env=edf_env)
    assert_clean_error(proc, "SERVE_ENV_FILE: the file name", "control character")


@pytest.mark.parametrize("content, needle", [
    pytest.param(None, "the key file does not exist", id="missing"),
    pytest.param("", "the key file is empty", id="empty"),
    pytest.param("key with spaces\n", "the key holds characters outside the safe set", id="unsafe-characters"),
])
def test_unusable_key_file_blocks_the_dry_run(tmp_path, edf_env, content, needle):
    key = tmp_path / "key"
    if content is not None:
        key.write_text(content)
        key.chmod(0o600)
    mine = tmp_path / "mine.env"
    mine.write_text(f"SERVER_API_KEY_FILE={key}\n")
    proc = run_cli("serve", "--dry-run", "--env-file", str(mine), env=edf_env)
    assert_clean_error(proc, f"{mine}:1: SERVER_API_KEY_FILE {key}: {needle}")


def test_readiness_budget_of_zero(tmp_path, edf_env):
    mine = tmp_path / "mine.env"
    mine.write_text("AGENT_READY_TIMEOUT_SECONDS=0\n")
    proc = run_cli("serve", "--dry-run", "--env-file", str(mine), env=edf_env)
    assert_clean_error(proc, "AGENT_READY_TIMEOUT_SECONDS: must be a positive number of seconds")
