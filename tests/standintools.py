"""A stand-in vLLM (tests/standin) serving on 127.0.0.1 for a test, on a port from nettools.free_port: shared by
the tests that talk to one over real HTTP (tests/test_bench.py, tests/test_batch.py)."""

from __future__ import annotations

import os
import subprocess
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
