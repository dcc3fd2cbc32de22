#!/usr/bin/env python3
"""How fast a job ends when the real vLLM's engine dies, on the local Slurm cluster.

    python3 benchmarks/bench_real_faults.py [--runs 3] [--fault engine-core|headless]

Needs root (the lab) and the real engine (scripts/real-vllm.sh). Each run starts a job with the real
vLLM CPU build and the tiny seeded model (the layers tests/slurm/test_real_vllm_e2e.py uses), waits
until it is live, and SIGKILLs either the ``EngineCore`` of a single-node job (``engine-core``, the
default) or the headless rank 1 of a 2-node data-parallel job (``headless``), then measures, from the
kill (a SIGKILL ends the process at once):
- to the launcher's ENVLAYERS-ERROR line in the job output (polled every 20 ms);
- to Slurm reporting the job ended (polled every 50 ms).
Goal: under 1 s to the error line. Prints each run and the medians.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests" / "slurm"), str(REPO / "tests")]
os.environ.setdefault("ENVLAYERS_REQUIRE_SLURM", "1")  # a missing engine is an error here, not a skip

import labtools  # noqa: E402
from test_real_vllm_e2e import Meter, RealRun, TERMINAL_STATES  # noqa: E402


def one_run(lab, workdir: Path, meter: Meter, fault: str) -> tuple[float, float]:
    if fault == "headless":
        run = RealRun(lab, workdir, meter, "headless rank 1 SIGKILL", model="oss20bdp",
                      layer="NUMBER_OF_INSTANCES=2\nSTARTUP_STALL_S=300\n")
    else:
        run = RealRun(lab, workdir, meter, "engine core SIGKILL", layer="ALLOW_PUBLIC_UNAUTHENTICATED=1\n")
    run.submit()
    run.wait_live()
    pid = run.rank_pid(1, b"--headless") if fault == "headless" else run.engine_core_pid(0)
    t_kill = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    t_error = t_end = None
    deadline = t_kill + 120
    while time.monotonic() < deadline and t_end is None:
        now = time.monotonic()
        if t_error is None and "\nENVLAYERS-ERROR: " in run.text():
            t_error = now
        info = lab.job_info(run.job_id)
        if info is None or info.get("JobState") in TERMINAL_STATES:
            t_end = now
        time.sleep(0.02)
    run.finish()
    if t_error is None or t_end is None:
        raise RuntimeError(f"job {run.job_id} did not end with an error after its engine core died:\n{run.text()}")
    return t_error - t_kill, t_end - t_kill


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--fault", choices=("engine-core", "headless"), default="engine-core")
    args = ap.parse_args()
    lab = labtools.acquire_lab(nodes=3)
    meter = Meter()
    try:
        errors, ends = [], []
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(args.runs):
                d = Path(tmp) / f"r{i}"
                d.mkdir()
                to_error, to_end = one_run(lab, d, meter, args.fault)
                errors.append(to_error)
                ends.append(to_end)
                print(f"run {i + 1}: {args.fault} SIGKILL -> ENVLAYERS-ERROR {to_error:.2f}s, -> job ended {to_end:.2f}s",
                      flush=True)
        print(f"median {args.fault} death -> ENVLAYERS-ERROR line: {statistics.median(errors):.2f}s (goal < 1 s)")
        print(f"median {args.fault} death -> Slurm says the job ended: {statistics.median(ends):.2f}s")
    finally:
        meter.close()
        lab.cancel_all_submitted()
        labtools.release_lab(lab)


if __name__ == "__main__":
    main()
