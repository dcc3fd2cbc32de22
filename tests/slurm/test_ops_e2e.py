"""wait / status / logs / stop on real jobs: the serve-only launcher on the local Slurm lab, with the
stand-in engine on PATH (tests/standin), driven through the real CLI as an operator would."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from labtools import processes_mentioning

from labruns import BANNER, REPO, Job, launcher_pid

pytestmark = pytest.mark.slurm


def record_target(job: Job) -> str | None:
    return json.loads((job.run_dir / "launch.json").read_text()).get("target")


def test_wait_shows_phases_in_order_then_status_logs_and_stop(netns_lab, tmp_path):
    job = Job(netns_lab, tmp_path, STANDIN_LOAD_SECONDS="5")
    res = job.cli("wait", job.job_id, "--timeout", "60", "--poll", "0.5", "--progress", "plain")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(BANNER + "\nbase URL: http://n1:8000/v1\n"), res.stdout
    progress = [line.split("] ", 1)[1] for line in res.stderr.splitlines() if line.startswith("[")]
    # every step, in order, none skipped: the launcher's, each phase, then live
    order = ["all 1 ranks started", "phase: loading weights", "phase: weights loaded", "phase: KV cache allocated",
             "phase: capturing graphs", "endpoint live"]  # SGLang may answer before it logs 'fired up' (ready)
    where = [next((i for i, line in enumerate(progress) if word in line), None) for word in order]
    assert None not in where and where == sorted(where), progress
    assert any("RUNNING on n1" in line for line in progress[:where[0] + 1])

    # status: the list and the full record, which asks the endpoint (at its address) whether it answers
    rows = json.loads(job.cli("status", "--all", "--json").stdout)
    mine = next(r for r in rows if r["job_id"] == job.job_id)
    assert mine["state"] == "RUNNING" and mine["url"] == "http://n1:8000/v1" and mine["phase"] == "live"
    assert mine["served_name"] == "hpcagent-bench-vllm" and mine["target"] == record_target(job)
    record = json.loads(job.cli("status", job.job_id, "--json").stdout)
    assert record["phase"]["name"] == "ready" and record["run_dir"] == str(job.run_dir)
    assert [p["answers"] for p in record["probes"]] == [True]
    assert f"http://{netns_lab.nodes['n1']}:8000/v1" == record["probes"][0]["url"]

    # logs: rank 0's server log and the job output
    assert "The server is fired up" in job.cli("logs", job.job_id, "--tail", "50").stdout
    assert BANNER in job.cli("logs", job.job_id, "--rank", "job").stdout

    # stop: Slurm says it ended, the endpoint is silent, nothing of the job is left
    res = job.cli("stop", job.job_id, "--json")
    result = json.loads(res.stdout)
    assert res.returncode == 0 and result["ok"] and result["state_after"] == "CANCELLED", res.stdout
    assert [p["answers"] for p in result["probes"]] == [False]
    deadline = time.monotonic() + 15
    while processes_mentioning(str(job.run_dir)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_mentioning(str(job.run_dir)) == []
    # a second stop is harmless
    again = job.cli("stop", job.job_id)
    assert again.returncode == 0 and "already ended (CANCELLED)" in again.stdout


def test_wait_on_a_rank_that_crashes_exits_nonzero_within_10s_with_the_diagnosis(netns_lab, tmp_path):
    job = Job(netns_lab, tmp_path, STANDIN_LOAD_SECONDS="3", STANDIN_CRASH_AT="kv", STANDIN_EXIT_CODE="3")
    res = job.cli("wait", job.job_id, "--timeout", "60", "--poll", "0.5")
    ended_at = time.time()
    assert res.returncode == 1, res.stderr
    crashed_at = (job.run_dir / "rank-0.exit").stat().st_mtime
    assert ended_at - crashed_at < 10
    err = res.stderr
    assert f"job {job.job_id} ended before its endpoint was live: FAILED" in err
    assert "ENVLAYERS-ERROR: rank 0 on n1 exited with code 3 before the endpoint was live" in err
    assert "rank exits: rank 0 -> 3" in err
    assert "diagnosis [" in err and f"env_layers diagnose {job.job_id}" in err
    data = json.loads(job.cli("wait", job.job_id, "--json").stdout)
    assert data["outcome"] == "ended" and data["state"] == "FAILED"


def test_wait_timeout_leaves_the_job_running_and_stop_ends_it(netns_lab, tmp_path):
    job = Job(netns_lab, tmp_path, STANDIN_HANG_AT="weights")
    res = job.cli("wait", job.job_id, "--timeout", "3", "--poll", "0.5")
    assert res.returncode == 3, res.stderr
    assert f"job {job.job_id} not live after 3s: RUNNING, phase: loading weights" in res.stderr
    status = job.cli("status", job.job_id)
    assert status.returncode == 0 and "not live yet" in status.stdout and "phase:       loading weights" in \
        status.stdout
    follow = subprocess.Popen([sys.executable, "-m", "envlayers", "logs", job.job_id, "--follow"], cwd=job.dir,
                              env=job.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        res = job.cli("stop", job.job_id)
        assert res.returncode == 0, res.stdout + res.stderr
        assert "endpoint: none recorded (the job never went live)" in res.stdout
        out, _ = follow.communicate(timeout=15)  # --follow ends by itself once the job has ended
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.wait(5)
    assert follow.returncode == 0 and "Load weight begin" in out


def test_operator_errors_are_one_line_with_exit_2(netns_lab, tmp_path):
    env = {**os.environ, **netns_lab.env, "PYTHONPATH": str(REPO / "src")}
    for args in (["wait", "99999999"], ["status", "99999999"], ["logs", "99999999"], ["stop", "99999999"]):
        res = subprocess.run([sys.executable, "-m", "envlayers", *args], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=30)
        assert res.returncode == 2, (args, res.stderr)
        assert res.stderr.count("\n") == 1 and "no job 99999999" in res.stderr and "hint:" in res.stderr


def test_replicas_status_probes_every_endpoint_and_stop_silences_them_all(netns_lab, tmp_path):
    job = Job(netns_lab, tmp_path, EXPERIMENT="replicas")
    res = job.cli("wait", job.job_id, "--timeout", "60", "--json", "--progress", "none")
    assert res.returncode == 0, res.stderr
    endpoint = json.loads(res.stdout)["endpoint"]
    assert endpoint["base_urls"] == ["http://n1:8000/v1", "http://n2:8000/v1"]
    record = json.loads(job.cli("status", job.job_id, "--json").stdout)
    assert [(p["url"], p["answers"]) for p in record["probes"]] == [
        (f"http://{netns_lab.nodes['n1']}:8000/v1", True), (f"http://{netns_lab.nodes['n2']}:8000/v1", True)]
    listed = job.cli("status", "--all").stdout
    assert "http://n1:8000/v1 http://n2:8000/v1" in listed  # every replica's URL, as a loop takes them
    assert record["urls"] == endpoint["base_urls"] and record["phase"]["name"] in ("graph-capture", "ready")
    res = job.cli("stop", job.job_id, "--json")
    result = json.loads(res.stdout)
    assert res.returncode == 0 and result["ok"], res.stdout
    assert [p["answers"] for p in result["probes"]] == [False, False]
    deadline = time.monotonic() + 15
    while processes_mentioning(str(job.run_dir)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_mentioning(str(job.run_dir)) == []


def test_a_killed_launcher_is_reported_by_wait_and_status(netns_lab, tmp_path):
    job = Job(netns_lab, tmp_path, STANDIN_HANG_AT="weights")
    deadline = time.monotonic() + 60
    pid = None
    while time.monotonic() < deadline:
        started = all((job.run_dir / name).is_file() for name in ("launch.json", "server-0.log"))
        pid = launcher_pid(job.run_dir) if started else None  # the rank is up and loading: a launcher at work
        if pid is not None:
            break
        time.sleep(0.2)
    assert pid is not None, f"no launcher process for {job.run_dir}"
    os.kill(pid, signal.SIGKILL)  # only this one process: Slurm ends the job and its ranks
    res = job.cli("wait", job.job_id, "--timeout", "60", "--poll", "0.5")
    assert res.returncode == 1, res.stderr
    assert "the launcher died without reporting (killed?); Slurm reports " in res.stderr
    status = job.cli("status", job.job_id, "--no-probe")
    line = next(ln for ln in status.stdout.splitlines() if ln.startswith("  launcher:"))
    record = json.loads(job.cli("status", job.job_id, "--json", "--no-probe").stdout)
    end = record["launcher_end"]
    assert end["launcher"] == "died" and end["slurm_state"] in ("FAILED", "CANCELLED", "COMPLETED"), end
    assert line == (f"  launcher:    the launcher died without reporting (killed?); Slurm reports {end['slurm_state']} "
                    f"exit {end['slurm_exit']}")
    assert not (job.run_dir / "launch-end.json").exists()
    deadline = time.monotonic() + 30
    while processes_mentioning(str(job.run_dir)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_mentioning(str(job.run_dir)) == []
