"""``env_layers batch JOBID`` on the real local Slurm cluster with the stand-in engine: the batch goes on
through a replica SIGKILLed mid-way and through its job handing over to a successor, and every custom_id
of the input is answered exactly once (the real vLLM behind the router: tests/slurm/test_router_real_e2e.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_endure_e2e import engine_pid
from test_serve_e2e import BANNER, KEYLESS, Run

pytestmark = pytest.mark.slurm
REPO = Path(__file__).resolve().parents[2]


def write_input(path: Path, n: int) -> Path:
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions",
                                "body": {"messages": [{"role": "user", "content": f"q{i}"}], "max_tokens": 4}}) + "\n")
    return path


def start_batch(run: Run, n: int, *args: str) -> tuple[subprocess.Popen, Path]:
    out = run.dir / "answers.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "envlayers", "batch", run.job_id,
                             str(write_input(run.dir / "in.jsonl", n)), "-o", str(out), "--json", *args],
                            cwd=run.dir, env=dict(run.env, PYTHONPATH=str(REPO / "src")), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    return proc, out


def answered(out: Path) -> int:
    return len(out.read_text().splitlines()) if out.exists() else 0


def wait_answered(proc: subprocess.Popen, out: Path, n: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while answered(out) < n:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{answered(out)} answers after {timeout_s}s"
        time.sleep(0.2)


def finish(proc: subprocess.Popen, out: Path, n: int, timeout_s: float = 600, echo: bool = True) -> dict:
    """The batch's end: exit 0, every custom_id answered once (with ``echo``, by an answer that quotes its own
    prompt, as the stand-in's do: no answer went to another line)."""
    stdout, stderr = proc.communicate(timeout=timeout_s)
    assert proc.returncode == 0, stdout + stderr
    ids = [json.loads(line)["custom_id"] for line in out.read_text().splitlines()]
    assert sorted(ids) == sorted(f"q{i}" for i in range(n)) and len(ids) == n  # every one, once
    for line in out.read_text().splitlines():
        record = json.loads(line)
        assert record["response"]["status_code"] == 200
        assert not echo or f"You said: {record['custom_id']}\"" in json.dumps(record["response"]), record
    summary = json.loads(stdout)
    assert (summary["answered"], summary["failed"]) == (n, 0), summary
    assert summary["gpus"] and summary["gpu_hours"] > 0, summary  # from the job's accounting record
    return summary


def test_a_batch_goes_on_through_a_replica_killed_mid_way(netns_lab, tmp_path):
    run = Run(netns_lab, tmp_path, EXPERIMENT="replicas", layer=KEYLESS + "INFERENCE_NODES=3\n",
              SERVE_TIME="00:10:00", STANDIN_REQUEST_S="0.2")
    run.submit()
    run.wait_for("^" + re.escape(BANNER), timeout_s=90)
    n = 150
    proc, out = start_batch(run, n, "--concurrency", "6")
    try:
        wait_answered(proc, out, 30, timeout_s=120)
        os.kill(engine_pid(run, "n3"), signal.SIGKILL)
        summary = finish(proc, out, n)
    finally:
        if proc.poll() is None:
            proc.kill()
    addresses = [netns_lab.nodes[x] for x in ("n1", "n2", "n3")]
    assert all(any(a in u for u in summary["endpoints"]) for a in addresses), summary["endpoints"]
    assert "ENVLAYERS-ERROR: replica rank 2 on n3 exited with code 137" in run.out.read_text()
    print(f"\nBATCH-REPLICA-KILL: {summary['answered']} answered, retries {summary['retries_by_kind']}")
    netns_lab.cancel(run.job_id)


def test_a_batch_follows_its_job_to_the_successor(netns_lab, tmp_path):
    # a 4 min limit: the successor starts 1 min after the first job started, then the first drains 5 s and ends
    run = Run(netns_lab, tmp_path, layer=KEYLESS + "SUCCESSORS=1\nSUCCESSOR_DRAIN_S=5\n", SERVE_TIME="00:04:00",
              STANDIN_REQUEST_S="0.5")
    first = run.submit()
    run.wait_for("^" + re.escape(BANNER), timeout_s=60)
    n = 500  # at 2 in flight and 0.5 s each: about 125 s, past the handover
    proc, out = start_batch(run, n, "--concurrency", "2")
    try:
        summary = finish(proc, out, n, timeout_s=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    chain = json.loads((run.run_dir / "chain.json").read_text())
    successor = chain.get("successor")
    assert successor, chain
    netns_lab._submitted.append(successor)
    text = run.out.read_text()
    assert f"ENVLAYERS-STAGE: handed over to successor job {successor}; ending job {first}" in text, text[-2000:]
    assert len(summary["endpoints"]) == 2, summary  # the first job's, then the successor's
    print(f"\nBATCH-HANDOVER: {n} answered across jobs {first} -> {successor}, retries {summary['retries_by_kind']}")
    netns_lab.cancel(successor)
