"""Idle release and the GPU-hour report on the local Slurm lab, with the stand-in engine's real request
counters: an idle endpoint ends on time with exit 0, a busy one does not, `status` shows it as its own
state with its GPU-hours, and `report` sums the run directories (this lab has no Slurm accounting: the
report says so)."""

from __future__ import annotations

import json
import time

import pytest
from test_ops_e2e import BANNER, Job

pytestmark = pytest.mark.slurm


def wait_ended(lab, job_id: str, timeout_s: float) -> tuple[str, float]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = lab.job_info(job_id).get("JobState", "")
        if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
            return state, time.time()
        time.sleep(0.25)
    raise AssertionError(f"job {job_id} still {state} after {timeout_s}s")


def submit(lab, tmp_path, keys: str) -> Job:
    """A serve-only job whose own env file sets the idle keys (launch keys come from env files only)."""
    env_file = tmp_path / "idle.env"
    env_file.write_text("CONTAINER_RUNTIME=none\n" + keys)
    return Job(lab, tmp_path, SERVE_ENV_FILE=str(env_file))


def live(job: Job) -> float:
    res = job.cli("wait", job.job_id, "--timeout", "90", "--poll", "0.5", "--progress", "none", timeout_s=120)
    assert res.returncode == 0 and res.stdout.startswith(BANNER), res.stdout + res.stderr
    return json.loads((job.run_dir / "endpoint.json").read_text())


def test_an_idle_endpoint_ends_on_time_with_exit_0_and_its_own_state(netns_lab, tmp_path):
    job = submit(netns_lab, tmp_path, "IDLE_STOP_AFTER_S=12\nIDLE_WARN_AFTER_S=6\n")
    live(job)
    live_at = time.time()
    state, ended = wait_ended(netns_lab, job.job_id, 60)
    info = netns_lab.job_info(job.job_id)
    assert (state, info.get("ExitCode")) == ("COMPLETED", "0:0"), info
    end = json.loads((job.run_dir / "launch-end.json").read_text())
    assert end["code"] == 0 and end["reason"].startswith("idle stop: no request for"), end
    out = netns_lab.job_output(job.job_id)
    assert "ENVLAYERS-STAGE: idle release: stop after 12s, warn after 6s without a request" in out
    assert "ENVLAYERS-WARN: no request served for 6s (IDLE_WARN_AFTER_S=6); the job ends in 6s" in out
    assert "ENVLAYERS-STAGE: idle stop: no request served for 12s (IDLE_STOP_AFTER_S=12)" in out
    assert 11 <= ended - live_at <= 12 + 8, ended - live_at  # sampled every second, polled every 0.25s
    acct = json.loads((job.run_dir / "accounting.json").read_text())
    sp = acct["split"]
    assert acct["final"] and acct["gpus"] == 4 and acct["live"]["counters_readable"] is True
    assert 11 <= sp["seconds"]["idle_after_last_request"] <= 14 and sp["seconds"]["serving"] == 0
    assert sum(sp["seconds"].values()) == pytest.approx(sp["allocated_s"], abs=0.01)
    res = job.cli("status", job.job_id, "--no-probe")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(f"job {job.job_id}: IDLE-STOPPED (COMPLETED"), res.stdout
    assert "ended on purpose, not a failure: idle stop" in res.stdout
    assert "GPU-hours:" in res.stdout and "idle after the last request:" in res.stdout
    rep = job.cli("report", "--run-root", str(tmp_path / "scratch" / "inference-server"), "--json")
    assert rep.returncode == 0, rep.stderr
    data = json.loads(rep.stdout)
    assert [j["job_id"] for j in data["jobs"]] == [job.job_id]
    assert data["slurm_accounting"] != "sacct"  # this lab runs without slurmdbd: said, not hidden
    assert data["by_model"][0]["gpu_hours"]["idle_after_last_request"] == pytest.approx(
        sp["gpu_hours"]["idle_after_last_request"], abs=1e-3)
    text = job.cli("report", "--run-root", str(tmp_path / "scratch" / "inference-server"))
    assert "Slurm accounting not available" in text.stdout and "largest waste: " in text.stdout, text.stdout


def test_a_busy_endpoint_keeps_serving_and_its_last_request_resets_the_clock(netns_lab, tmp_path):
    job = submit(netns_lab, tmp_path, "IDLE_STOP_AFTER_S=8\n")
    live(job)
    t0 = time.time()
    last = t0
    while time.time() - t0 < 24:  # three times the idle stop, a request every ~2s
        res = job.cli("ping", job.job_id)
        assert res.returncode == 0, res.stdout + res.stderr
        last = time.time()
        assert netns_lab.job_info(job.job_id).get("JobState") == "RUNNING"
        time.sleep(1.5)
    state, ended = wait_ended(netns_lab, job.job_id, 40)
    assert state == "COMPLETED"
    assert 7 <= ended - last <= 8 + 8, ended - last
    acct = json.loads((job.run_dir / "accounting.json").read_text())
    assert acct["live"]["requests"] >= 8 and acct["split"]["seconds"]["serving"] > 0
