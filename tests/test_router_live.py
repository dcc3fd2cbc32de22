"""The real router binary (smg, the `router` extra) on loopback in front of two stand-in servers, started as
the launcher starts it (launch/router.py with its real process and HTTP): readiness, the key, cache-aware
routing, its counters, its stop. Skipped where smg is not installed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from extratools import needs_extra
from nettools import free_port

needs_extra("smg", "router")

from envlayers.launch.router import Router  # noqa: E402

STANDIN = Path(__file__).resolve().parent / "standin"
KEY = "test-key-" + "x" * 16


def served(port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return sum(float(line.rsplit(None, 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:request_success_total"))


def chat(base: str, text: str, key: str = KEY) -> int:
    body = json.dumps({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": text}]}).encode()
    req = urllib.request.Request(f"{base}/chat/completions", body, {"Content-Type": "application/json",
                                                                   "Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code


@pytest.fixture
def servers(tmp_path):
    ports, procs = [free_port(), free_port()], []
    env = {**os.environ, "STANDIN_LOAD_SECONDS": "0.2", "VLLM_API_KEY": KEY}
    for port in ports:
        procs.append(subprocess.Popen([str(STANDIN / "bin" / "vllm"), "serve", "m", "--host", "127.0.0.1", "--port",
                                       str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                      start_new_session=True))
    deadline = time.monotonic() + 30
    for port in ports:
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
    yield ports
    for p in procs:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(10)


def test_the_real_router_routes_a_repeated_prefix_to_one_replica_and_checks_the_key(servers, tmp_path):
    said = []
    router = Router({"ROUTER": "smg", "SERVER_HOST": "127.0.0.1", "ROUTER_PORT": str(free_port())}, "replicas",
                    servers[0], [f"http://127.0.0.1:{p}/v1" for p in servers], tmp_path, KEY, said.append,
                    url_host="127.0.0.1")
    try:
        router.start()
        assert said[-1].startswith(f"ENVLAYERS-STAGE: router live at {router.url} in front of 2 replica(s) "
                                   "(policy cache_aware")
        assert KEY.encode() not in Path(f"/proc/{router.proc.pid}/cmdline").read_bytes()
        assert chat(router.url, "hi", key="wrong-key-123") == 401 and chat(router.url, "hi", key="") == 401
        before = [served(p) for p in servers]
        prefix = "You are a careful assistant. " * 40
        for i in range(6):
            assert chat(router.url, prefix + f"question {i}") == 200
        got = [served(p) - b for p, b in zip(servers, before)]
        assert sorted(got) == [0, 6], got  # every request with the shared prefix went to one replica
        deadline = time.monotonic() + 10
        while (router.counters() is None or router.counters().finished < 6) and time.monotonic() < deadline:
            time.sleep(0.2)
        counters = router.counters()
        assert counters.finished == 6 and counters.in_flight == 0  # each once; the two refused keys not at all
        router.tick()
    finally:
        router.stop()
    assert router.proc.poll() is not None


def call(root: str, method: str, path: str, body=None, key: str | None = None) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    req = urllib.request.Request(root + path, None if body is None else json.dumps(body).encode(), headers,
                                 method=method)
    try:
        with urllib.request.urlopen(req, timeout=20) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


COMPLETION = {"model": "m", "prompt": "Hi", "max_tokens": 1}


def test_what_the_real_router_answers_without_the_key(servers, tmp_path):
    # vLLM checks its key only under /v1, /v2, /inference and /cohere, so /invocations generates without it
    # (tests/test_real_vllm_auth.py). Measured here: what smg does on those paths with the key set
    # (docs/access.md, "What the key guards"); a new smg that changes it fails this test
    router = Router({"ROUTER": "smg", "SERVER_HOST": "127.0.0.1", "ROUTER_PORT": str(free_port())}, "replicas",
                    servers[0], [f"http://127.0.0.1:{p}/v1" for p in servers], tmp_path, KEY, lambda line: None,
                    url_host="127.0.0.1")
    try:
        router.start()
        root = router.url.rsplit("/v1", 1)[0]
        # generation and the router's own controls want the key
        for method, path, body in [("POST", "/v1/completions", COMPLETION), ("POST", "/generate", {"text": "Hi"}),
                                   ("POST", "/v1/rerank", {"query": "a", "documents": ["b"]}),
                                   ("POST", "/rerank", {"query": "a", "documents": ["b"]}),
                                   ("GET", "/workers", None), ("POST", "/flush_cache", None)]:
            status, text = call(root, method, path, body)
            assert status == 401 and b"Missing API key" in text, (path, status, text)
        assert call(root, "POST", "/v1/completions", COMPLETION, KEY)[0] == 200
        # vLLM's unguarded routes are no routes of the router's: it refuses them itself (its own unknown_url,
        # not the server's 404) and forwards nothing, with the key or without
        for method, path, body in [("POST", "/invocations", COMPLETION), ("POST", "/tokenize", {"prompt": "Hi"}),
                                   ("POST", "/detokenize", {"tokens": [1]}), ("GET", "/metrics", None),
                                   ("GET", "/load", None), ("GET", "/version", None),
                                   ("POST", "/pooling", {"input": "Hi"}), ("POST", "/score", {"text_1": "a"})]:
            for key in (None, KEY):
                status, text = call(root, method, path, body, key)
                assert status == 404 and b'"unknown_url"' in text, (path, key, status, text)
        # answered without the key: the served name and the router's health
        status, text = call(root, "GET", "/v1/models")
        assert status == 200 and b'"m"' in text
        assert call(root, "GET", "/health")[0] == 200
    finally:
        router.stop()
