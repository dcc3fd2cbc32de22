"""``WAIT=1 VERIFY=1 cluster/serve-only.sbatch`` on the real local Slurm cluster: once the endpoint is live,
the gates of ``env_layers verify JOBID`` run and their verdict is printed under the endpoint block; the exit
status is verify's. The engine is the stand-in (tests/standin), with its switch for wrong answers.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SBATCH = REPO / "cluster" / "serve-only.sbatch"
STANDIN = REPO / "tests" / "standin"
BANNER = "===== endpoint is live ====="

pytestmark = pytest.mark.slurm


def serve(lab, tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, str, dict[str, str]]:
    (tmp_path / "mine.env").write_text("CONTAINER_RUNTIME=none\nSERVER_API_KEY_FILE=\nALLOW_PUBLIC_UNAUTHENTICATED=1\n")  # the lab serves keyless: acknowledged (docs/keys.md)
    full = {**os.environ, **lab.env, "SCRATCH": str(tmp_path / "scratch"), "MODEL": "qwen38",
            "SERVE_ENV_FILE": str(tmp_path / "mine.env"), "SERVE_TIME": "00:10:00", "STANDIN_LOAD_SECONDS": "1",
            "PATH": f"{STANDIN / 'bin'}:{lab.env.get('PATH', os.environ['PATH'])}",
            "PYTHONPATH": os.pathsep.join([str(STANDIN / "pypath"), str(REPO / "src")]), **env}
    for key in ("ENVLAYERS_ROOT", "RUN_ROOT", "ENVLAYERS_RUN_ROOT", "EXPERIMENT", "SERVE_BASE_ENV", "SUBMIT"):
        full.pop(key, None)
    proc = subprocess.run([str(SBATCH)], cwd=tmp_path, env=full, capture_output=True, text=True, timeout=240)
    match = re.search(r"^submitted job (\d+):", proc.stdout, re.M)
    assert match, proc.stdout + proc.stderr
    lab._submitted.append(match.group(1))  # cancelled at teardown if the test fails midway
    return proc, match.group(1), full


def stop(tmp_path: Path, env: dict[str, str], job_id: str) -> None:
    res = subprocess.run([sys.executable, "-m", "envlayers", "stop", job_id, "--json"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("wait", [pytest.param("1", id="wait-and-verify"), pytest.param(None, id="verify-implies-wait")])
def test_verify_runs_once_live_and_prints_the_verdict_under_the_endpoint_block(netns_lab, tmp_path, wait):
    extra = {"WAIT": wait} if wait else {}
    proc, job_id, env = serve(netns_lab, tmp_path, VERIFY="1", **extra)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    block_at, verify_at = out.index(BANNER), out.index(f"verify job {job_id}: model name hpcagent-bench-vllm (qwen38")
    assert block_at < verify_at
    assert "base URL: http://n1:8000/v1\n" in out[block_at:verify_at]
    for check in ("tools", "reasoning", "accuracy", "metrics"):
        assert re.search(rf"^PASS  {check} ", out[verify_at:], re.M), out
    assert out.rstrip().splitlines()[-1] == "verdict: passed (4 passed, 0 failed, 0 skipped)"
    stop(tmp_path, env, job_id)


def test_a_failed_gate_is_the_exit_status_and_the_endpoint_stays_up(netns_lab, tmp_path):
    proc, job_id, env = serve(netns_lab, tmp_path, WAIT="1", VERIFY="1", STANDIN_WRONG_ANSWERS="1")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = proc.stdout
    assert out.index(BANNER) < out.index("FAIL  accuracy   0/12 correct")
    assert out.rstrip().splitlines()[-1].startswith("verdict: FAILED (")
    assert netns_lab.job_info(job_id)["JobState"] == "RUNNING"  # verify judges, it does not stop the endpoint
    stop(tmp_path, env, job_id)


def test_without_verify_the_wait_path_is_unchanged(netns_lab, tmp_path):
    proc, job_id, env = serve(netns_lab, tmp_path, WAIT="1", VERIFY="0")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert BANNER in proc.stdout and "verify job" not in proc.stdout and "verdict:" not in proc.stdout
    stop(tmp_path, env, job_id)
