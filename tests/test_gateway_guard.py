"""A gateway replica's server dies with the replica's actor, shown with real processes.

A stand-in actor (a Python process) starts a server exactly as a gateway replica does
(``gateway_app.start_guarded``: the server in a process group of its own, a guard outside the actor's
process tree), then is SIGKILLed the way Ray or Serve force-kills an actor. The server's whole group must
be gone within a bound, with SIGKILL where it ignores SIGTERM. The lab test
(tests/slurm/test_ray_e2e.py) does the same to a real Serve replica actor.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envlayers.gateway_app import GUARD, SERVER_GRACE_S

SRC = Path(__file__).resolve().parents[1] / "src"
ACTOR = """
import json, os, sys, time
sys.path.insert(0, {src!r})
from envlayers.gateway_app import start_guarded, stop_group
proc, guard = start_guarded(sys.argv[2:], dict(os.environ))
print(json.dumps({{"actor": os.getpid(), "server": proc.pid}}), flush=True)
if sys.argv[1] == "stop":  # the actor's own shutdown path (Serve's graceful stop calls it)
    sys.stdin.readline()
    stop_group(proc, {grace!r})
    print("stopped", flush=True)
sys.stdin.readline()  # until the test says so, or kills this process
"""
# a server with a child in its process group; "stubborn" ignores SIGTERM (both of them: an ignored signal
# stays ignored across fork and exec)
SERVER = {"polite": ["bash", "-c", "sleep 600 & wait"],
          "stubborn": ["bash", "-c", "trap '' TERM; sleep 600 & wait"]}


def group(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group ``pgid``."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
            out.append(int(entry))
    return out


def guards_of(actor: int) -> list[int]:
    """The guard processes started for ``actor`` (their command line is GUARD, ending in its PID)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if GUARD.encode() in argv and argv[-2:] == [str(actor).encode(), b""]:
            out.append(int(entry))
    return out


def until(what, bound_s: float):
    """Poll ``what()`` until it is truthy (returned), at most ``bound_s`` seconds (then the last value)."""
    deadline = time.monotonic() + bound_s
    while True:
        value = what()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.1)


@pytest.fixture
def actor(tmp_path):
    started = []

    def start(mode: str, server: str):
        proc = subprocess.Popen([sys.executable, "-c", ACTOR.format(src=str(SRC), grace=SERVER_GRACE_S), mode,
                                 *SERVER[server]], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        started.append(proc)
        pids = json.loads(proc.stdout.readline())
        started.append(pids["server"])
        # the server and its child are up (the child makes the group more than its leader)
        assert until(lambda: len(group(pids["server"])) == 2, 60), group(pids["server"])
        return proc, pids

    yield start
    for item in started:  # whatever a failed test left: by PID and by the server's own group
        try:
            if isinstance(item, int):
                os.killpg(item, signal.SIGKILL)
            else:
                item.kill()
                item.wait()
        except ProcessLookupError:
            pass


@pytest.mark.parametrize("server, how", [("polite", "(SIGTERM)"),
                                         ("stubborn", f"(SIGTERM, then SIGKILL after {SERVER_GRACE_S:.0f}s)")])
def test_a_killed_actors_server_group_is_stopped_by_its_guard(actor, server, how):
    proc, pids = actor("wait", server)
    (guard,) = guards_of(pids["actor"])
    stat = Path(f"/proc/{guard}/stat").read_text()
    assert int(stat[stat.rfind(")") + 2:].split()[1]) != pids["actor"]  # not the actor's child: Ray kills those
    assert group(pids["server"])
    os.kill(pids["actor"], signal.SIGKILL)  # as Ray force-kills an actor: no code of the actor runs
    proc.wait()
    assert until(lambda: not group(pids["server"]), SERVER_GRACE_S + 30), group(pids["server"])
    err = proc.stderr.read()  # EOF once the guard, the last holder of the actor's stderr, ended
    assert (f"gateway guard: the replica's actor (pid {pids['actor']}) ended with its vllm serve "
            f"(pid {pids['server']}) still running; stopped its process group {how}") in err, err
    assert not guards_of(pids["actor"])


@pytest.mark.parametrize("server", ["polite", "stubborn"])
def test_the_actors_own_stop_ends_the_server_group_and_the_guard_then_leaves_quietly(actor, server):
    proc, pids = actor("stop", server)
    t0 = time.monotonic()
    proc.stdin.write("stop\n")
    proc.stdin.flush()
    assert proc.stdout.readline() == "stopped\n"
    took = time.monotonic() - t0
    assert not group(pids["server"])  # stop_group returns once the group is empty
    if server == "stubborn":
        assert took >= SERVER_GRACE_S  # it needed the SIGKILL
    proc.stdin.write("end\n")
    proc.stdin.flush()
    assert proc.wait(timeout=60) == 0
    err = proc.stderr.read()  # the guard saw an empty group: nothing to stop, nothing said
    assert "gateway guard" not in err, err
    assert not guards_of(pids["actor"])
