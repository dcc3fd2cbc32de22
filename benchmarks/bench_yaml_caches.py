#!/usr/bin/env python3
"""Do the YAML parse caches earn their keep? Start-up of two commands against `python3 -c pass`.

    python3 benchmarks/bench_yaml_caches.py [--runs 20] [--src DIR] [--no-cache-env]

Runs, side by side, `python3 -c pass`, `env_layers render experiment:glm53` and
`env_layers serve --model glm53 --dry-run` (each --runs times, median) with the envlayers package taken
from --src (default: this checkout's src/). --no-cache-env adds ENVLAYERS_NO_CACHE=1, which turned the
setups.yaml cache off in the versions that had one. Used to decide that the caches go (docs/layers.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def median_s(argv: list[str], runs: int, env: dict) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, env=env)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--src", default=str(REPO / "src"))
    ap.add_argument("--no-cache-env", action="store_true")
    args = ap.parse_args()
    script = str(Path(sysconfig.get_path("scripts")) / "env_layers")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = args.src
    env["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="envlayers-bench-cache-")
    if args.no_cache_env:
        env["ENVLAYERS_NO_CACHE"] = "1"
    cmds = {
        "python3 -c pass": [sys.executable, "-c", "pass"],
        "render experiment:glm53": [sys.executable, script, "render", "experiment:glm53"],
        "serve --model glm53 --dry-run": [sys.executable, script, "serve", "--model", "glm53", "--dry-run"],
    }
    for argv in cmds.values():  # warm: bytecode and, where there is one, the parse cache
        subprocess.run(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, env=env)
    base = None
    for label, argv in cmds.items():
        t = median_s(argv, args.runs, env)
        base = base or t
        print(f"{label:<32} {t * 1000:7.1f} ms  {t / base:4.2f}x")


if __name__ == "__main__":
    main()
