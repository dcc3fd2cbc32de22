"""The elastic pool (MAX_REPLICAS) end to end on the real local Slurm cluster with the real router (smg) and the
stand-in engine: two replicas behind one URL, a load that rises until requests queue, one replica job grown on
the third node and routed to, the load gone, that replica released once idle, the endpoint answering throughout,
the report adding the replica job's GPU-hours to the job's."""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
import uuid

import pytest
from extratools import needs_extra
from labtools import processes_mentioning
from labruns import BANNER, reachable, Run

needs_extra("smg", "router")

pytestmark = pytest.mark.slurm
SERVED = "hpcagent-bench-vllm"


def complete(base: str, key: str, prompt: str, timeout_s: float = 60) -> None:
    req = urllib.request.Request(f"{base}/completions", method="POST",
                                 data=json.dumps({"model": SERVED, "prompt": prompt, "max_tokens": 2}).encode(),
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        assert resp.status == 200


def routed_to(metrics_url: str, worker: str) -> float:
    """Requests the router sent to ``worker`` (its circuit breaker's outcomes)."""
    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    return sum(float(line.rsplit(None, 1)[1]) for line in text.splitlines()
               if line.startswith(f'smg_worker_cb_outcomes_total{{worker="{worker}"'))


def test_the_pool_grows_under_a_rising_load_and_releases_the_added_replica_once_idle(netns_lab, tmp_path):
    # each completion holds its engine 1.5 s, one at a time: seven clients on two replicas queue
    run = Run(netns_lab, tmp_path, EXPERIMENT="replicas",
              layer="ROUTER=smg\nMAX_REPLICAS=3\nSCALE_UP_WAIT_S=1\nSCALE_UP_WINDOW_S=4\nIDLE_STOP_AFTER_S=20\n"
                    "HEALTH_FAIL_AFTER_S=0\n",
              SERVE_TIME="00:10:00", STANDIN_MAX_RUNNING="1", STANDIN_REQUEST_S="1.5")
    run.submit()
    text = run.wait_for("^" + re.escape(BANNER), timeout_s=120)
    assert "ENVLAYERS-POOL: elastic pool: 2 replica(s), up to MAX_REPLICAS=3" in text, text
    ep = run.endpoint()
    base, key = reachable(ep["base_url"], netns_lab), (run.run_dir / "api-key").read_text().strip()
    metrics_url = reachable(ep["metrics_at"], netns_lab)

    # a trickle keeps the endpoint in use (the job's own idle stop stays off) on one prefix the router
    # (cache_aware) keeps on the replica that first served it, never the one added later
    failures: list[str] = []
    trickled = [0]
    stop_trickle, stop_load = threading.Event(), threading.Event()

    def trickle():
        while not stop_trickle.is_set():
            try:
                complete(base, key, "trickle: the same question every second, please")
                trickled[0] += 1
            except Exception as err:  # noqa: BLE001 - counted, asserted below
                failures.append(f"{time.strftime('%H:%M:%S')} {type(err).__name__}: {err}"[:160])
            stop_trickle.wait(1.0)

    def load():
        while not stop_load.is_set():
            try:
                complete(base, key, f"{uuid.uuid4().hex} a new question")
            except Exception as err:  # noqa: BLE001
                failures.append(f"load {type(err).__name__}: {err}"[:160])

    complete(base, key, "trickle: the same question every second, please")
    threads = [threading.Thread(target=trickle, daemon=True)]
    threads[0].start()
    loaders = [threading.Thread(target=load, daemon=True) for _ in range(6)]
    try:
        for t in loaders:
            t.start()
        text = run.wait_for(r"^ENVLAYERS-POOL: grow: requests waited .* submitted replica job \d+", timeout_s=90)
        pool_job = re.search(r"^ENVLAYERS-POOL: grow: .* submitted replica job (\d+)", text, re.M).group(1)
        run.lab._submitted.append(pool_job)
        assert len(re.findall(r"^ENVLAYERS-POOL: grow:", text, re.M)) == 1
        text = run.wait_for(rf"^ENVLAYERS-POOL: replica job {pool_job} joined the router after \d+s: 3 replicas "
                            r"serve \(MAX_REPLICAS=3\)", timeout_s=180)
        info = run.lab.job_info(pool_job)
        assert info["JobState"] == "RUNNING" and info["NodeList"] == "n3" and info["NumNodes"] == "1", info
        ep = run.endpoint()
        (added,) = ep["pool"]["replicas"]
        assert added["job"] == pool_job and added["node"] == "n3" and len(ep["router"]["workers"]) == 3
        worker = added["url"][:-3]
        deadline = time.monotonic() + 60
        while routed_to(metrics_url, worker) == 0 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert routed_to(metrics_url, worker) > 0, "the router routes to the added replica"
    finally:
        stop_load.set()
        for t in loaders:
            t.join(90)
    # the load is gone: the added replica idles, is taken out of the router, then its job is cancelled
    released_at = len(failures)
    text = run.wait_for(rf"^ENVLAYERS-POOL: shrink: replica job {pool_job} \(.*\) no request for \d+s "
                        r"\(IDLE_STOP_AFTER_S=20\): removed from the router, job cancelled; 2 replicas serve",
                        timeout_s=120)
    assert run.lab.wait_job(pool_job, timeout_s=60) in ("CANCELLED", "COMPLETED")
    assert run.endpoint()["pool"]["replicas"] == []
    before = trickled[0]
    deadline = time.monotonic() + 30
    while trickled[0] < before + 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    stop_trickle.set()
    threads[0].join(30)
    assert trickled[0] >= before + 3, "the endpoint keeps answering after the shrink"
    assert not failures[released_at:], failures
    assert not failures, failures
    assert "ENVLAYERS-ERROR" not in text

    run.lab.run(["scancel", run.job_id])
    run.state(timeout_s=60)
    from envlayers.ops.report import build_report

    rep = build_report([run.run_dir.parent], since=0, user=None, use_sacct=False)
    (pool,) = rep.pools
    assert pool["job_id"] == run.job_id and pool["replica_jobs"] == [pool_job]
    assert pool["gpu_hours_replica_jobs"] > 0 and pool["gpu_hours_total"] > pool["gpu_hours_own"]
    assert [d["action"] for d in pool["decisions"]] == ["grow", "shrink"]
    assert [j for j in rep.jobs if j["job_id"] == pool_job][0]["pool_of"] == run.job_id
    run.assert_nothing_left()
    assert not processes_mentioning(str(run.run_dir.parent / pool_job))
