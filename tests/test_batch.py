"""``env_layers batch`` on 127.0.0.1: against the stand-in vLLM (real HTTP, real engine-like answers) and
against a server that fails on cue (429, 503, a dropped connection, a 400) to hold the retries, the
exactly-once output, the resume after a crash and the endpoint moving under a running batch."""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from envlayers.batch.records import Output, read_input
from envlayers.batch.run import Endpoint, Settings, run
from envlayers.errors import EnvLayersError
from standintools import Engine

REPO = Path(__file__).resolve().parents[1]
SERVED = "batch-model"


@pytest.fixture
def standin(tmp_path):
    engine = Engine(tmp_path, {"STANDIN_TOKENS_PER_S": "400"}, served=SERVED)
    yield engine.url
    engine.stop()


def _lines(path: Path, n: int, url: str = "/v1/chat/completions", **extra) -> Path:
    with open(path, "w") as f:
        for i in range(n):
            body = ({"messages": [{"role": "user", "content": f"id-{i}"}], "max_tokens": 4} if "chat" in url
                    else {"prompt": f"id-{i}", "max_tokens": 4})
            f.write(json.dumps({"custom_id": f"id-{i}", "method": "POST", "url": url, "body": {**body, **extra}}) + "\n")
    return path


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "envlayers", "batch", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO / "src")})


def _ids(path: Path) -> list[str]:
    return [json.loads(line)["custom_id"] for line in path.read_text().splitlines()]


def test_a_batch_through_the_stand_in_answers_each_line_once_in_openais_format(standin, tmp_path):
    chat = _lines(tmp_path / "chat.jsonl", 12)
    done = _cli(standin, str(chat), "-o", "out.jsonl", "--concurrency", "4", "--model", SERVED, "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert (summary["answered"], summary["failed"], summary["skipped"]) == (12, 0, 0)
    assert summary["completion_tokens"] == 12 * 4 and summary["prompt_tokens"] > 0
    records = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert sorted(r["custom_id"] for r in records) == sorted(f"id-{i}" for i in range(12))
    for r in records:
        assert r["error"] is None and r["response"]["status_code"] == 200 and r["id"].startswith("batch_req_")
        assert r["response"]["request_id"] == r["response"]["body"]["id"]
        assert r["custom_id"] in r["response"]["body"]["choices"][0]["message"]["content"]  # its own answer
    assert (tmp_path / "out.errors.jsonl").read_text() == ""
    assert oct((tmp_path / "out.jsonl").stat().st_mode & 0o777) == "0o600"
    # completions too, and a rerun sends nothing: every custom_id is answered
    comp = _lines(tmp_path / "comp.jsonl", 3, url="/v1/completions")
    assert _cli(standin, str(comp), "-o", "comp-out.jsonl", "--model", SERVED, cwd=tmp_path).returncode == 0
    again = _cli(standin, str(chat), "-o", "out.jsonl", "--model", SERVED, "--json", cwd=tmp_path)
    assert json.loads(again.stdout)["skipped"] == 12 and len(_ids(tmp_path / "out.jsonl")) == 12


@pytest.mark.parametrize("line, said", [
    pytest.param('{"custom_id": "a", "url": "/v1/chat/completions", "body": {}}', "custom_id 'a' is used twice "
                 "(first on line 1)", id="duplicate"),
    pytest.param('{"custom_id": "b", "url": "/v1/embeddings", "body": {}}', "url '/v1/embeddings' is not one the "
                 "batch sends", id="url"),
    pytest.param('{"custom_id": "b", "url": "/v1/completions", "body": {"stream": true}}', "body asks for a stream",
                 id="stream"),
    pytest.param('{"custom_id": "b", "url": "/v1/completions"', "not JSON", id="not-json"),
    pytest.param('{"custom_id": "b", "method": "GET", "url": "/v1/completions", "body": {}}', "method 'GET'",
                 id="method"),
])
def test_a_bad_line_is_one_error_naming_file_and_line_and_nothing_is_sent_or_written(tmp_path, line, said):
    first = '{"custom_id": "a", "url": "/v1/chat/completions", "body": {"model": "m"}}'
    (tmp_path / "in.jsonl").write_text(first + "\n" + line + "\n")
    done = _cli("http://127.0.0.1:9/v1", "in.jsonl", "-o", "out.jsonl", "--model", "m", cwd=tmp_path)
    assert done.returncode == 2
    (only,) = done.stderr.strip().splitlines()
    assert only.startswith("env_layers: error: in.jsonl:2: ") and said in only and "hint:" in only, only
    assert not (tmp_path / "out.jsonl").exists()


class Cue(http.server.BaseHTTPRequestHandler):
    """Answers a completion like an engine, unless ``plan[prompt]`` holds what to do first (one item per
    attempt: an HTTP status, or "drop" to close the connection unanswered). Counts attempts per prompt."""
    protocol_version = "HTTP/1.1"
    plan: dict[str, list] = {}
    attempts: dict[str, int] = {}
    lock = threading.Lock()
    open_sockets: dict[int, list] = {}  # server port -> its connections, for a server that dies

    def log_message(self, *a):
        pass

    def setup(self):
        super().setup()
        with Cue.lock:
            Cue.open_sockets.setdefault(self.server.server_port, []).append(self.connection)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = body.get("prompt") or body["messages"][-1]["content"]
        with Cue.lock:
            Cue.attempts[prompt] = Cue.attempts.get(prompt, 0) + 1
            todo = Cue.plan.get(prompt) or []
            step = todo.pop(0) if todo else 200
        if step == "drop":
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if step != 200:
            data = json.dumps({"error": {"message": f"cue {step}"}}).encode()
        else:
            data = json.dumps({"id": f"cmpl-{prompt}", "object": "chat.completion", "choices": [
                {"index": 0, "message": {"role": "assistant", "content": f"answer {prompt}"}}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}).encode()
        self.send_response(step)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def die(server) -> None:
    """The server's process ends: its port closes and so does every connection it had."""
    port = server.server_port
    server.shutdown()
    server.server_close()
    with Cue.lock:
        for sock in Cue.open_sockets.get(port, []):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


@pytest.fixture
def cue():
    Cue.plan, Cue.attempts = {}, {}
    servers = []

    def start():
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Cue)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server, f"http://127.0.0.1:{server.server_port}/v1"

    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


FAST = Settings(concurrency=4, retries=3, timeout_s=10, backoff_s=0.01, backoff_max_s=0.05)


def test_429_503_and_a_dropped_connection_are_retried_and_each_line_is_written_once(cue, tmp_path):
    _, url = cue()
    Cue.plan = {"id-1": [429, 429], "id-2": [503], "id-3": ["drop", "drop"], "id-4": [400]}
    requests = read_input(_lines(tmp_path / "in.jsonl", 8), "m")
    out = Output(tmp_path / "out.jsonl", tmp_path / "err.jsonl")
    tally = run(requests, out, Endpoint(lambda: ([url], None)), FAST)
    out.close()
    assert tally.answered == 7 and dict(tally.failed) == {"http_400": 1}
    assert Cue.attempts["id-1"] == 3 and Cue.attempts["id-2"] == 2 and Cue.attempts["id-3"] == 3
    # a drop on a kept-alive connection is sent again once at once, as on a connection the server closed
    # while idle (httpclient.Connection); on a fresh one it is a retry with backoff
    assert {k: v for k, v in tally.retries.items() if k != "connection"} == {"rate_limited": 2, "server_error": 1}
    assert 1 <= tally.retries["connection"] <= 2
    assert sorted(_ids(tmp_path / "out.jsonl")) == sorted(f"id-{i}" for i in range(8) if i != 4)
    (error,) = [json.loads(line) for line in (tmp_path / "err.jsonl").read_text().splitlines()]
    assert error["custom_id"] == "id-4" and error["error"] == {"code": "http_400", "message": "HTTP 400: cue 400"}
    assert error["response"]["status_code"] == 400
    # a rerun retries only the failed one, and the errors file holds this run's failures: none
    out = Output(tmp_path / "out.jsonl", tmp_path / "err.jsonl")
    tally = run(requests, out, Endpoint(lambda: ([url], None)), FAST)
    out.close()
    assert (tally.skipped, tally.answered) == (7, 1) and Cue.attempts["id-0"] == 1 and Cue.attempts["id-4"] == 2
    assert sorted(_ids(tmp_path / "out.jsonl")) == sorted(f"id-{i}" for i in range(8))
    assert (tmp_path / "err.jsonl").read_text() == ""


def test_retries_run_out_into_the_errors_file(cue, tmp_path):
    _, url = cue()
    Cue.plan = {"id-0": [503] * 10}
    out = Output(tmp_path / "out.jsonl", tmp_path / "err.jsonl")
    tally = run(read_input(_lines(tmp_path / "in.jsonl", 1), "m"), out, Endpoint(lambda: ([url], None)), FAST)
    out.close()
    assert dict(tally.failed) == {"server_error": 1} and Cue.attempts["id-0"] == 1 + FAST.retries
    (error,) = [json.loads(line) for line in (tmp_path / "err.jsonl").read_text().splitlines()]
    assert error["error"]["message"] == "HTTP 503: cue 503 (after 3 retries)"


def test_a_rerun_after_a_crash_cuts_the_half_line_and_skips_what_was_answered(cue, tmp_path):
    _, url = cue()
    requests = read_input(_lines(tmp_path / "in.jsonl", 6), "m")
    answered = [json.dumps({"id": "batch_req_x", "custom_id": f"id-{i}", "response": {"status_code": 200},
                            "error": None}) for i in (0, 2)]
    (tmp_path / "out.jsonl").write_text("\n".join(answered) + '\n{"id": "batch_req_y", "custom_id": "id-3", "resp')
    out = Output(tmp_path / "out.jsonl", tmp_path / "err.jsonl")
    tally = run(requests, out, Endpoint(lambda: ([url], None)), FAST)
    out.close()
    assert (tally.skipped, tally.answered) == (2, 4)
    assert sorted(Cue.attempts) == ["id-1", "id-3", "id-4", "id-5"]  # the cut line's id-3 was sent again
    ids = _ids(tmp_path / "out.jsonl")
    assert sorted(ids) == [f"id-{i}" for i in range(6)] and len(ids) == len(set(ids))


def test_the_batch_follows_the_endpoint_when_its_server_goes_away(cue, tmp_path):
    first, url_a = cue()
    _, url_b = cue()
    where = tmp_path / "endpoint"  # what endpoint.json says now
    where.write_text(url_a)
    gone = threading.Event()

    def resolve():
        return [where.read_text()], None

    Cue.plan = {f"id-{i}": [] for i in range(40)}
    requests = read_input(_lines(tmp_path / "in.jsonl", 40), "m")
    out = Output(tmp_path / "out.jsonl", tmp_path / "err.jsonl")
    answered = []

    def progress(tally):
        answered.append(tally.answered)
        if tally.answered == 10 and not gone.is_set():
            gone.set()
            where.write_text(url_b)  # the job handed over (or the replica died): the record moves first,
            die(first)  # then the old server goes, its connections with it

    endpoint = Endpoint(resolve, min_refresh_s=0)
    tally = run(requests, out, endpoint, Settings(concurrency=2, retries=8, timeout_s=5, backoff_s=0.01,
                                                  backoff_max_s=0.05), progress=progress)
    out.close()
    assert tally.answered == 40 and not tally.failed
    ids = _ids(tmp_path / "out.jsonl")
    assert sorted(ids) == sorted(f"id-{i}" for i in range(40)) and len(ids) == 40
    assert tally.endpoints == [url_a, url_b] and endpoint.moves == [f"{url_a} -> {url_b}"]


def test_progress_lines_without_a_terminal_and_the_summary(standin, tmp_path):
    chat = _lines(tmp_path / "chat.jsonl", 5)
    done = _cli(standin, str(chat), "-o", "out.jsonl", "--model", SERVED, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "batch: 5/5 done (0 failed)" in done.stderr
    assert done.stdout.startswith("batch: 5 answered, 0 failed, 0 answered before (of 5)\n")
    assert "GPU-hours not known (a URL, or a job without its accounting record)" in done.stdout


def test_the_endpoint_with_no_url_is_an_error():
    with pytest.raises(EnvLayersError, match="no base URL"):
        Endpoint(lambda: ([], None))


def test_on_a_terminal_a_progress_bar_shows_the_rate(standin, tmp_path):
    import pty

    chat = _lines(tmp_path / "chat.jsonl", 6)
    import fcntl
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # a terminal of 120 columns
    proc = subprocess.Popen([sys.executable, "-m", "envlayers", "batch", standin, str(chat), "-o", "out.jsonl",
                             "--model", SERVED], cwd=tmp_path, stdout=subprocess.PIPE, stderr=slave, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    os.close(slave)
    seen = b""
    while True:
        try:
            chunk = os.read(master, 4096)  # until the child's end closes the terminal
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    stdout, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, seen
    text = seen.decode(errors="replace")
    assert "batch: 100%" in text and "6/6" in text and "req/s" in text, text  # tqdm's bar, rate and count
    assert "done (0 failed)" not in text  # not the plain lines
    assert stdout.startswith("batch: 6 answered")
