"""procgroup: the one stopper of a process group (TERM, KILL after a grace, the leader reaped)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from envlayers import procgroup

# a leader with a child in its group; with "stubborn" both ignore SIGTERM
SCRIPT = """
import signal, subprocess, sys, time
if sys.argv[1] == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN) "
                          "if %r == 'stubborn' else None; print(flush=True); time.sleep(60)" % sys.argv[1]],
                         stdout=subprocess.PIPE)
child.stdout.readline()
print(child.pid, flush=True)
time.sleep(60)
"""


def _start(kind: str) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, kind], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    child = int(proc.stdout.readline())
    return proc, child


def _group_gone(pgid: int, within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_term_ends_a_group_that_listens():
    proc, _child = _start("polite")
    t0 = time.monotonic()
    code = procgroup.stop_group(proc, signal.SIGTERM, grace_s=10)
    assert code == -signal.SIGTERM and time.monotonic() - t0 < 5  # no wait for the grace
    assert _group_gone(proc.pid)


def test_kill_after_the_grace_ends_a_group_that_ignores_term():
    proc, _child = _start("stubborn")
    t0 = time.monotonic()
    code = procgroup.stop_group(proc, signal.SIGTERM, grace_s=0.5)
    assert code == -signal.SIGKILL and time.monotonic() - t0 >= 0.5
    assert _group_gone(proc.pid)  # the child of the group went with its leader


def test_an_ended_process_is_left_alone():
    proc = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    proc.wait()
    assert procgroup.stop_group(proc) == 0
    assert procgroup.signal_group(proc, 0) is False  # its group is gone: nothing signalled


def test_stop_groups_shares_one_grace():
    procs = [_start("stubborn")[0] for _ in range(2)]
    t0 = time.monotonic()
    procgroup.stop_groups(procs, signal.SIGTERM, grace_s=3)
    took = time.monotonic() - t0
    assert [p.returncode for p in procs] == [-signal.SIGKILL] * 2
    assert took < 3 * 2  # one grace for both, not one each (a grace of slack for a loaded machine)
    assert all(_group_gone(p.pid) for p in procs)
