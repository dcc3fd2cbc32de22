"""The elastic pool (launch/pool.py) without Slurm for the tests: a fake router, the pool of a job on the fake
clock (clocktools.Clock) with a fake sbatch and fake /metrics, and the ticks that move it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from clocktools import Clock
from envlayers.launch.pool import Pool

WAITING = ('vllm:num_requests_waiting{engine="0"} %d\nvllm:request_queue_time_seconds_sum{engine="0"} %g\n'
           'vllm:request_queue_time_seconds_count{engine="0"} %d\n')


class FakeRouter:
    """What the pool asks of launch.router.Router; records each add and remove."""

    def __init__(self):
        self.workers = ["http://n0:8000", "http://n1:8000"]
        self.api_key = "sk-test"
        self.calls: list[tuple] = []
        self.healthy: set[str] = set()
        self.counts: dict[str, float] = {}

    def add_worker(self, url):
        self.calls.append(("add", url))
        return None

    def listed(self):
        return {u: (f"id-{u}", u in self.healthy) for u in self.workers + sorted(self.healthy)}

    def remove_worker(self, url):
        self.calls.append(("remove", url))
        return None

    def metrics(self):
        return "\n".join(f'smg_worker_cb_outcomes_total{{worker="{u}",outcome="success"}} {n}'
                         for u, n in self.counts.items()) + "\n"


def pool_world(tmp_path: Path):
    """A pool of job 100 (two replicas started, up to three) on the fake clock, with the fake router, a fake
    sbatch whose replica jobs are 201, 202..., and /metrics where requests wait on n0 as ``metrics["wait"]``
    says. Returns (pool, clock, router, lines said, sbatch calls, cancelled jobs, metrics, run_dir)."""
    run_dir = tmp_path / "100"
    run_dir.mkdir()
    (run_dir / "job.sh").write_text("#!/bin/bash\n")
    (run_dir / "api-key").write_text("sk-test\n")
    clock, router, lines, submitted, cancelled, metrics = Clock(), FakeRouter(), [], [], [], {"wait": 0}

    def run(argv, env):
        submitted.append((argv, env))
        return subprocess.CompletedProcess(argv, 0, f"{200 + len(submitted)}\n", "")

    def fetch(url, api_key):
        q = metrics["wait"]
        return WAITING % (q, 0.0, 0) if "n0" in url else WAITING % (0, 0.0, 0)

    keys = {"SCALE_UP_WAIT_S": "5", "SCALE_UP_WINDOW_S": "20", "IDLE_STOP_AFTER_S": "30"}
    pool = Pool(keys, job_id="100", run_dir=run_dir, engine="vllm", router=router, started=2, max_replicas=3,
                startup_s=30.0, time_left_s=3600.0, environ={"SLURM_JOB_ID": "100", "SLURM_CONF": "/c",
                                                             "HOME": "/h", "ENVLAYERS_CHAIN_LEFT": "2"},
                api_key="sk-test", say=lines.append, clock=clock, wall=lambda: clock.t + 1e9, run=run,
                fields=lambda job: {"Partition": "debug", "Account": "proj"}, state=lambda job: "RUNNING",
                fetch=fetch, cancel=cancelled.append)
    return pool, clock, router, lines, submitted, cancelled, metrics, run_dir


def ticks(pool, clock, seconds, step=5.0):
    end = clock.t + seconds
    while clock.t < end:
        clock.t += step
        pool.tick()


def live_replica_job(world):
    """Requests wait until the pool submits replica job 201, which then writes its endpoint.json."""
    pool, clock, router, lines, submitted, cancelled, metrics, run_dir = world
    metrics["wait"] = 3
    ticks(pool, clock, 40)
    member = run_dir.parent / "201"
    member.mkdir()
    (member / "endpoint.json").write_text(json.dumps({"base_urls": ["http://n2:8000/v1"], "nodes": ["n2"]}))
