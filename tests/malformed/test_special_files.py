"""Special files given as a layer: a FIFO, /dev/zero, /dev/urandom as SERVE_ENV_FILE, SERVE_BASE_ENV, `render
--layer` or `explain --env-file` end at once in one line naming the file (exit 2): a layer is a regular file of
at most the 4 MiB setups.yaml may have. Each run is bounded in memory, so a reader that grew on /dev/zero
fails with an error instead of eating the machine; a FIFO has no writer, so a reader that waited for one
would be ended by the subprocess timeout."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from malformed_tools import REPO, assert_clean_error

MEMORY_BOUND = 1 << 30  # far more than a render needs, far less than reading /dev/zero for a few seconds


def _bounded():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BOUND, MEMORY_BOUND))


def _special(tmp_path: Path, kind: str) -> str:
    if kind == "fifo":
        fifo = tmp_path / "layer.env"
        os.mkfifo(fifo)
        return str(fifo)
    return kind


def _run(args: list[str], tmp_path: Path, env: dict[str, str], bash: bool = False) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("ENVLAYERS_DEBUG", "SERVE_ENV_FILE", "SERVE_BASE_ENV")}
    full.update(HOME=str(tmp_path), EDF_PATH=str(tmp_path), **env)
    argv = ["bash", *args] if bash else [sys.executable, "-m", "envlayers", *args]
    return subprocess.run(argv, cwd=tmp_path, env=full, capture_output=True, text=True, timeout=120,
                          preexec_fn=_bounded)


KINDS = [pytest.param("fifo", id="fifo"), pytest.param("/dev/zero", id="dev-zero"),
         pytest.param("/dev/urandom", id="dev-urandom")]


def _needle(kind: str, shown: str) -> str:
    return f"{shown}: is {'a FIFO' if kind == 'fifo' else 'a character device'}, not a regular file; hint: "


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("variable", ["SERVE_ENV_FILE", "SERVE_BASE_ENV"])
def test_the_wrapper_refuses_a_special_file_as_a_layer(tmp_path, kind, variable):
    path = _special(tmp_path, kind)
    proc = _run([str(REPO / "cluster" / "serve-only.sbatch")], tmp_path, {"SUBMIT": "0", variable: path}, bash=True)
    assert_clean_error(proc, _needle(kind, path))
    assert proc.stdout == ""


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("args", [
    pytest.param(["render", "experiment:qwen38", "--layer", "{path}"], id="render-layer"),
    pytest.param(["explain", "experiment:qwen38", "SERVER_PORT", "--layer", "{path}"], id="explain-layer"),
    pytest.param(["explain", "experiment:qwen38", "SERVER_PORT", "--env-file", "{path}"], id="explain-env-file"),
    pytest.param(["explain", "experiment:qwen38", "SERVER_PORT", "--base-env", "{path}"], id="explain-base-env"),
    pytest.param(["serve", "--model", "qwen38", "--dry-run", "--env-file", "{path}"], id="serve-env-file"),
])
def test_every_command_refuses_a_special_file_as_a_layer(tmp_path, kind, args):
    path = _special(tmp_path, kind)
    proc = _run(["--root", str(REPO), *[a.format(path=path) for a in args]], tmp_path, {})
    assert_clean_error(proc, _needle(kind, path))


def test_a_layer_file_over_the_limit_is_refused(tmp_path):
    from envlayers.yamlpos import MAX_BYTES

    big = tmp_path / "big.env"
    with open(big, "w") as fh:
        fh.write("# " + "x" * MAX_BYTES + "\n")
    proc = _run(["--root", str(REPO), "render", "experiment:qwen38", "--layer", str(big)], tmp_path, {})
    assert_clean_error(proc, f"{big}: is {MAX_BYTES + 3} bytes, more than the {MAX_BYTES} this reader takes")
