"""readiness.models, the one asking of ``/v1/models`` (the launcher's probe, status, stop, ping, bench, verify),
against a real local HTTP server: the name listed, something else served instead, refusals, no model list,
and nothing answering."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time

import pytest

from envlayers import readiness
from timing import LATE_S  # how late a busy machine may run an event

# what each server root answers on /v1/models: (status, body)
LISTS = {
    "/a": (200, {"object": "list", "data": [{"id": "tiny", "root": "org/tiny", "owned_by": "vllm"},
                                            {"id": "other", "root": "org/other"}]}),
    "/empty": (200, {"object": "list", "data": []}),
    "/nodata": (200, {"object": "list"}),
    "/strings": (200, {"data": ["tiny"]}),
    "/notjson": (200, b"<html>hello</html>"),
    "/null": (200, b"null"),
    "/key": (401, {"error": {"message": "Unauthorized"}}),
}


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        root = self.path[: -len("/v1/models")]
        if root == "/trickle":
            self.send_response(200)
            self.send_header("Content-Length", "100000")
            self.end_headers()
            try:  # a byte every 0.1 s until the client hangs up (a minute at most): never a complete body
                for _ in range(600):
                    self.wfile.write(b" ")
                    self.wfile.flush()
                    time.sleep(0.1)
            except (BrokenPipeError, ConnectionResetError):
                pass
            return
        status, body = LISTS[root]
        body = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_port}"
    srv.shutdown()
    srv.server_close()


def test_the_name_listed_is_served_with_its_card(server):
    listing = readiness.models(server + "/a/v1", "other")
    assert listing.serves and listing.detail == "ok" and listing.ids == ["tiny", "other"]
    assert listing.card == {"id": "other", "root": "org/other"} and listing.answer.status == 200
    assert listing.answer.url == server + "/a/v1/models"


def test_a_name_not_listed_says_what_is_served_instead(server):
    listing = readiness.models(server + "/a/v1/", "big")
    assert not listing.serves and listing.card is None
    assert listing.detail == "serves ['tiny', 'other'], not 'big'"


def test_no_name_takes_the_first_listed(server):
    listing = readiness.models(server + "/a/v1", None)
    assert listing.serves and listing.name == "tiny" and listing.card["owned_by"] == "vllm"


@pytest.mark.parametrize("root, detail", [
    pytest.param("/empty", "serves [], not 'tiny'", id="empty-list"),
    pytest.param("/nodata", "serves [], not 'tiny'", id="no-data-key"),
    pytest.param("/strings", "the answer is not an OpenAI model list", id="cards-not-objects"),
    pytest.param("/null", "the answer is not an OpenAI model list", id="json-null"),
    pytest.param("/notjson", "the answer is not JSON", id="not-json"),
    pytest.param("/key", "HTTP 401", id="refused"),
])
def test_what_is_no_listing_of_the_name_says_why(server, root, detail):
    listing = readiness.models(server + root + "/v1", "tiny")
    assert not listing.serves and listing.detail == detail
    probe = readiness.probe(server + root + "/v1", "tiny")  # the launcher's and status's probe says the same
    assert (probe.ok, probe.status, probe.detail) == (False, listing.answer.status, detail)


def test_a_refusal_keeps_its_error_body_for_the_commands_that_show_it(server):
    answer = readiness.models(server + "/key/v1", "tiny").answer
    assert answer.message() == "Unauthorized" and answer.said() == "HTTP 401: Unauthorized"


def test_nothing_answering_is_no_answer_with_the_reason():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        listing = readiness.models(f"http://127.0.0.1:{s.getsockname()[1]}/v1", "tiny")
    assert listing.answer.status is None and not listing.serves and listing.cards is None
    assert listing.detail.startswith("no answer: ") and "refused" in listing.detail


def test_with_slack_a_server_that_trickles_is_cut_off_by_the_wall_clock(server):
    t0 = time.monotonic()
    listing = readiness.models(server + "/trickle/v1", "tiny", timeout_s=0.5, slack_s=0.2)
    assert listing.answer.incomplete and listing.detail == "no answer: no complete reply within 0.5s"
    assert time.monotonic() - t0 < 0.7 + LATE_S  # it trickles for ever, each byte within the socket timeout
