"""``env_layers batch JOBID`` on the real local Slurm cluster with the stand-in engine: the batch goes on
through a replica SIGKILLed mid-way and through its job handing over to a successor, and every custom_id
of the input is answered exactly once (the real vLLM behind the router: tests/slurm/test_router_real_e2e.py)."""

from __future__ import annotations

import json
import os
import re
import signal

import pytest
from labruns import BANNER, KEYLESS, Run, engine_pid, finish, start_batch, wait_answered

pytestmark = pytest.mark.slurm


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
