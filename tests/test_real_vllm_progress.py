"""The health watch's progress clock against the real vLLM: with the engine core's worker stopped (SIGSTOP)
while a request streams, vLLM's API server still answers /health 200 and /metrics (its gauges say the
request runs, its generated-token counter stands still), and the watch reports the rank as stuck after
PROGRESS_STALL_AFTER_S, where the /health clock alone would wait HEALTH_FAIL_AFTER_S (here 600 s)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.request
from pathlib import Path

import pytest

realvllm = pytest.importorskip("realvllm")

from envlayers.launch.health import (HealthSettings, HealthWatch, OwnRequests, generating_health, get_health,  # noqa: E402
                                     health_url, metrics_progress)
from envlayers.readiness import generates  # noqa: E402

pytestmark = pytest.mark.real_vllm
STALL_S = 8


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children = (task / "children").read_text().split() if (task / "children").exists() else []
        out += [int(c) for c in children]
    return out


def _worker_of(server_pid: int) -> int:
    """The engine core's worker process (``VLLM::Worker``) under this server, found down its own tree."""
    todo, seen = [server_pid], []
    while todo:
        pid = todo.pop()
        try:
            name = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
            todo += _children(pid)
        except OSError:
            continue
        seen.append((pid, name))
        if name.startswith(b"VLLM::Worker"):
            return pid
    raise AssertionError(f"no VLLM::Worker under {server_pid}: {seen}")


def _stream_long(base: str, first_token: threading.Event, finished: threading.Event) -> None:
    body = {"model": realvllm.SERVED, "prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True,
            "stream": True, "temperature": 0}
    req = urllib.request.Request(base + "/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=600) as resp:
            for line in resp:
                if line.startswith(b"data: {"):
                    first_token.set()
                elif line.startswith(b"data: [DONE]"):
                    finished.set()
    except OSError:
        pass  # the server's end cuts it


def test_a_stopped_worker_behind_a_live_api_server_is_reported_by_its_progress(tmp_path):
    with realvllm.serve(tmp_path) as server:
        worker = _worker_of(server.proc.pid)
        url = health_url(server.base_url)
        # The worker is stopped once the stream's first token arrived; on a loaded machine the tiny model may
        # have generated all 400 tokens by then. Such an attempt shows an idle engine, not a stuck request:
        # it is told apart by the stream's own end ([DONE] came) and tried again, at most three times.
        for _attempt in range(3):
            first, finished = threading.Event(), threading.Event()
            threading.Thread(target=_stream_long, args=(server.base_url, first, finished), daemon=True).start()
            assert first.wait(realvllm.LIVE_TIMEOUT_S), server.log_tail()
            os.kill(worker, signal.SIGSTOP)
            try:
                watch = HealthWatch({0: url}, HealthSettings(600, 2.0, 5.0, STALL_S),
                                    get=generating_health(generates, realvllm.SERVED, None, OwnRequests()),
                                    progress=metrics_progress("vllm", None))
                watch.start()
                end = time.monotonic() + 300
                reported = []
                while not reported and time.monotonic() < end:
                    reported = watch.tick()
                    time.sleep(0.25)
                assert reported, "the watch did not report the stopped worker"
                ((rank, what),) = reported
                assert rank == 0 and what.startswith("stopped generating after the endpoint was live: "), what
                assert f"(PROGRESS_STALL_AFTER_S={STALL_S}); the watch's last probe: " in what, what
                assert get_health(url, 10) == (True, "HTTP 200")  # what the /health clock alone would see
                if finished.is_set():
                    continue  # the stream ended before the worker stopped: only the one-token probe waited
                assert "request(s) running or waiting" in what, what  # the streaming request, as vLLM counts it
                return
            finally:
                os.kill(worker, signal.SIGCONT)
        pytest.fail("the stream ended before its worker was stopped in each of three attempts")
