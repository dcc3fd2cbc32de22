"""``tunnel.json`` read as the truth of now: a recorded tunnel (rundir.TunnelRecord) settled against Slurm and
the processes of this host.

The record says what was last known when something wrote it; a tunnel ends with its job (walltime,
``scancel``), when its step gives up, or when the process that was opening it dies, and nothing may
be there to write that down. So every reader takes the record through :func:`settle` first: an
``open`` (or ``opening``) record whose job has ended, whose step no longer runs, or whose opener died
before recording it, is turned into a ``closed`` one with when (``closed_at``) and why
(``closed_why``, ``closed_by``) and written back (atomically). A reader never reports a tunnel open
that is not.

Record states: ``opening`` (a chain follower is opening it: the intent, written before the step
starts), ``open``, ``handed-over`` (its port moved to a successor's tunnel), ``closed``.

A recorded process (a step's srun, the chain follower) is signalled only while it still runs the
recorded command line (:func:`stop_recorded`), never a program that got its PID since. That is not
``procgroup``'s stopping: a recorded process was mostly started by an earlier command, so it is not this
process's child (it cannot be waited for or reaped, and its PID may be another program's by now), and it is
signalled alone (srun ends its step itself).
"""

from __future__ import annotations

import os
import signal
import socket
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

from .. import joblines
from ..durations import format_utc
from ..rundir import TunnelRecord, write_tunnel
from ..tail import Tail

LIVE_STATES = ("open", "opening")
LOG_END = 8192  # how much of the end of tunnel.log is read for the step's last words
# the words that begin the opener's and the follower's own lines in tunnel.log (the step's are the others)
OPENER_WORDS, FOLLOWER_WORDS = "starting at", "chain:"


def now_iso() -> str:
    """Now as the tunnel's records stamp it (``format_utc``)."""
    return format_utc(time.time())


def cmdline(pid: int) -> list[str] | None:
    """The argv of a running (not zombie) process, ``None`` when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return None
    if state == "Z" or not raw:
        return None
    return raw.rstrip(b"\0").decode(errors="replace").split("\0")


def stop_recorded(pid: int, argv: list[str] | None, signals=(signal.SIGTERM, signal.SIGKILL),
                 wait_s: float = 10.0) -> bool | None:
    """Signal ``pid`` while it runs the recorded ``argv`` (never a program that got the PID since): each of
    ``signals`` in turn, ``wait_s`` apart. True once it no longer runs it, False while it still does, None
    when it did not run it to begin with (left alone)."""
    if not pid or not argv or cmdline(pid) != argv:
        return None
    for sig in signals:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return True
        deadline = time.monotonic() + wait_s
        while cmdline(pid) == argv:
            if time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        else:
            return True
    return False


def is_recorded_process(record: TunnelRecord) -> bool | None:
    """True: the recorded srun PID still runs the recorded command. False: it does not (gone or
    reused). None: the tunnel was opened on another host, so its PID means nothing here."""
    if record.host and record.host != socket.gethostname():
        return None
    pid = record.srun_pid
    return bool(pid) and cmdline(int(pid)) == record.srun_argv


def follower_alive(record: TunnelRecord) -> bool | None:
    """Whether the chain follower recorded in ``record`` still runs (None: on another host, or none)."""
    follower = record.follower or {}
    if not follower.get("pid") or follower.get("host") != socket.gethostname():
        return None
    return cmdline(int(follower["pid"])) == follower.get("argv")


def _log_time(record: TunnelRecord) -> str:
    """When the tunnel's log last moved (its step's last line came then, at the latest)."""
    try:
        stamp = os.stat(record.log).st_mtime
    except (TypeError, OSError):
        return now_iso()
    return format_utc(stamp)


def _log_end(record: TunnelRecord) -> str:
    """The last :data:`LOG_END` bytes of tunnel.log (the step's last lines); ``""`` when it cannot be read."""
    try:
        return Tail(record.log, max_first_read=LOG_END).read()
    except TypeError:  # no log recorded
        return ""


def _last_step_line(record: TunnelRecord) -> str | None:
    """The step's last own line in tunnel.log (e.g. ``ssh exited with code 255 after 41s; giving up ...``)."""
    prefix = joblines.TUNNEL.prefix
    for line in reversed(_log_end(record).splitlines()):
        if line.startswith(prefix) and FOLLOWER_WORDS not in line and OPENER_WORDS not in line:
            return "".join(c if c.isprintable() else "?" for c in line[len(prefix):])
    return None


def _slurm_cancelled(record: TunnelRecord) -> str | None:
    """slurmstepd's "CANCELLED AT" line at the end of tunnel.log, if Slurm ended the step."""
    from ..slurm import slurm_cancelled

    said = slurm_cancelled(_log_end(record))
    return "".join(c if c.isprintable() else "?" for c in said) if said else None


def _step_listed(step_id: str) -> bool | None:
    """Whether Slurm still lists the step (None: Slurm did not answer)."""
    from .. import slurm

    return slurm.step_listed(step_id)


def closed_by_end(record: TunnelRecord, info, *,
                  step_listed: Callable[[str], bool | None] = _step_listed) -> TunnelRecord | None:
    """``record`` (an ``open`` or ``opening`` one) closed because its tunnel has ended, given the job's
    Slurm record ``info``; ``None`` while it may still run."""
    if record.state not in LIVE_STATES:
        return None
    job = str(record.job_id or "")
    mine = is_recorded_process(record)
    # a COMPLETING job has ended: its steps are being ended with it
    if (info is None or info.finished or info.state == "COMPLETING") and mine is not True:
        # (its srun still running here: not yet ended)
        state = info.state if info is not None else None
        return replace(record, state="closed",
                       closed_at=(info.end_time if info is not None and info.end_time else None) or _log_time(record),
                       closed_by="job end",
                       closed_why=f"job {job} ended ({state}); its tunnel step ended with it" if state
                       else f"job {job} is no longer known to Slurm; its tunnel step ended with it")
    if record.state == "opening":
        if mine is None or follower_alive(record) is not False:
            return None  # its opener still runs (or runs elsewhere): it is being opened
        if mine:  # the step waits for the word that it is recorded; its opener is gone: end it now
            try:
                os.kill(int(record.srun_pid), signal.SIGTERM)
            except (OSError, ValueError):
                pass
        return replace(record, state="closed", closed_at=_log_time(record), closed_by="opener end",
                       closed_why="the chain follower that was opening it ended before it was recorded; the step "
                                  "ends by itself then (it waits for the word that it is recorded)")
    if mine is None:  # opened on another host: ask Slurm whether its step still runs
        step = record.step_id
        if not step or step_listed(str(step)) is not False:
            return None
    elif mine:
        return None
    cancelled = _slurm_cancelled(record)
    if cancelled:  # Slurm ended the step (a time limit, scancel): ssh's last words are not why
        return replace(record, state="closed", closed_at=_log_time(record), closed_by="step end",
                       closed_why=f"Slurm ended its step, not ssh (Slurm said: {cancelled})")
    said = _last_step_line(record)
    return replace(record, state="closed", closed_at=_log_time(record), closed_by="step end",
                   closed_why=f"its step ended while job {job} runs" + (f" ({said})" if said else ""))


def settle(record: TunnelRecord | None, run_dir: Path | None, info, *, write: bool = True) -> TunnelRecord | None:
    """``record`` as the truth of now (see the module's docstring); written back when it changed."""
    if record is None:
        return None
    closed = closed_by_end(record, info)
    if closed is None:
        return record
    if write and run_dir is not None:
        try:
            write_tunnel(run_dir, closed)
        except OSError:
            pass  # a reader that cannot write still says the truth
    return closed
