"""Helpers of the malformed-input corpus (see conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
            input: str | None = None, timeout_s: float = 30.0) -> subprocess.CompletedProcess:
    """``python -m envlayers ARGS`` with this interpreter, bounded in time."""
    full_env = {**os.environ, **(env or {})}
    full_env.pop("ENVLAYERS_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "envlayers", *args], cwd=cwd, env=full_env, input=input,
                          capture_output=True, text=True, timeout=timeout_s)


def assert_clean_error(proc: subprocess.CompletedProcess, *needles: str, code: int = 2) -> None:
    """A clear error: exit ``code``, no traceback, no internal error, each needle in stderr, and the
    error is short (a hostile input must never make the tool print or allocate without bound)."""
    err = proc.stderr
    assert proc.returncode == code, f"exit {proc.returncode}, expected {code}\nstdout: {proc.stdout[:2000]}\nstderr: {err[:2000]}"
    assert "Traceback" not in err and "Traceback" not in proc.stdout, err[:4000]
    assert "internal error" not in err, err[:2000]
    assert len(err) < 4096, f"error output is {len(err)} bytes"
    for needle in needles:
        assert needle in err, f"{needle!r} not in stderr: {err[:2000]}"
