#!/usr/bin/env python3
"""Do YAML parse caches earn their keep? Start-up of two commands against `python3 -c pass`.

    python3 benchmarks/bench_yaml_caches.py [--runs 20] [--config LABEL=SRC[:nocache] ...]

Runs `python3 -c pass`, `env_layers render experiment:glm53` and `env_layers serve --model glm53
--dry-run` --runs times each, interleaved across the configurations (so a noisy machine slows all of
them alike), and prints each median and its ratio to `python3 -c pass`. A configuration takes the
envlayers package from SRC (default: this checkout's src/); `:nocache` sets ENVLAYERS_NO_CACHE=1, which
turns the parse caches (setups.yaml, the container sources) off. To compare with an older version:

    git archive <commit> src | tar -x -C /tmp/old
    python3 benchmarks/bench_yaml_caches.py --config old=/tmp/old/src --config old-nocache=/tmp/old/src:nocache \
        --config now=src
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--config", action="append", default=[], metavar="LABEL=SRC[:nocache]")
    args = ap.parse_args()
    script = str(Path(sysconfig.get_path("scripts")) / "env_layers")
    base_env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    configs = {}
    for spec in args.config or [f"now={REPO / 'src'}"]:
        label, _, src = spec.partition("=")
        src, _, flag = src.partition(":")
        env = dict(base_env, PYTHONPATH=str(Path(src).resolve()),
                   XDG_CACHE_HOME=tempfile.mkdtemp(prefix="envlayers-bench-cache-"))
        if flag == "nocache":
            env["ENVLAYERS_NO_CACHE"] = "1"
        configs[label] = env
    cmds = {
        "python3 -c pass": [sys.executable, "-c", "pass"],
        "render experiment:glm53": [sys.executable, script, "render", "experiment:glm53"],
        "serve --model glm53 --dry-run": [sys.executable, script, "serve", "--model", "glm53", "--dry-run"],
    }
    times: dict[tuple[str, str], list[float]] = {(c, k): [] for c in configs for k in cmds}
    for run in range(args.runs + 1):  # run 0 warms bytecode and, where there is one, the parse cache
        for c, env in configs.items():
            for k, argv in cmds.items():
                t0 = time.perf_counter()
                subprocess.run(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True,
                               env=env)
                if run:
                    times[(c, k)].append(time.perf_counter() - t0)
    for c in configs:
        base = statistics.median(times[(c, "python3 -c pass")])
        for k in cmds:
            t = statistics.median(times[(c, k)])
            print(f"{c:<14} {k:<32} {t * 1000:7.1f} ms  {t / base:4.2f}x")


if __name__ == "__main__":
    main()
