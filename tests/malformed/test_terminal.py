"""What a remote end sends never drives the operator's terminal: a hostile endpoint's /metrics body, model
name and error messages (verify), a rank's log line (diagnose) and another user's accounting.json (report)
carry an OSC window-title sequence, a screen clear, C1 controls, NUL and newlines that would print a line of
their own; the real command line prints none of them, in its report and in its one-line errors."""

from __future__ import annotations

import json
import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from malformed_tools import assert_clean_error, run_cli

HOSTILE = "\x1b]0;owned-title\x07\x00\x1b[2J\x9b31m\r\nPASS  metrics  forged line\u202e"
# what a terminal would act on: C0 controls but the newline, DEL, C1, the bidi overrides
ACTS_ON = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


class Hostile(BaseHTTPRequestHandler):
    models_status = 200

    def log_message(self, *args):
        pass

    def _send(self, status: int, body: bytes, kind: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/metrics":
            self._send(200, ("not prometheus " + HOSTILE).encode("utf-8"), "text/plain")
        elif self.path == "/v1/models" and self.models_status == 200:
            self._send(200, json.dumps({"data": [{"id": "model" + HOSTILE, "root": "root" + HOSTILE,
                                                  "owned_by": "vllm"}]}).encode())
        else:
            self._send(self.models_status, json.dumps({"error": {"message": "boom" + HOSTILE}}).encode())

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._send(400, json.dumps({"error": {"message": "no tool parser" + HOSTILE}}).encode())


@pytest.fixture
def endpoint():
    """A hostile endpoint on 127.0.0.1, listening before the test starts (no wait on a clock)."""
    handler = type("H", (Hostile,), {})
    server = HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1", handler
    server.shutdown()
    server.server_close()


def _clean(text: str) -> None:
    assert not ACTS_ON.search(text), repr(ACTS_ON.search(text).group())
    assert "owned-title" not in text  # the OSC sequence is removed whole, not left as text
    assert "\nPASS  metrics  forged line" not in text  # the endpoint cannot print a line of its own


def test_verify_prints_a_hostile_endpoints_answers_without_a_control_character(endpoint):
    url, _ = endpoint
    proc = run_cli("verify", url, "--check", "metrics", "--check", "tools", "--timeout-s", "20", timeout_s=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    _clean(proc.stdout + proc.stderr)
    assert "FAIL  metrics" in proc.stdout and "/metrics answered 200 but not Prometheus text" in proc.stdout
    assert "evidence: not prometheus" in proc.stdout and "model name model" in proc.stdout
    assert "no tool parser" in proc.stdout
    data = json.loads(run_cli("verify", url, "--check", "metrics", "--json", "--timeout-s", "20", timeout_s=60).stdout)
    assert data["target"]["served_model_name"] == "model" + HOSTILE  # as data, the JSON keeps it (escaped)


def test_verify_errors_quoting_the_endpoint_are_clean_one_liners(endpoint):
    url, handler = endpoint
    handler.models_status = 500
    proc = run_cli("verify", url, "--check", "metrics", "--timeout-s", "20", timeout_s=60)
    assert_clean_error(proc, "HTTP 500 from", "boom")
    assert len(proc.stderr.strip().splitlines()) == 1
    _clean(proc.stderr)


def test_diagnose_quotes_a_hostile_log_line_without_a_control_character(tmp_path: Path):
    rules = tmp_path / "rules.yaml"
    rules.write_text("rules:\n  - id: x\n    title: X\n    cause: c\n    fix: f\n    see: docs/diagnose.md\n"
                     "    status: open\n    signature: ['boom']\n")
    log = tmp_path / "server-0.log"
    log.write_bytes(("INFO fine\nboom " + HOSTILE + "\n").encode("utf-8"))
    proc = run_cli("diagnose", "--rules", str(rules), str(log), cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    _clean(proc.stdout)
    assert f"evidence: {log}:2: boom" in proc.stdout


def test_report_prints_another_users_record_without_a_control_character(tmp_path: Path):
    d = tmp_path / "77"
    d.mkdir()
    (d / "accounting.json").write_text(json.dumps({"job_id": "77", "gpus": 8, "nodes": 1, "served": "m" + HOSTILE,
                                                   "shape": "single" + HOSTILE, "job_start": 1000.0,
                                                   "ended_at": 4600.0}))
    bad = tmp_path / ("88" + HOSTILE.replace("/", "").replace("\x00", ""))
    bad.mkdir()
    (bad / "accounting.json").write_text("[1,2,3]")
    proc = run_cli("report", "--no-sacct", "--since", "36500d", "--run-root", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    _clean(proc.stdout)
    assert "1 job run(s)" in proc.stdout and "skipped " in proc.stdout
