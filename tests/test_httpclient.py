"""envlayers.httpclient against a real local HTTP server: answers, refusals, silence, trickling, streams."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time

import pytest

from envlayers import httpclient
from timing import LATE_S  # how late a busy machine may run an event


class Handler(http.server.BaseHTTPRequestHandler):
    seen: list = []

    def log_message(self, *args):
        pass

    def _send(self, status: int, body: bytes, ctype: str = "application/json"):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        Handler.seen.append((self.path, self.headers.get("Authorization")))
        if self.path == "/ok":
            self._send(200, b'{"data": [1]}')
        elif self.path == "/missing":
            self._send(404, json.dumps({"error": {"message": "no such model"}}).encode())
        elif self.path == "/silent":
            time.sleep(3)
        elif self.path == "/trickle":
            self.send_response(200)
            self.send_header("Content-Length", "100")
            self.end_headers()
            for _ in range(30):
                self.wfile.write(b"x")
                self.wfile.flush()
                time.sleep(0.1)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Handler.seen.append((self.path, self.headers.get("Content-Type")))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for n in range(body["n"]):
            self.wfile.write(f"data: {n}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")


@pytest.fixture(scope="module")
def base():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def test_get_json_and_the_key_goes_in_the_authorization_header(base):
    answer = httpclient.get(base + "/ok", 2, api_key="sekrit")
    assert answer.status == 200 and answer.json() == {"data": [1]}
    assert ("/ok", "Bearer sekrit") in Handler.seen


def test_an_error_status_raises_with_status_body_and_url(base):
    with pytest.raises(httpclient.HttpError) as err:
        httpclient.get(base + "/missing", 2)
    assert err.value.status == 404 and err.value.url == base + "/missing"
    assert httpclient.engine_message(err.value.body) == "no such model"


def test_a_closed_port_raises_with_no_status_and_the_reason():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    with pytest.raises(httpclient.HttpError) as err:
        httpclient.get(f"http://127.0.0.1:{port}/", 2)
    assert err.value.status is None and not err.value.timed_out and "refused" in str(err.value.reason)


def test_a_silent_server_times_out_within_the_bound(base):
    t0 = time.monotonic()
    with pytest.raises(httpclient.HttpError) as err:
        httpclient.get(base + "/silent", 0.5)
    assert err.value.timed_out and err.value.status is None and time.monotonic() - t0 < 0.5 + LATE_S  # silent for ever


def test_request_within_cuts_off_a_server_that_trickles(base):
    t0 = time.monotonic()
    with pytest.raises(httpclient.HttpError) as err:
        httpclient.request_within("GET", base + "/trickle", 0.5, slack_s=0.2)
    assert err.value.incomplete and err.value.reason == "no complete answer within 0.5s"
    assert time.monotonic() - t0 < 0.7 + LATE_S  # it trickles for ever; each byte came within the socket timeout: only the wall clock stops it


def test_stream_reads_server_sent_lines_of_a_json_post(base):
    with httpclient.stream("POST", base + "/events", 2, json_body={"n": 3}) as resp:
        lines = []
        while (line := resp.readline()):
            lines.append(line.strip())
    assert [x for x in lines if x] == [b"data: 0", b"data: 1", b"data: 2", b"data: [DONE]"]
    assert ("/events", "application/json") in Handler.seen


@pytest.mark.parametrize("body, message", [
    pytest.param(b'{"error": {"message": "bad"}}', "bad", id="openai-error-object"),
    pytest.param(b'{"error": "bad"}', "bad", id="error-string"),
    pytest.param(b'{"message": "bad"}', "bad", id="message-only"),
    pytest.param(b"<html>", None, id="not-json"),
])
def test_engine_message(body, message):
    assert httpclient.engine_message(body) == message
