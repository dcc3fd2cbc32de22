#!/usr/bin/env python3
"""Launcher reaction times on the local Slurm cluster, with the stand-in engine.

    python3 benchmarks/bench_launch.py [--runs 5]

Brings the lab up if needed (cluster/slurm-lab, as root) and measures, from outside the job:
- ready overhead: from the endpoint first answering /v1/models (probed from the host every
  20 ms) to the `===== endpoint is live =====` block appearing in the job output (target < 1 s);
- crash to end: from a rank's exit (mtime of rank-<r>.exit) to Slurm reporting the job ended
  (polled every 50 ms; target < 5 s). Peers wait for a 300-1800 s readiness timeout or never notice.
Prints each run and the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "slurm"))
import labtools  # noqa: E402

BANNER = "===== endpoint is live ====="


def submit(lab, workdir: Path, layer: str, **env: str) -> str:
    # keyless, acknowledged: the lab's network is private to this machine, and the probe asks without a key
    (workdir / "mine.env").write_text("CONTAINER_RUNTIME=none\nSERVER_API_KEY_FILE=\nALLOW_PUBLIC_UNAUTHENTICATED=1\n"
                                      + layer)
    full = {**os.environ, **lab.env, "SCRATCH": str(workdir / "scratch"), "SERVE_ENV_FILE": str(workdir / "mine.env"),
            "PATH": f"{REPO / 'tests/standin/bin'}:{lab.env.get('PATH', os.environ['PATH'])}",
            "PYTHONPATH": os.pathsep.join([str(REPO / "tests/standin/pypath"), str(REPO / "src")]), **env}
    out = subprocess.run([str(REPO / "cluster/serve-only.sbatch"), "--json"], cwd=workdir, env=full,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    job_id = json.loads(out)["job_id"]
    lab._submitted.append(job_id)
    return job_id


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=0.5) as resp:
            return resp.status == 200
    except OSError:
        return False


def ready_overhead(lab, workdir: Path) -> float:
    job_id = submit(lab, workdir, "", STANDIN_LOAD_SECONDS="2")
    url = f"http://{lab.nodes['n1']}:8000/v1/models"
    out = workdir / f"serve-only-{job_id}.out"
    t_answer = t_block = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and t_block is None:
        now = time.monotonic()
        if t_answer is None and answers(url):
            t_answer = now
        if out.exists() and BANNER in out.read_text(errors="replace"):
            t_block = now
        time.sleep(0.02)
    lab.cancel(job_id)
    lab.wait_job(job_id, timeout_s=30)
    if t_answer is None or t_block is None:
        raise RuntimeError(f"job {job_id} never went live; see {out}")
    return t_block - t_answer


def crash_to_end(lab, workdir: Path) -> float:
    job_id = submit(lab, workdir, "INFERENCE_NODES=2\nPIPELINE_PARALLEL_SIZE=2\n", STANDIN_LOAD_SECONDS="3",
                    STANDIN_CRASH_AT="weights", STANDIN_EXIT_CODE="3", STANDIN_RANKS="1")
    exit_file = workdir / "scratch" / "inference-server" / job_id / "rank-1.exit"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        info = lab.job_info(job_id)
        state = (info or {}).get("JobState", "")
        if state and state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
            ended = time.time()
            return ended - exit_file.stat().st_mtime
        time.sleep(0.05)
    raise RuntimeError(f"job {job_id} did not end")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    lab = labtools.acquire_lab(nodes=3)
    try:
        ready, crash = [], []
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(args.runs):
                d = Path(tmp) / f"r{i}"
                d.mkdir()
                ready.append(ready_overhead(lab, d))
                (d / "c").mkdir()
                crash.append(crash_to_end(lab, d / "c"))
                print(f"run {i + 1}: ready overhead {ready[-1]:.2f}s   crash to end {crash[-1]:.2f}s", flush=True)
        print(f"median ready overhead (engine answers -> endpoint block): {statistics.median(ready):.2f}s "
              f"(target < 1 s)")
        print(f"median crash to job end: {statistics.median(crash):.2f}s (target < 5 s)")
    finally:
        lab.cancel_all_submitted()
        labtools.release_lab(lab)


if __name__ == "__main__":
    main()
