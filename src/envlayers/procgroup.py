"""Stopping a process started in a session of its own (``start_new_session=True``): a signal to its whole
process group, SIGKILL to the group after a grace period, the leader reaped.

The one place the package stops a process group. It sits with the edges, below ``launch/`` and the
operator packages alike, because it acts on the machine (it signals and reaps processes) and both sides
start process groups. The two scripts the job runs with the standard library only (``gateway_app.py``,
``launch/raynode.py``) cannot import it and keep their own stoppers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Iterable

REAP_S = 5.0  # after SIGKILL, how long the leader is waited for


def signal_group(proc: subprocess.Popen, sig: int) -> bool:
    """Send ``sig`` to ``proc``'s process group (``proc`` leads it); False when the group is gone."""
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        return False
    return True


def stop_group(proc: subprocess.Popen, sig: int = signal.SIGTERM, grace_s: float = 8.0, *,
               already_sent: bool = False) -> int | None:
    """Stop ``proc``'s process group: ``sig`` to it (unless ``already_sent``), SIGKILL after ``grace_s`` when
    the leader has not ended; the leader's exit code (``None`` when its group was gone before it could be
    reaped)."""
    if proc.poll() is not None:
        return proc.returncode
    try:
        if not already_sent:
            os.killpg(proc.pid, sig)
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        signal_group(proc, signal.SIGKILL)
        proc.wait(REAP_S)
    except ProcessLookupError:
        pass
    return proc.returncode


def stop_groups(procs: Iterable[subprocess.Popen], sig: int = signal.SIGTERM, grace_s: float = 8.0) -> None:
    """Stop several process groups at once: ``sig`` to every running one, then one shared grace of
    ``grace_s`` before each that is left gets SIGKILL."""
    procs = list(procs)
    for proc in procs:
        if proc.poll() is None:
            signal_group(proc, sig)
    deadline = time.monotonic() + grace_s
    for proc in procs:
        stop_group(proc, signal.SIGKILL, max(0.1, deadline - time.monotonic()), already_sent=True)
