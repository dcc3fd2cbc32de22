#!/usr/bin/env python3
"""Start-up and scale of the layer commands, as ratios measured side by side.

    python3 benchmarks/bench_render.py [--runs 30] [--python PYTHON] [--skip-process] [--skip-scale] [--imports]

Process figures (medians of --runs, the cases interleaved so load spikes hit all alike, bytecode cache on;
wall clock, and beside it the CPU time of the process, which other work on a shared machine disturbs less):
- `env_layers render experiment:glm53`, as a ratio to `python3 -c pass` (goal: <= 5x);
- `env_layers serve --model glm53 --dry-run` from the repository root (what `SUBMIT=0 cluster/serve-only.sbatch`
  runs), as a ratio to `python3 -c pass` (goal: <= 8x);
- bash sourcing the same layer files under `set -a`, for scale;
- the floor the libraries set: importing click and PyYAML (what every render uses), and Jinja2 besides
  (what every dry run uses, for the job script's template), nothing of envlayers.
`env_layers` is the console script beside PYTHON (default: this interpreter), else `PYTHON -m envlayers`.
--imports adds where the dry run's imports go: `python3 -X importtime`'s cumulative time of each module the
dry run imports at the top level (medians of 5 runs; -X importtime inflates every figure alike).
Each goal line also says what the libraries alone take on the same interpreter and how much of the goal that
leaves for envlayers' own work. An interpreter whose site-packages runs .pth start-up hooks pays them in
`python3 -c pass` too, which shrinks every ratio: a NOTE line says how much (against `python3 -S -c pass`), and
--python with a plain virtual environment's interpreter gives the ratios without them.

Scale figures: loading, merging and rendering a stack of N layer files x 200 keys (what
`env_layers --root R render big:m` computes, in this process), 10,000 to 160,000 assignments, with the time
per assignment at each size and the ratio of the largest size's to the smallest's (goal: flat, <= 1.25), and,
for scale, the same ratio for CPython building a plain dict of as many small tuples. Then the same for
SERVER_EXTRA_ARGS: split, checked against vLLM's options, the owned flags and the headless rejects, 1,000 to
16,000 flags (a 128 KiB value holds about 12,000; a longer one is refused before it is split), per flag at
each size and the ratio (goal: flat, <= 1.25; a 1 MB value took 25 s when the checks were quadratic).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Python caches compiled modules (__pycache__) unless PYTHONDONTWRITEBYTECODE is set, as it is on the build
# machine; an operator's installed envlayers has its bytecode, so measure with the cache on.
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}

RENDER_GOAL, DRY_RUN_GOAL, FLAT_GOAL = 5.0, 8.0, 1.25


def run_once(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall-clock seconds, CPU seconds of the process: user + system) of one run."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, argv)
    return wall, usage.ru_utime + usage.ru_stime


def env_layers(python: str) -> list[str]:
    script = Path(python).parent / "env_layers"
    return [str(script)] if script.exists() else [python, "-m", "envlayers"]


def process_figures(runs: int, python: str) -> None:
    cli = env_layers(python)
    layers = "experiments/layers/common.env experiments/layers/model-glm53.env"
    cases = {
        "python3 -c pass": ([python, "-c", "pass"], ENV),
        "env_layers render experiment:glm53": ([*cli, "render", "experiment:glm53"], ENV),
        "env_layers serve --model glm53 --dry-run": ([*cli, "serve", "--model", "glm53", "--dry-run"], ENV),
        "bash: set -a; . layers (no merge, no provenance)":
            (["bash", "-c", f"set -a; for f in {layers}; do . $f; done"], ENV),
        "floor of a render: import click, yaml": ([python, "-c", "import click, yaml"], ENV),
        "floor of a dry run: import click, yaml, jinja2": ([python, "-c", "import click, yaml, jinja2"], ENV),
        "python3 -S -c pass (no site: no .pth start-up hooks)": ([python, "-S", "-c", "pass"], ENV),
    }
    for argv, env in cases.values():  # warm-up: writes the bytecode cache, fills the page cache
        run_once(argv, env)
    samples: dict[str, list[tuple[float, float]]] = {k: [] for k in cases}
    for _ in range(runs):
        for name, (argv, env) in cases.items():
            samples[name].append(run_once(argv, env))
    med = {k: statistics.median(wall for wall, _ in v) for k, v in samples.items()}
    cpu = {k: statistics.median(c for _, c in v) for k, v in samples.items()}
    base, cpu_base = med["python3 -c pass"], cpu["python3 -c pass"]
    print(f"process: {python} ({' '.join(cli)}), median of {runs}, interleaved, bytecode cache on;")
    print("  wall clock (the goals), and the CPU time of the process (user + system: steadier on a shared machine):")
    for name, m in med.items():
        print(f"  {m * 1000:8.1f} ms  {m / base:5.2f}x   cpu {cpu[name] * 1000:6.1f} ms  {cpu[name] / cpu_base:5.2f}x  {name}")
    for name, goal, floor in (("env_layers render experiment:glm53", RENDER_GOAL, "floor of a render: import click, yaml"),
                              ("env_layers serve --model glm53 --dry-run", DRY_RUN_GOAL,
                               "floor of a dry run: import click, yaml, jinja2")):
        ratio = med[name] / base
        verdict = "meets" if ratio <= goal else "MISSES"
        room = goal * base - med[floor]
        print(f"  goal: {name.strip()} <= {goal:.0f}x python3 -c pass: {verdict} ({ratio:.2f}x); the libraries "
              f"alone take {med[floor] / base:.2f}x, leaving {room * 1000:.1f} ms for envlayers' own work, which "
              f"takes {(med[name] - med[floor]) * 1000:.1f} ms ({med[name] / med[floor]:.2f}x the floor)")
    hooks = base - med["python3 -S -c pass (no site: no .pth start-up hooks)"]
    if hooks > 0.5 * base:
        print(f"  NOTE: {hooks * 1000:.1f} ms of python3 -c pass is site start-up (.pth hooks in {python}'s "
              f"site-packages): every ratio above is shrunk by it; --python with a plain virtual environment's "
              f"interpreter gives the ratios without it")


SETUPS = "version: 1\nexperiments:\n  big:\n    layers: [{layers}]\nmodels:\n  m:\n    description: scale\n"


def write_stack(root: Path, files: int, keys: int) -> list[Path]:
    """A catalog whose experiment 'big' stacks ``files`` layer files of ``keys`` keys each: per file keys of
    its own, overrides of shared keys, and references to a shared key (resolved) and to an unassigned name
    (deferred). The render grows linearly with the input."""
    layers = root / "experiments" / "layers"
    layers.mkdir(parents=True)
    (layers / "common.env").write_text("")
    (layers / "model-m.env").write_text("")
    paths = []
    for i in range(files):
        lines = []
        for j in range(keys):
            if j % 10 == 0:
                lines.append(f"SHARED_{j // 10}='v{i} with spaces'")
            elif j % 10 == 1:
                lines.append(f"F{i}_K{j}=\"${{SHARED_{j // 10}:-x}}/{i}\"")
            elif j % 10 == 2:
                lines.append(f"F{i}_K{j}=\"${{SCRATCH}}/f{i}/{j}\"")
            else:
                lines.append(f"F{i}_K{j}='v{i}-{j}'")
        path = layers / f"l{i}.env"
        path.write_text("\n".join(lines) + "\n")
        paths.append(path)
    (root / "experiments" / "setups.yaml").write_text(SETUPS.format(layers=", ".join(p.name for p in paths)))
    return paths


def load_and_render(root: Path) -> None:
    """What `env_layers --root ROOT render big:m` computes: the catalog, the stack's files, the merge and
    the render."""
    from envlayers.layers import load_env
    from envlayers.shell import render

    render(load_env(root, "big:m"), "sh")


def best_of(repeat: int, fn, *args) -> float:
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        t0 = time.perf_counter()
        fn(*args)
        best = min(best, time.perf_counter() - t0)
    return best


def scale_figures(keys: int = 200, sizes=(50, 100, 200, 400, 800), work: int = 4000) -> None:
    """Each size is run best of max(3, work // files) times: a small size many times, so a load spike on a
    shared machine does not make it look slow."""
    try:
        import envlayers
    except ImportError:
        sys.path.insert(0, str(REPO / "src"))
        import envlayers

    print(f"scale: {Path(envlayers.__file__).parent}: N layer files x {keys} keys, load_env + render, "
          f"best of max(3, {work} / N)")
    rows: list[tuple[int, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            root = Path(tmp) / f"n{n}"
            write_stack(root, n, keys)
            t = best_of(max(3, work // n), load_and_render, root)
            rows.append((n * keys, t))
            print(f"  {n:4d} files {n * keys:7d} assignments   {t * 1000:7.1f} ms "
                  f"{t / (n * keys) * 1e6:6.2f} us/assignment", flush=True)
    (n0, t0), (n1, t1) = rows[0], rows[-1]
    floor = interpreter_growth(n0, n1, work * keys)
    ratio = (t1 / n1) / (t0 / n0)
    verdict = "flat" if ratio <= FLAT_GOAL else "NOT flat"
    print(f"  per-assignment time at {n1} / at {n0} assignments: {ratio:.2f} (goal <= {FLAT_GOAL}): {verdict}")
    print(f"  for scale, CPython alone: a dict of N keys to small tuples, per-item time at {n1} / at "
          f"{n0} items: {floor:.2f} (caches and fresh memory, not the algorithm: a ratio near this one is "
          f"the machine's)")


def check_extra_args(value: str, table: dict) -> None:
    """What the dry run does with SERVER_EXTRA_ARGS: split it, check it against vLLM's parser and the
    flags the plan owns, drop what headless ranks reject."""
    from envlayers.engines import choices, owned
    from envlayers.engines.command import extra_args
    from envlayers.engines.vllm import drop_headless_rejects

    words = extra_args({"SERVER_EXTRA_ARGS": value})
    choices.check(["vllm", "serve", "m", *words], table)
    owned.refusals(words, "vllm", table.get("options", ()), "mine.env:1")
    drop_headless_rejects(words)


def extra_args_figures(sizes=(1000, 2000, 4000, 8000, 16000), work: int = 64000) -> None:
    from envlayers.engines import choices

    table = choices.table()
    print(f"scale: SERVER_EXTRA_ARGS of N flags: split + option check + owned flags + headless, "
          f"best of max(3, {work} / N)")
    rows: list[tuple[int, float]] = []
    for n in sizes:
        value = "".join(f"--x{i} a " for i in range(n)) + "--port 9"
        t = best_of(max(3, work // n), check_extra_args, value, table)
        rows.append((n, t))
        print(f"  {n:6d} flags {len(value):8d} bytes   {t * 1000:8.1f} ms {t / n * 1e6:6.2f} us/flag", flush=True)
    (n0, t0), (n1, t1) = rows[0], rows[-1]
    ratio = (t1 / n1) / (t0 / n0)
    print(f"  per-flag time at {n1} / at {n0} flags: {ratio:.2f} (goal <= {FLAT_GOAL}): "
          f"{'flat' if ratio <= FLAT_GOAL else 'NOT flat'}")


def interpreter_growth(n0: int, n1: int, work: int) -> float:
    """The same per-item ratio for the plainest workload of that size: what the memory hierarchy alone costs."""
    def build(n: int) -> dict:
        d = {}
        for i in range(n):
            k = f"K{i}"
            d[k] = (k, (f"v{i}",), ("f", i))
        return d

    per_item = [best_of(max(3, work // n), build, n) / n for n in (n0, n1)]
    return per_item[1] / per_item[0]


def import_figures(python: str, runs: int = 5, depth: int = 3, least_ms: float = 0.5) -> None:
    """The dry run's import tree (``-X importtime``), ``depth`` levels deep, each module's cumulative time
    (medians of ``runs``), those of at least ``least_ms``."""
    import re

    argv = [python, "-X", "importtime", *env_layers(python), "serve", "--model", "glm53", "--dry-run"]
    times: dict[tuple[int, str], list[int]] = {}
    order: list[tuple[int, str]] = []
    for _ in range(runs):
        err = subprocess.run(argv, cwd=REPO, env=ENV, capture_output=True, text=True, check=True).stderr
        for m in re.finditer(r"^import time:\s+\d+ \|\s+(\d+) \|( +)(\S+)$", err, re.M):
            key = ((len(m.group(2)) - 1) // 2, m.group(3))
            if key not in times:
                times[key] = []
                order.append(key)
            times[key].append(int(m.group(1)))
    total = sum(statistics.median(t) for (level, _), t in times.items() if level == 0)
    print(f"the dry run's imports (-X importtime, which inflates them; medians of {runs}): {total / 1000:.1f} ms "
          f"at the top level; below, {depth} levels of those of {least_ms} ms or more, in import order:")
    for level, name in order:
        us = statistics.median(times[(level, name)])
        if level < depth and us >= least_ms * 1000:
            print(f"  {us / 1000:8.1f} ms  {'  ' * level}{name}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--python", default=sys.executable, help="interpreter for the measured processes")
    ap.add_argument("--skip-process", action="store_true")
    ap.add_argument("--skip-scale", action="store_true")
    ap.add_argument("--imports", action="store_true", help="where the dry run's imports go (-X importtime)")
    args = ap.parse_args()
    if not args.skip_process:
        process_figures(args.runs, args.python)
    if args.imports:
        import_figures(args.python)
    if not args.skip_scale:
        scale_figures()
        extra_args_figures()


if __name__ == "__main__":
    main()
