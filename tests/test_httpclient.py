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


def test_an_error_status_is_a_response_with_status_body_message_and_url(base):
    answer = httpclient.get(base + "/missing", 2)
    assert answer.status == 404 and not answer.ok and answer.url == base + "/missing"
    assert answer.message() == "no such model" and answer.said() == "HTTP 404: no such model"
    assert answer.headers["Content-Type"] == "application/json" and answer.elapsed_s > 0


def test_a_closed_port_is_a_response_with_no_status_and_the_reason():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    answer = httpclient.get(f"http://127.0.0.1:{port}/", 2)
    assert answer.status is None and not answer.ok and not answer.timed_out and "refused" in answer.reason
    assert answer.said() == f"no answer: {answer.reason}"


def test_a_silent_server_times_out_within_the_bound(base):
    t0 = time.monotonic()
    answer = httpclient.get(base + "/silent", 0.5)
    assert answer.timed_out and answer.status is None and time.monotonic() - t0 < 0.5 + LATE_S  # silent for ever


def test_request_within_cuts_off_a_server_that_trickles(base):
    t0 = time.monotonic()
    answer = httpclient.request_within("GET", base + "/trickle", 0.5, slack_s=0.2)
    assert answer.incomplete and answer.status is None and answer.reason == "no complete reply within 0.5s"
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
    pytest.param(b'{"object": "error", "message": "bad", "code": 400}', "bad", id="vllm-error-response"),
    pytest.param(b'{"error": {"code": 7}, "message": "bad"}', "bad", id="error-object-without-message"),
    pytest.param(b'{"detail": "Not Found"}', "Not Found", id="web-framework-detail"),
    pytest.param(b'{"error": {}}', None, id="empty-error"),
    pytest.param(b'["bad"]', None, id="not-an-object"),
    pytest.param(b"<html>", None, id="not-json"),
])
def test_the_message_of_an_error_body_is_read_one_way(body, message):
    answer = httpclient.Response("http://h/v1/x", 400, body)
    assert answer.message() == message
    assert answer.said() == "HTTP 400" + (f": {message}" if message else "")


def test_a_message_is_cut_at_the_limit_and_a_2xx_answer_says_only_its_status():
    assert httpclient.Response("u", 500, b'{"error": "' + b"x" * 50 + b'"}').said(10) == "HTTP 500: " + "x" * 10
    assert httpclient.Response("u", 200, b'{"message": "fine"}').said() == "HTTP 200"
    assert httpclient.Response("u", 200, b"abcdef").text(3) == "abc..."


class KeepAliveHandler(http.server.BaseHTTPRequestHandler):
    """HTTP/1.1 with chunked server-sent events, as uvicorn answers a streamed completion. The request's JSON
    says how: ``n`` events; ``drop_idle``: close the connection after answering without saying so (a server
    whose idle timeout ran out); ``cut``: end the connection after the first event."""
    protocol_version = "HTTP/1.1"
    connections = 0
    requests: list = []

    def setup(self):
        super().setup()
        type(self).connections += 1

    def log_message(self, *args):
        pass

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append((body, self.headers.get("Authorization")))
        if body.get("status", 200) != 200:
            error = json.dumps({"error": {"message": "too many"}}).encode()
            self.send_response(body["status"])
            self.send_header("Content-Length", str(len(error)))
            self.end_headers()
            self.wfile.write(error)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for n in range(body["n"]):
            self._chunk(f"data: {n}\n\n".encode())
            if body.get("cut"):
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
        self._chunk(b"data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")
        if body.get("drop_idle"):
            self.close_connection = True


@pytest.fixture
def keepalive():
    KeepAliveHandler.connections, KeepAliveHandler.requests = 0, []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), KeepAliveHandler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


def _events(conn, **body) -> list[bytes]:
    with conn.stream("POST", "/v1/chat/completions", json_body=body, api_key="k" * 16) as resp:
        lines = []
        while (line := resp.readline()) and line.strip() != b"data: [DONE]":
            if line.strip():
                lines.append(line.strip())
    return lines


def test_a_connection_carries_request_after_request_over_one_tcp_connection(keepalive):
    conn = httpclient.Connection(keepalive + "/v1", 5)
    try:
        for n in (1, 3, 2):
            assert _events(conn, n=n) == [f"data: {i}".encode() for i in range(n)]
    finally:
        conn.close()
    assert KeepAliveHandler.connections == 1 and len(KeepAliveHandler.requests) == 3
    assert {auth for _, auth in KeepAliveHandler.requests} == {"Bearer " + "k" * 16}


def test_a_connection_the_server_dropped_while_idle_is_reopened_and_the_request_sent_once(keepalive):
    conn = httpclient.Connection(keepalive, 5)
    try:
        assert _events(conn, n=1, drop_idle=True) == [b"data: 0"]
        time.sleep(0.05)  # not needed for the outcome: the server has closed its end either way
        assert _events(conn, n=2) == [b"data: 0", b"data: 1"]
    finally:
        conn.close()
    assert [b["n"] for b, _ in KeepAliveHandler.requests] == [1, 2]  # each request reached it once
    assert KeepAliveHandler.connections == 2


def test_a_stream_cut_mid_answer_is_an_error_and_is_not_sent_again(keepalive):
    conn = httpclient.Connection(keepalive, 5)
    try:
        with pytest.raises(httpclient.HttpError):
            _events(conn, n=3, cut=True)
        assert _events(conn, n=1) == [b"data: 0"]  # the next request opens a new connection
    finally:
        conn.close()
    assert [b["n"] for b, _ in KeepAliveHandler.requests] == [3, 1]


def test_an_error_status_on_a_connection_raises_with_its_body(keepalive):
    conn = httpclient.Connection(keepalive, 5)
    try:
        with pytest.raises(httpclient.HttpError) as err:
            _events(conn, n=1, status=429)
        assert err.value.response.status == 429 and err.value.response.message() == "too many"
        answer = conn.request("POST", "/v1/chat/completions", json_body={"n": 1, "status": 429})
        assert answer.status == 429 and answer.said() == "HTTP 429: too many"  # the same, as a response
        assert _events(conn, n=1) == [b"data: 0"]
    finally:
        conn.close()


def test_a_connection_to_a_closed_port_raises_with_no_status():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        conn = httpclient.Connection(f"http://127.0.0.1:{s.getsockname()[1]}", 2)
        with pytest.raises(httpclient.HttpError) as err:
            _events(conn, n=1)
        answer = conn.request("POST", "/v1/chat/completions", json_body={"n": 1})
    assert err.value.response.status is None and answer.status is None and "refused" in answer.reason
