"""SERVER_HOST through the operator's own entry (cluster/serve-only.sbatch, in real bash): every spelling of
the unspecified address and every routable address or host name counts as reachable by other nodes, so a
keyless server on one is refused before sbatch runs; only loopback passes without a key; a value that is no
address and no host name is one line naming the key (exit 2)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from malformed_tools import REPO, assert_clean_error


def _wrapper(tmp_path: Path, host: str, submit: str, extra: str = "") -> tuple[subprocess.CompletedProcess, Path]:
    submitted = tmp_path / "submitted"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "sbatch").write_text(f"#!/bin/sh\ntouch {submitted}\necho 4242\n")
    (bin_dir / "sbatch").chmod(0o755)
    env_file = tmp_path / "t.env"
    env_file.write_text(f"CONTAINER_RUNTIME=none\nSERVER_HOST='{host}'\n{extra}")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_"))}
    env.pop("ENVLAYERS_DEBUG", None)
    env.update(SUBMIT=submit, SERVE_ENV_FILE=str(env_file), HOME=str(tmp_path), MODEL="qwen38",
               PATH=f"{bin_dir}:{os.environ['PATH']}", EDF_PATH=str(tmp_path))
    proc = subprocess.run(["bash", str(REPO / "cluster" / "serve-only.sbatch")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    return proc, submitted


REACHABLE = ["0", "0.0", "::0", "0:0:0:0:0:0:0:0", "0x0", "000.000.000.000", "::ffff:0.0.0.0", "10.20.30.40",
             "nid001234"]


@pytest.mark.parametrize("host", REACHABLE)
def test_a_keyless_server_others_can_reach_is_refused_by_the_dry_run_and_the_submission(tmp_path, host):
    keyless = "SERVER_API_KEY_FILE=\n"  # empties the per-job key the serve-only experiment sets
    dry, submitted = _wrapper(tmp_path, host, "0", keyless)
    assert dry.returncode == 0, dry.stderr[-2000:]
    shown = [ln for ln in dry.stdout.splitlines() if ln.startswith("# would refuse to submit: the server binds")]
    assert len(shown) == 1 and f"(SERVER_HOST={host}" in shown[0] and "SERVER_API_KEY_FILE=generate" in shown[0]
    real, submitted = _wrapper(tmp_path, host, "1", keyless)
    assert_clean_error(real, "the server binds", f"SERVER_HOST={host}")
    assert not submitted.exists(), "sbatch ran for a keyless server others can reach"


@pytest.mark.parametrize("host, extra", [
    pytest.param("127.0.0.1", "SERVER_API_KEY_FILE=\n", id="loopback"),
    pytest.param("localhost", "SERVER_API_KEY_FILE=\n", id="localhost"),
    pytest.param("0x0", "", id="every-interface-with-the-default-key"),
    pytest.param("0", "SERVER_API_KEY_FILE=\nALLOW_PUBLIC_UNAUTHENTICATED=1\n", id="acknowledged"),
])
def test_loopback_a_key_or_an_acknowledgement_clears_it(tmp_path, host, extra):
    dry, _ = _wrapper(tmp_path, host, "0", extra)
    assert dry.returncode == 0, dry.stderr[-2000:]
    assert "# would refuse to submit: the server binds" not in dry.stdout
    real, submitted = _wrapper(tmp_path, host, "1", extra)
    assert real.returncode == 0, real.stderr[-2000:]
    assert submitted.exists() and real.stdout.startswith("submitted job 4242: experiment:qwen38, 1 node(s), single\n")


@pytest.mark.parametrize("host, needle", [
    pytest.param("[::]", "an address is written without brackets", id="brackets"),
    pytest.param("08", "is not an IPv4 address", id="bad-octal"),
    pytest.param("$(id)", "is not an IP address or a host name", id="command-text"),
    pytest.param("no such host", "holds a blank", id="blanks"),
])
def test_a_server_host_that_is_no_address_is_one_line(tmp_path, host, needle):
    for submit in ("0", "1"):
        proc, submitted = _wrapper(tmp_path, host, submit, "SERVER_API_KEY_FILE=generate\n")
        assert_clean_error(proc, "SERVER_HOST: ", needle, "; hint: ")
        assert len(proc.stderr.strip().splitlines()) == 1 and not submitted.exists()
