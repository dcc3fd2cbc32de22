"""``env_layers bench`` against real stand-in engines on 127.0.0.1 that stream at a configured pace
(STANDIN_TTFT_S, STANDIN_TOKENS_PER_S): the measured TTFT, ITL, end-to-end latency and throughput
match the configured rates (loose bounds: the machine is shared), errors are counted, the load is
bounded in count and time, the prompt tokens are the engine's own count, the generator's CPU is its
own process time, and the table, JSON and plot come out."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from extratools import needs_extra
from click.testing import CliRunner

from envlayers.bench import load, report
from envlayers.cli import cli
from envlayers.cli.bench_format import format_bench
import standintools
from timing import LATE_S  # how late a busy machine may run an event

REPO = Path(__file__).resolve().parents[1]
STANDIN = REPO / "tests" / "standin"
SERVED = "bench-model"


def Engine(tmp_path: Path, env: dict[str, str], *extra: str) -> standintools.Engine:  # noqa: N802
    """A stand-in vLLM serving SERVED on 127.0.0.1 with the given pace."""
    return standintools.Engine(tmp_path, env, *extra, served=SERVED)


@pytest.fixture
def engines(tmp_path):
    started: list[Engine] = []

    def start(env: dict[str, str], *extra: str) -> Engine:
        started.append(Engine(tmp_path, env, *extra))
        return started[-1]

    yield start
    for e in started:
        e.stop()


def bench(*args: str) -> tuple[int, dict]:
    result = CliRunner().invoke(cli, ["bench", *args, "--json"])
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads(result.stdout)


@pytest.mark.parametrize("ttft_s, rate, tokens, extra", [
    pytest.param(0.1, 100.0, 24, (), id="fast"),
    pytest.param(0.3, 25.0, 12, (), id="slow"),
    # a thinking model whose reasoning streams separately: its first chunk is the first token too
    pytest.param(0.2, 50.0, 16, ("--reasoning-parser", "qwen3"), id="reasoning"),
])
def test_measured_latency_and_throughput_match_the_configured_pace(engines, ttft_s, rate, tokens, extra):
    e = engines({"STANDIN_TTFT_S": str(ttft_s), "STANDIN_TOKENS_PER_S": str(rate), "STANDIN_REASONING": "1"
                 if extra else "0"}, *extra)
    code, data = bench(e.url, "--concurrency", "1,4", "--requests", "8", "--output-tokens", str(tokens))
    assert code == 0
    assert data["target"]["model"] == SERVED  # taken from /v1/models
    expected_e2e = ttft_s + (tokens - 1) / rate
    for lv in data["levels"]:
        assert (lv["requests"], lv["ok"], lv["errors"]) == (8, 8, 0)
        assert lv["output_tokens"] == 8 * tokens  # ignore_eos: every request got all its tokens
        assert ttft_s * 0.9 <= lv["ttft_s"]["p50"] <= ttft_s + 0.3
        assert 0.9 / rate <= lv["itl_s"]["p50"] <= 2.0 / rate + 0.01
        assert expected_e2e * 0.9 <= lv["e2e_s"]["p50"] <= expected_e2e * 1.5 + 0.3
        assert lv["ttft_s"]["p50"] <= lv["ttft_s"]["p90"] <= lv["ttft_s"]["p99"]
        # each of `concurrency` workers finishes one request per e2e: tokens/s about c * tokens / e2e
        ideal = lv["concurrency"] * tokens / expected_e2e
        assert ideal * 0.3 <= lv["output_tokens_per_s"] <= ideal * 1.1
        assert lv["requests_per_s"] == pytest.approx(lv["output_tokens_per_s"] / tokens, rel=0.01)
    one, four = data["levels"]
    assert four["output_tokens_per_s"] > 2 * one["output_tokens_per_s"]  # the stand-in scales with concurrency


def test_table_and_plot(engines, tmp_path):
    needs_extra("matplotlib", "bench")
    e = engines({"STANDIN_TTFT_S": "0.05", "STANDIN_TOKENS_PER_S": "200"})
    png = tmp_path / "bench.png"
    result = CliRunner().invoke(cli, ["bench", e.url, "--concurrency", "1,2,4", "--requests", "4",
                                      "--output-tokens", "8", "--plot", str(png)])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["conc", "ok"])
    rows = [line.split() for line in lines[header + 1:header + 4]]
    assert [(r[0], r[1], r[2]) for r in rows] == [("1", "4", "0"), ("2", "4", "0"), ("4", "4", "0")]
    assert all(len(r[5].split("/")) == 3 for r in rows)  # TTFT p50/p90/p99
    assert f"plot: {png}" in result.stdout
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_key_from_file_and_refused_without_it(engines, tmp_path):
    key = "k-" + os.urandom(6).hex()
    e = engines({"STANDIN_TOKENS_PER_S": "500"}, "--api-key", key)
    result = CliRunner().invoke(cli, ["bench", e.url, "--requests", "2", "--concurrency", "1"])
    assert result.exit_code == 2  # could not run (the help's 2), not a load the endpoint failed (1)
    assert "HTTP 401" in result.stderr and "--api-key-file" in result.stderr
    key_file = tmp_path / "key"
    key_file.write_text(key + "\n")
    key_file.chmod(0o600)
    code, data = bench(e.url, "--requests", "2", "--concurrency", "1", "--api-key-file", str(key_file))
    assert code == 0 and data["levels"][0]["ok"] == 2
    assert key not in json.dumps(data)


def test_nothing_listening_fails_fast_without_load():
    port = standintools.free_port()
    t0 = time.monotonic()
    result = CliRunner().invoke(cli, ["bench", f"http://127.0.0.1:{port}/v1", "--timeout-s", "5"])
    assert result.exit_code == 2  # could not run, as the help promises
    assert "is not ready for a load test" in result.stderr and "no answer" in result.stderr
    assert time.monotonic() - t0 < LATE_S  # before any load: a load of the default 100 requests would take longer


def test_failed_requests_are_counted_with_their_reason(engines):
    e = engines({"STANDIN_TOKENS_PER_S": "500"})
    s = load.Settings(e.url, "no-such-model", requests=6, output_tokens=4, timeout_s=10)
    summary = report.summarize(load.run_level(s, 3))
    assert (summary["requests"], summary["ok"], summary["errors"]) == (6, 0, 6)
    assert summary["error_kinds"][0]["count"] == 6
    assert summary["error_kinds"][0]["error"].startswith("HTTP 404: The model `no-such-model` does not exist")
    assert summary["requests_per_s"] == 0 and summary["ttft_s"]["p50"] is None
    assert "6 failed: HTTP 404" in format_bench(report.report(s, [load.run_level(s, 1)],
                                                                     {"base_url": e.url, "model": "x"}))


@pytest.mark.parametrize("what, settings, concurrency, most_s", [
    # each request would take 120 s to its first token; the 1 s request timeout cuts every one
    pytest.param("timeout", dict(requests=4, timeout_s=1.0, duration_s=300), 4, 1.0 + LATE_S, id="per-request-timeout"),
    # 1000 requests of 0.5 s asked for (250 s at concurrency 2), none may start after 1 s: the level ends soon after
    pytest.param("duration", dict(requests=1000, timeout_s=10.0, duration_s=1.0), 2, 1.0 + 3.5 + LATE_S,
                 id="per-level-duration"),
])
def test_the_load_is_bounded(engines, what, settings, concurrency, most_s):
    ttft = "120" if what == "timeout" else "0.5"
    e = engines({"STANDIN_TTFT_S": ttft, "STANDIN_TOKENS_PER_S": "100"})
    s = load.Settings(e.url, SERVED, output_tokens=4, **settings)
    t0 = time.monotonic()
    run = load.run_level(s, concurrency)
    assert time.monotonic() - t0 < most_s
    if what == "timeout":
        assert len(run.samples) == 4 and not any(x.ok for x in run.samples)
        assert all("timed out" in x.error or "no complete reply" in x.error for x in run.samples)
    else:
        assert run.cut_short and 2 <= len(run.samples) < 20 and all(x.ok for x in run.samples)


class StallingServer:
    """A real HTTP server on 127.0.0.1 whose chat completion answers 200, streams ``chunks`` content chunks
    and then goes silent, the connection open, until the test ends (``release``)."""

    def __init__(self, chunks: int):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.release_event = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for i in range(chunks):
                    event = {"choices": [{"index": 0, "delta": {"content": f"tok{i} "}}]}
                    self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
                    self.wfile.flush()
                outer.release_event.wait(60)  # stalled mid-stream

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def release(self) -> None:
        self.release_event.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stalling_server():
    servers = []

    def start(chunks: int) -> StallingServer:
        servers.append(StallingServer(chunks))
        return servers[-1]

    yield start
    for server in servers:
        server.release()


def test_a_stream_that_stalls_after_two_chunks_is_reported_as_stalled_mid_stream(stalling_server):
    server = stalling_server(2)
    s = load.Settings(server.url, SERVED, requests=2, output_tokens=16, timeout_s=1.0, duration_s=10)
    run = load.run_level(s, 2)
    assert len(run.samples) == 2 and not any(x.ok for x in run.samples)
    for sample in run.samples:
        assert len(sample.chunk_times) == 2
        assert sample.error.startswith("stalled mid-stream: 2 chunks in "), sample.error
        assert "TimeoutError" not in sample.error and "no answer" not in sample.error
        silent_s = float(sample.error.rsplit("then nothing for ", 1)[1].rstrip("s"))
        assert silent_s >= 0.9  # the read timeout (1 s) after the last chunk, give or take the rounding
    table = format_bench(report.report(s, [run], {"base_url": server.url, "model": SERVED}))
    assert "failed: stalled mid-stream: 2 chunks in " in table


def test_a_stream_that_answers_200_and_no_chunk_says_no_token_within_the_timeout(stalling_server):
    server = stalling_server(0)
    s = load.Settings(server.url, SERVED, requests=1, output_tokens=4, timeout_s=1.0, duration_s=10)
    sample = load.run_level(s, 1).samples[0]
    assert not sample.ok and sample.error.startswith("no token within 1."), sample.error
    assert "HTTP 200" in sample.error


# An engine whose tokenizer is not one word, one token: prompt_tokens = 3 x words + 7, plus one for an
# odd request number (so the counts per request differ); USAGE=0 sends no usage chunk at all.
TOKENIZING_ENGINE = """
import json, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def do_GET(self):
        body = json.dumps({"object": "list", "data": [{"id": "tok-model", "object": "model"}]}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["content-length"])))
        words = req["messages"][-1]["content"].split()
        prompt = 3 * len(words) + 7 + (int(words[0]) % 2 if words[0].isdigit() else 0)
        n = req["max_tokens"]
        if not req.get("stream"):  # the check before the load
            body = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": "w"},
                                            "finish_reason": "length"}]}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("connection", "close")
        self.end_headers()
        def send(obj):
            self.wfile.write(b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\\n\\n")
            self.wfile.flush()
        send({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        for i in range(n):
            time.sleep(0.002)
            send({"choices": [{"index": 0, "delta": {"content": " w"}}]})
        send({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
        if USAGE:
            send({"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": n,
                                           "total_tokens": prompt + n}})
        send(b"[DONE]")

USAGE = sys.argv[2] == "1"
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


@pytest.fixture
def tokenizing_engine(tmp_path):
    started = []

    def start(usage: bool) -> str:
        script = tmp_path / "tokenizing_engine.py"
        script.write_text(TOKENIZING_ENGINE)
        port = standintools.free_port()
        started.append(subprocess.Popen([sys.executable, str(script), str(port), "1" if usage else "0"]))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            assert started[-1].poll() is None
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=1):
                    return f"http://127.0.0.1:{port}/v1"
            except OSError:
                time.sleep(0.05)
        raise AssertionError("the tokenizing engine did not serve within 20 s")

    yield start
    for proc in started:
        proc.terminate()
        proc.wait(10)


def test_prompt_tokens_are_the_engines_count_not_the_words(tokenizing_engine):
    url = tokenizing_engine(usage=True)
    code, data = bench(url, "--concurrency", "1,2", "--requests", "6", "--input-tokens", "10",
                       "--output-tokens", "5")
    assert code == 0
    # 10 words: 37 tokens for the even request numbers 0, 2, 4 and 38 for the odd ones
    assert data["prompt"] == {"words_asked": 10, "tokens_counted_p50": 37.5, "tokens_counted_min": 37,
                              "tokens_counted_max": 38, "tokens_counted_reported": 12}
    for lv in data["levels"]:
        assert lv["prompt_tokens"] == {"p50": 37.5, "min": 37, "max": 38, "reported": 6}
        assert lv["output_tokens"] == 6 * 5
    result = CliRunner().invoke(cli, ["bench", url, "--concurrency", "1", "--requests", "3",
                                      "--input-tokens", "10", "--output-tokens", "5"])
    assert result.exit_code == 0, result.output
    # requests 0, 1, 2: 37, 38, 37 tokens
    assert ("prompt: 10 words asked (--input-tokens is a length in words), 37 tokens counted by the engine "
            "(median per request, 37..38)") in result.stdout


def test_no_usage_in_the_stream_leaves_the_prompt_count_unknown(tokenizing_engine):
    url = tokenizing_engine(usage=False)
    s = load.Settings(url, "tok-model", requests=4, input_tokens=10, output_tokens=5, timeout_s=10)
    runs = [load.run_level(s, 2)]
    assert all(x.ok and x.prompt_tokens is None and x.output_tokens == 5 for x in runs[0].samples)
    data = report.report(s, runs, {"base_url": url, "model": "tok-model"})
    assert data["levels"][0]["prompt_tokens"] == {"p50": None, "min": None, "max": None, "reported": 0}
    assert data["prompt"]["tokens_counted_p50"] is None and data["prompt"]["words_asked"] == 10
    assert "10 words asked (--input-tokens is a length in words); the engine reported no prompt token count" \
        in format_bench(data)


@pytest.mark.parametrize("words", [1, 2, 37])
def test_the_prompt_has_the_words_asked_for(engines, words):
    """The stand-in counts one token per word: its count is the words the prompt had."""
    e = engines({"STANDIN_TOKENS_PER_S": "500"})
    code, data = bench(e.url, "--concurrency", "2", "--requests", "4", "--input-tokens", str(words),
                       "--output-tokens", "3")
    assert code == 0
    assert data["levels"][0]["prompt_tokens"] == {"p50": words, "min": words, "max": words, "reported": 4}
    assert len({load.prompt_for(n, words) for n in range(4)}) == 4  # distinct: no prefix cache serves one whole


def test_generator_cpu_is_its_own_process_time_not_the_wall(engines):
    """Slow replies (0.4 s each) cost the generator little CPU; the wall time is not counted as CPU."""
    e = engines({"STANDIN_TTFT_S": "0.4", "STANDIN_TOKENS_PER_S": "200"})
    code, data = bench(e.url, "--concurrency", "2", "--requests", "4", "--output-tokens", "4")
    assert code == 0
    lv = data["levels"][0]
    assert lv["wall_s"] >= 0.8
    assert 0 < lv["generator_cpu_s"] < 0.5 * lv["wall_s"]
    assert lv["generator_cpu_s_per_request"] == pytest.approx(lv["generator_cpu_s"] / 4, abs=1e-5)
    assert lv["generator_cpu_cores"] == pytest.approx(lv["generator_cpu_s"] / lv["wall_s"], abs=1e-4)


def test_generator_cpu_counts_the_work_done_in_the_generator(engines, monkeypatch):
    """CPU the generator's threads burn during a level is in its count (60 ms of work per request)."""
    e = engines({"STANDIN_TOKENS_PER_S": "500"})
    real = load.one_request

    def busy(s, number, level_t0, conn=None):
        t0 = time.thread_time()  # this thread's own 60 ms, whatever the other workers do
        while time.thread_time() - t0 < 0.06:
            pass
        return real(s, number, level_t0, conn)

    monkeypatch.setattr(load, "one_request", busy)
    s = load.Settings(e.url, SERVED, requests=4, output_tokens=3, timeout_s=10)
    summary = report.summarize(load.run_level(s, 2))
    assert summary["ok"] == 4
    assert summary["generator_cpu_s_per_request"] >= 0.06
    assert "gen CPU" in format_bench(report.report(s, [load.run_level(s, 1)],
                                                          {"base_url": e.url, "model": SERVED}))


@pytest.mark.parametrize("values, p, expected", [
    pytest.param([], 50, None, id="empty"),
    pytest.param([5.0], 99, 5.0, id="one"),
    pytest.param([1.0, 2.0, 3.0, 4.0], 50, 2.5, id="interpolated"),
    pytest.param([4.0, 1.0, 3.0, 2.0], 90, 3.7, id="unsorted"),
])
def test_percentile(values, p, expected):
    got = report.percentile(values, p)
    assert got == (pytest.approx(expected) if expected is not None else None)


def test_cli_table_is_lazy():
    """`env_layers --help` lists bench without importing its module."""
    out = subprocess.run([sys.executable, "-c", "import sys; from envlayers.cli import main\n"
                          "try: main(['--help'])\nexcept SystemExit: pass\n"
                          "print('LOADED' if 'envlayers.bench.load' in sys.modules or "
                          "'envlayers.cli.bench_cmds' in sys.modules else 'LAZY')"],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert "bench" in out.stdout and out.stdout.strip().endswith("LAZY")
