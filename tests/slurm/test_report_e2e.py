"""Idle release and the GPU-hour report on the local Slurm lab, with the stand-in engine's real request
counters: an idle endpoint ends on time with exit 0, a busy one does not, `status` shows it as its own
state with its GPU-hours, and `report` sums the run directories (this lab has no Slurm accounting: the
report says so)."""

from __future__ import annotations

import json
import os
import re
import time

import pytest
from labruns import BANNER, Job

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
    env_file.write_text("CONTAINER_RUNTIME=none\nSERVER_API_KEY_FILE=\nALLOW_PUBLIC_UNAUTHENTICATED=1\n" + keys)  # the lab serves keyless
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
    assert re.search(r"ENVLAYERS-WARN: no request served for [67]s \(IDLE_WARN_AFTER_S=6\); the job ends in [56]s",
                     out), out
    assert re.search(r"ENVLAYERS-STAGE: idle stop: no request served for 1[23]s \(IDLE_STOP_AFTER_S=12\)", out), out
    assert 11 <= ended - live_at <= 12 + 8, ended - live_at  # sampled every second, polled every 0.25s
    acct = json.loads((job.run_dir / "accounting.json").read_text())
    sp = acct["split"]
    assert acct["final"] and acct["gpus"] == 4 and acct["live"]["counters_readable"] is True
    assert 11 <= sp["seconds"]["idle_after_last_request"] <= 15 and sp["seconds"]["serving"] == 0
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


@pytest.fixture(scope="module")
def accounting_lab():
    """A second lab, with slurmdbd and MariaDB (`cluster/slurm-lab --accounting`), in its own lab dir;
    brought down after the module."""
    import shutil
    import tempfile
    from pathlib import Path

    import labtools

    if os.geteuid() != 0:
        labtools.unavailable("the accounting lab needs root")
    lab_dir = Path(tempfile.mkdtemp(prefix="elab-acct-"))  # short: the munge socket path must fit 108 bytes
    env = {"ENVLAYERS_LAB_DIR": str(lab_dir)}
    for _ in range(3):  # another lab may take the free bridge name between the check and the creation
        proc = labtools.lab_command("--accounting", "up", "1", env=env)
        if proc.returncode == 0 or "RTNETLINK answers: File exists" not in proc.stdout:
            break
    if proc.returncode != 0:
        labtools.lab_command("down", env=env)
        shutil.rmtree(lab_dir, ignore_errors=True)
        labtools.unavailable(f"cluster/slurm-lab --accounting up 1 failed:\n{proc.stdout[-2000:]}")
    try:
        lab = labtools.lab_from_status(lab_dir, started_here=True)
        if lab.mode != "netns":
            labtools.unavailable("the accounting lab came up without network namespaces")
        yield lab
    finally:
        labtools.lab_command("down", env=env)
        shutil.rmtree(lab_dir, ignore_errors=True)


def test_report_counts_what_slurm_accounting_knows_and_the_run_dirs_explain(accounting_lab, tmp_path):
    lab = accounting_lab
    job = submit(lab, tmp_path, "IDLE_STOP_AFTER_S=5\n")
    live(job)
    assert wait_ended(lab, job.job_id, 60)[0] == "COMPLETED"
    # an endpoint job that left no run directory (its launcher never ran): Slurm still billed it
    lost = lab.submit("#!/bin/bash\nsleep 3\n", "--job-name=serve-only", "--nodes=1", "--gpus-per-node=4")
    assert wait_ended(lab, lost, 30)[0] == "COMPLETED"
    root = str(tmp_path / "scratch" / "inference-server")
    for _ in range(40):  # slurmctld hands job ends to slurmdbd asynchronously
        data = json.loads(job.cli("report", "--run-root", root, "--json").stdout)
        if data["missing"] and data["jobs"] and data["jobs"][0]["slurm_state"]:
            break
        time.sleep(0.5)
    assert data["slurm_accounting"] == "sacct", data["slurm_accounting"]
    assert [(j["job_id"], j["slurm_state"]) for j in data["jobs"]] == [(job.job_id, "COMPLETED")]
    missing = {m["job_id"]: m for m in data["missing"]}
    assert list(missing) == [lost], missing
    assert missing[lost]["gpus"] == 4 and missing[lost]["elapsed_s"] >= 3
    assert missing[lost]["gpu_hours"] == pytest.approx(4 * missing[lost]["elapsed_s"] / 3600, abs=1e-4)
    text = job.cli("report", "--run-root", root).stdout
    assert "Slurm accounting: 1 more job(s) ran" in text and f"{lost} (COMPLETED" in text, text
