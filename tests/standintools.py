"""Stand-in engines (tests/standin) serving on 127.0.0.1 for a test, each on a port from nettools.free_port:
``Engine``, a vLLM with the given knobs (tests/test_bench.py, tests/test_batch.py), and ``standins``, vLLM or
SGLang started through their real entry points (tests/test_verify.py, tests/test_metrics.py)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from nettools import free_port

STANDIN = Path(__file__).resolve().parent / "standin"


class Engine:
    """A stand-in vLLM serving ``served`` on 127.0.0.1 with the given knobs (``env``: STANDIN_*), up once
    ``/health`` answers (it starts in well under a second; 60 s bounds a busy machine)."""

    def __init__(self, tmp_path: Path, env: dict[str, str], *extra: str, served: str = "bench-model"):
        self.port = free_port()
        full = {k: v for k, v in os.environ.items() if not k.startswith("STANDIN_")}
        full.update({"STANDIN_LOAD_SECONDS": "0", "PYTHONPATH": str(STANDIN / "pypath"), **env})
        self.log = tmp_path / f"engine-{self.port}.log"
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen([str(STANDIN / "bin" / "vllm"), "serve", "m", "--served-model-name", served,
                                          "--host", "127.0.0.1", "--port", str(self.port), *extra],
                                         env=full, stdout=out, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}/v1"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1):
                    return
            except OSError:
                time.sleep(0.05)
        raise AssertionError(f"the stand-in did not serve within 60 s:\n{self.log.read_text()}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


SERVED = "hpcagent-bench-vllm"
QWEN38 = ["--model-path", "Qwen/Qwen3.8-27B-FP8"]
OSS120B = ["openai/gpt-oss-120b"]


class StandIn:
    """One stand-in server (the real entry points), serving on 127.0.0.1:<free port>."""

    def __init__(self, tmp_path: Path, kind: str, args: list[str], env: dict | None = None):
        self.port = free_port()
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("STANDIN_")}
        full_env.update({"STANDIN_LOAD_SECONDS": "0.1", "PYTHONPATH": str(STANDIN / "pypath"), **(env or {})})
        common = ["--served-model-name", SERVED, "--host", "127.0.0.1", "--port", str(self.port)]
        if kind == "vllm":
            cmd = [str(STANDIN / "bin" / "vllm"), "serve", *args, *common]
        else:
            cmd = [sys.executable, "-m", "sglang.launch_server", *args, *common]
        self.log = open(tmp_path / f"{kind}-{self.port}.log", "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=full_env, cwd=tmp_path)
        self.url = f"http://127.0.0.1:{self.port}/v1"
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:  # /health: 200 once ready, on both engines, key or not
            assert self.proc.poll() is None, (tmp_path / f"{kind}-{self.port}.log").read_text()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"stand-in {cmd} did not serve within 15 s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.close()


@contextlib.contextmanager
def standins(tmp_path: Path):
    """``start(kind, args, env)`` -> a serving StandIn; all are stopped on exit."""
    started: list[StandIn] = []

    def start(kind: str, args: list[str], env: dict | None = None) -> StandIn:
        s = StandIn(tmp_path, kind, args, env)
        started.append(s)
        return s

    try:
        yield start
    finally:
        for s in started:
            s.stop()
