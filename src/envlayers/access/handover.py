"""A tunnel that follows a chain of successors: the gateway port stays where the client has it.

``env_layers tunnel`` of a job whose successor is still to come (``chain.json`` names a successor, or
successors are left) opens the tunnel with ssh as a control master and starts a follower, a small
process on this host (``python -m envlayers.access.handover RUN_DIR``, its PID recorded in
``tunnel.json`` under ``follower``). When the successor's endpoint is live (its ``endpoint.json``,
and Slurm says it runs), the follower

1. starts a tunnel step in the successor job on its API node that connects to the same gateway,
   with no forward yet, and says when it is connected;
2. then cancels the old forward (a step in the old job: ``ssh -O cancel``); connections already
   forwarded go on to the old server, which still drains;
3. then says ``go`` to the successor's step, which asks for the gateway port once: it now leads to
   the successor. The old record says ``handed-over``, the new one ``took_over_from``.

The follower dies half way safely: the successor's ``tunnel.json`` says ``opening`` before its step
starts, and that step waits on its stdin (carried by srun from the follower) for the word that both
records are written (``TunnelResult.commit``); the follower's end before that, even by SIGKILL,
ends the step (access.tunnel), and readers settle the record to ``closed`` (access.tunnelrecord).

The port is closed only from the cancel to the successor's ask (the cancel step's end and the word
relayed by srun, and one round trip to the gateway; a client connecting then is refused and may retry). If the old job
ended first (its tunnel ended with it), the successor's tunnel takes the free port as soon as it is
connected. The follower ends when the chain does (a job ended with no successor), when the tunnel
is released, or on SIGTERM (``release`` sends it, checked against the recorded command line).
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

from .. import joblines
from ..durations import format_time
from ..rundir import TUNNEL_LOG, ChainRecord, TunnelRecord, chain_of, read_tunnel, serving_endpoint, write_tunnel
from .gateway import Gateway
from .job import JobAccess
from .tunnelrecord import FOLLOWER_WORDS, stop_recorded

POLL_S = 0.25  # how often the follower looks at the chain's files
SLURM_EVERY_S = 5.0  # how often it asks Slurm whether the current link still runs


def follows(acc: JobAccess) -> bool:
    """Whether ``acc``'s job hands over to a successor still to come (so its tunnel must follow)."""
    chain = chain_of(acc.run_dir)
    return chain is not None and bool(chain.successor or chain.left)


def start_follower(acc: JobAccess, record: TunnelRecord) -> dict:
    """Start the follower for the tunnel just opened; record it in ``record`` and tunnel.json; return its
    ``follower`` entry."""
    from .tunnel import _clean_env

    run_dir = acc.run_dir
    argv = [sys.executable, "-m", "envlayers.access.handover", str(run_dir)]
    with open(run_dir / TUNNEL_LOG, "a", encoding="utf-8") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, env=_clean_env(), cwd=str(run_dir))
    follower = {"pid": proc.pid, "argv": argv, "host": socket.gethostname()}
    record.follower = follower
    write_tunnel(run_dir, record)
    return follower


def stop_follower(record: TunnelRecord | None) -> str | None:
    """SIGTERM the recorded follower if it still runs the recorded command here; what was done, in words."""
    follower = (record.follower if record is not None else None) or {}
    pid = int(follower.get("pid") or 0)
    if follower.get("host") != socket.gethostname():
        return None
    if stop_recorded(pid, follower.get("argv"), (signal.SIGTERM,)) is None:
        return None
    return f"chain follower pid {pid} stopped"


def _say_to(run_dir: Path) -> Callable[[str], None]:
    def say(line: str) -> None:
        stamp = format_time(time.time())
        try:
            with open(run_dir / TUNNEL_LOG, "a", encoding="utf-8") as fh:
                fh.write(joblines.TUNNEL.line(f"{FOLLOWER_WORDS} {stamp} {line}") + "\n")
        except OSError:
            pass
    return say


def hand_over(cur_dir: Path, record: TunnelRecord, succ: str, succ_dir: Path) -> TunnelRecord:
    """Move the gateway port from ``record``'s tunnel to a new one in job ``succ``; returns the new record.
    Raises ``EnvLayersError`` / ``TunnelFailed`` when the successor's tunnel does not come up."""
    from .. import slurm
    from .job import open_job
    from .tunnel import TunnelSpec, _clean_env, _now, api_target, open_tunnel

    say_old, say_new = _say_to(cur_dir), _say_to(succ_dir)
    acc = open_job(succ, run_dir=str(succ_dir))
    node, port = api_target(acc, int(record.replica or 0))
    gateway = Gateway.from_dict(record.gateway)
    bind, rport = record.remote_bind, int(record.remote_port)
    spec = TunnelSpec(succ, node, port, gateway, bind, rport, bool(record.keep_alive),
                      int(record.restarts or 5), control=True, takeover=True)
    old = TunnelSpec(str(record.job_id), record.node, int(record.local_port), gateway, bind, rport)
    times: dict[str, float] = {}

    def cancel_old() -> None:
        step = record.step_id
        if step:
            proc = slurm.run(old.cancel_argv(step), timeout_s=60, env=_clean_env())
            said = (proc.stderr or proc.stdout).strip().splitlines()
            say_old(f"forward {bind}:{rport} cancelled for the handover to job {succ} (exit {proc.returncode}"
                    + (f": {said[-1]}" if said and proc.returncode else "") + ")")
        times["cancelled"] = time.time()

    say_old(f"successor job {succ} is live on {node}: opening its tunnel to take over {bind}:{rport}")
    result = open_tunnel(acc, spec, start_timeout_s=60, check_gateway=False, on_connected=cancel_old,
                         replica=record.replica or 0, took_over_from=str(record.job_id), follower=record.follower)
    up = time.time()
    new = result.record
    closed = up - times.get("cancelled", up)
    try:
        write_tunnel(cur_dir, replace(record, state="handed-over", successor=succ, handed_over_at=_now(),
                                      closed_s=round(closed, 3)))
        new.port_closed_s = round(closed, 3)  # at most: the cancel's end to the moment this host saw the ask succeed
        write_tunnel(succ_dir, new)
    except BaseException:
        from .tunnel import _stop

        _stop(new.srun_pid, new.srun_argv, new.step_id)
        raise
    result.commit()  # both records say it: from now on the new step outlives this follower
    line = (f"job {record.job_id} -> job {succ}: {bind}:{rport} on {gateway.destination} now leads to {node} "
            f"127.0.0.1:{port} (step {new.step_id}); closed for at most {closed:.2f}s")
    say_old(line)
    say_new(line)
    return new


def follow(run_dir: Path, *, job_info: Callable | None = None, poll_s: float = POLL_S) -> int:
    """Carry the tunnel of ``run_dir``'s job along its chain until the chain ends or the tunnel is released."""
    from ..errors import EnvLayersError

    if job_info is None:
        from .. import slurm

        def job_info(jid: str):  # a SlurmError (the controller did not answer) is raised: not an ended job
            return slurm.job_info(jid, run=slurm.run)

    cur = Path(run_dir)
    asked = 0.0
    while True:
        say = _say_to(cur)
        record = read_tunnel(cur)
        if record is None or record.state != "open":
            say(f"the tunnel of job {cur.name} is {record.state if record is not None else 'gone'}: the follower ends")
            return 0
        chain = chain_of(cur) or ChainRecord()
        succ = chain.successor  # a job id (digits), never a path
        sdir = cur.parent / succ if succ else None
        try:
            if sdir is not None and serving_endpoint(sdir) is not None:
                info = job_info(succ)
                if info is not None and info.running and info.state != "COMPLETING":
                    try:
                        hand_over(cur, record, succ, sdir)
                    except (EnvLayersError, OSError, subprocess.SubprocessError) as err:
                        say(f"ERROR: the tunnel could not follow to job {succ}: {err}")
                        return 1
                    cur = sdir
                    continue
            if time.monotonic() - asked >= SLURM_EVERY_S:
                asked = time.monotonic()
                ended = _chain_ended(cur, record, chain, succ, job_info)
                if ended is not None:
                    _record_end(cur, ended[1])
                    say(ended[1])
                    return ended[0]
        except EnvLayersError as err:  # Slurm did not answer this time: ask again
            say(f"Slurm did not answer ({err.message}); asking again")
            time.sleep(SLURM_EVERY_S)
        time.sleep(poll_s)


def _record_end(run_dir: Path, why: str) -> None:
    """The chain ended: the current link's tunnel ended with its job; its record says so."""
    from .tunnel import _now

    record = read_tunnel(run_dir)
    if record is not None and record.state == "open":
        closed_why = why.replace(": the follower ends", "; its tunnel step ended with it")
        try:
            write_tunnel(run_dir, replace(record, state="closed", closed_at=_now(), closed_by="job end",
                                          closed_why=closed_why))
        except OSError:
            pass


def _chain_ended(cur: Path, record: TunnelRecord, chain: ChainRecord, succ: str | None,
                 job_info: Callable) -> tuple[int, str] | None:
    """(exit code, why) once the current link ended and no successor will serve; ``None`` while one may."""
    info = job_info(str(record.job_id or cur.name))
    if info is not None and not info.finished:
        return None
    if not succ and not chain.left:
        return 0, f"job {cur.name} ended, the last of its chain: the follower ends"
    later = job_info(succ) if succ else None
    if later is not None and not later.finished:
        return None
    return 1, (f"job {cur.name} ended and no successor will serve"
               + (f" (job {succ}: {later.state if later else 'unknown to Slurm'})" if succ else "") + ": the follower ends")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m envlayers.access.handover RUN_DIR", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    return follow(Path(args[0]))


if __name__ == "__main__":
    sys.exit(main())
