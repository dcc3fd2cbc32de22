"""``tunnel``: a reverse SSH tunnel from the node that serves the API to a fixed loopback port on a
gateway host, run as a step of the job so that it ends when the job does.

The step is ``srun --overlap --jobid=J --nodes=1 --nodelist=<api node> bash -c SCRIPT``; the script
runs ``ssh -v -N -o ExitOnForwardFailure=yes ... -R <bind>:<port>:127.0.0.1:<api port> <gateway>``
with ssh's debug lines filtered down to the few that say whether the forward was accepted, so
``tunnel.log`` stays small however much traffic passes. With ``--keep-alive`` the script restarts
ssh when it drops (bounded restarts, doubling delays), still inside the job.

``tunnel.json`` (a rundir.TunnelRecord, written atomically; read through access.tunnelrecord, which
settles it against Slurm and the recorded process) records the exact commands, the srun PID on this host, the node's
PID and the step id; ``release`` closes the tunnel from it. Only one open tunnel per job. A refused
forward is explained by what holds the gateway port (access.gateway asks the gateway host), a
failed ssh by ssh's own error line.

For a job of a chain of successors the tunnel can be handed over (access.handover): ssh then runs as
a control master (``-M -S``, the socket in ``/tmp/envlayers-tunnel-<uid>``, a directory only this user
owns, so nobody else's file can stand in for it), so a step in the same job can cancel its forward
(``ssh -O cancel``) while connections already forwarded go on. The successor's tunnel (``takeover``)
connects first and says so; its opener cancels the earlier forward and then says ``go`` on the step's
stdin (srun carries it), and the step asks for the gateway port (``ssh -O forward``): one ask, at the
moment the port is free.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable
from urllib.parse import urlsplit

from .. import joblines, slurm
from ..errors import EnvLayersError
from ..rundir import TUNNEL, TUNNEL_LOG, TunnelRecord, write_tunnel
from ..scripttext import Code, render
from ..shell import dq_escape, word, words
from ..tail import Tail
from .gateway import Gateway, printable, check_gateway_port, find_holder_commands, find_port_holder, route_url
from .job import JobAccess
from .tunnelrecord import OPENER_WORDS, stop_recorded, is_recorded_process, now_iso as _now

STEP_NAME = "envlayers-tunnel"
RESTART_RESET_S = 60  # a connection that stayed up this long resets the restart count
MAX_DELAY_S = 60
# the API node's directory of this user's control sockets (and the marks beside them): made 0700, and refused
# when it is a link or someone else's, so that no file another user can write is taken for one of ours
PRIVATE_DIR = ('dir=/tmp/envlayers-tunnel-$(id -u); '
               '{ mkdir -p -m 700 "$dir" && [ ! -L "$dir" ] && [ -O "$dir" ] && chmod 700 "$dir"; } '
               f'|| {{ echo "{joblines.TUNNEL.line("$dir is not a directory of this user alone")}"; false; }}')
# keep ssh's non-debug lines, and of its debug lines only those that say how the forward went; a bash
# loop, not awk or sed, since those may hold lines back in their input buffers
_FILTER = ('while IFS= read -r l || [ -n "$l" ]; do case $l in "debug1: remote forward "*) ;; debug*) continue ;; '
           "mux_confirm_remote_forward:*) continue ;; esac; printf '%s\\n' \"$l\"; done")
CONNECTED = joblines.TUNNEL.line("connected;")
# what a takeover step reads on its stdin (from its opener, through srun): ask for the port now; it is recorded
GO_WORD, RECORDED_WORD = b"go\n", b"recorded\n"
_CONFIRMED_RE = re.compile(r"remote forward success for: listen (\S+)")
_REFUSED_RE = re.compile(r"remote forward failure for:|remote port forwarding failed for listen port")
# the step's first line (the template prints it, the opener reads its step id and the node's PID from it)
NODE_LINE = joblines.Form(joblines.TUNNEL, "node={node} step={step} pid={pid}",
                          {"node": r"\S+", "step": r"\S+", "pid": r"\d+"})
# how the step's lines after an ssh end begin (the template prints them, the opener reads ssh's exit code)
EXITED = joblines.Form(joblines.TUNNEL, "ssh exited with code {code}", {"code": r"\d+"})
_SAID_MAX = 1 << 20  # of the step's output, the opener reads at most this much


class TunnelFailed(EnvLayersError):
    """The tunnel did not come up: the gateway refused the forward, or ssh/srun ended first."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None, lines: list[str] | None = None):
        super().__init__(message, hint=hint)
        self.lines = lines or []  # commands to print under the error, one per line


@dataclass
class TunnelSpec:
    job_id: str
    node: str
    local_port: int
    gateway: Gateway
    remote_bind: str
    remote_port: int
    keep_alive: bool = False
    restarts: int = 5
    control: bool = False  # ssh as a control master: the forward can be handed over (a chain of successors)
    takeover: bool = False  # connect first, then take the gateway port over from the predecessor's tunnel
    takeover_wait_s: int = 300  # how long a takeover asks for the port before it gives up

    @property
    def forward(self) -> str:
        return f"{self.remote_bind}:{self.remote_port}:127.0.0.1:{self.local_port}"

    def ssh_argv(self) -> list[str]:
        return self.gateway.ssh_argv("-v", "-N", "-R", self.forward, self.gateway.destination)

    def _ssh(self, *args: str, master: bool = False) -> str:
        """An ssh command line for the node script; ``master``: with the control socket ``$sock``."""
        ctl = ' -M -S "$sock"' if master else ' -S "$sock"'
        return words(self.gateway.ssh_argv()) + ctl + " " + words([*args, self.gateway.destination])

    def node_script(self) -> str:
        """The step's bash script (templates/tunnel.sh.j2): the ssh lines are built here from checked words."""
        control = self.control or self.takeover
        ssh = self._ssh("-v", "-N", "-R", self.forward, master=True) if control else words(self.ssh_argv())
        where = f"{self.remote_bind}:{self.remote_port}"
        said = word(f"{CONNECTED} taking over {where} once the earlier forward lets it go")
        # the master's socket is in place once ssh enters its session: the takeover says it is connected then
        connected = _FILTER.replace("case $l in ", f'case $l in "debug1: Entering interactive session."*) '
                                    f"printf '%s\\n' {said}; continue ;; ", 1)
        node_line = NODE_LINE.shell({"node": "$(hostname)", "step": "${SLURM_JOB_ID}.${SLURM_STEP_ID}", "pid": "$$"},
                                    dq_escape)
        exited = EXITED.shell({"code": "$rc"}, dq_escape)
        return render("tunnel.sh.j2", node_line=Code(node_line), exited=Code(exited), keep_alive=self.keep_alive,
                      restarts=self.restarts, control=control, takeover=self.takeover,
                      private_dir=Code(PRIVATE_DIR), ssh=Code(ssh), filter=Code(_FILTER),
                      connected_filter=Code(connected), master=Code(self._ssh("-v", "-N", master=True)),
                      forward=Code(self._ssh("-O", "forward", "-R", self.forward)), where=where,
                      takeover_wait_s=int(self.takeover_wait_s), go=GO_WORD.decode().strip(),
                      recorded=RECORDED_WORD.decode().strip(), reset_s=RESTART_RESET_S, max_delay_s=MAX_DELAY_S)

    def cancel_argv(self, step_id: str) -> list[str]:
        """A step of this job that cancels the forward of the tunnel step ``step_id`` (its control
        master stays connected; connections already forwarded go on)."""
        sock = word(f"{step_id}.sock")
        # the mark keeps --keep-alive from taking the port back when this master ends later
        return self._step(["bash", "-c", f'{PRIVATE_DIR} || exit 1; sock="$dir"/{sock}; touch "$sock.handed-over"; '
                           f'{self._ssh("-O", "cancel", "-R", self.forward)}'])

    def _step(self, command: list[str]) -> list[str]:
        return slurm.overlap_step_argv(self.job_id, self.node, command,
                                       options=["--cpus-per-task=1", "--gres=none", f"--job-name={STEP_NAME}"])

    def srun_argv(self) -> list[str]:
        return self._step(["bash", "-c", self.node_script()])


def api_target(acc: JobAccess, replica: int = 0) -> tuple[str, int]:
    """(node, port) of the server behind base URL number ``replica``."""
    bases = acc.base_urls
    if not 0 <= replica < len(bases):
        raise EnvLayersError(f"job {acc.job_id} has {len(bases)} base URL(s); there is no replica {replica}",
                             where="--replica", hint=f"give 0..{len(bases) - 1}")
    parts = urlsplit(bases[replica])
    if not parts.hostname or parts.port is None:
        raise EnvLayersError(f"cannot tell node and port from the base URL {bases[replica]!r}",
                             where=f"{acc.run_dir}/endpoint.json")
    host = parts.hostname
    nodes = acc.endpoint.nodes if acc.endpoint is not None else []
    if host in ("127.0.0.1", "localhost", "::1") and replica < len(nodes):
        host = str(nodes[replica])  # podman publishes on its node's loopback (docs/podman.md): that node
    return host, parts.port


# ------------------------------------------------------------------------------------------ processes

def _clean_env() -> dict[str, str]:
    """This shell's environment without another job's SLURM_* settings (which srun would read)."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith("SLURM_") or k in ("SLURM_CONF", "SLURM_TIME_FORMAT")}


# ------------------------------------------------------------------------------------------ open

@dataclass
class TunnelResult:
    record: TunnelRecord
    gateway_check: dict | None
    proc: subprocess.Popen | None = None  # the srun, while its step still waits for the word (a takeover)

    def to_dict(self) -> dict:
        return {**self.record.to_dict(), "gateway_check": self.gateway_check}

    def commit(self) -> None:
        """Tell a takeover step that it is recorded: until then it ends when this process does."""
        if self.proc is not None:
            _tell(self.proc, RECORDED_WORD, close=True)
            self.proc = None


def _tell(proc: subprocess.Popen, word: bytes, close: bool = False) -> None:
    """Say ``word`` on a takeover step's stdin (srun carries it to the step's script)."""
    try:
        proc.stdin.write(word)
        proc.stdin.flush()
        if close:
            proc.stdin.close()
    except (OSError, AttributeError):  # the step ended: what it said is in the log
        pass


def open_tunnel(acc: JobAccess, spec: TunnelSpec, *, start_timeout_s: float = 30.0,
                check_gateway: bool = True, on_connected: Callable[[], None] | None = None,
                replica: int | None = None, took_over_from: str | None = None, follower: dict | None = None,
                before_record: Callable[[TunnelRecord], None] | None = None) -> TunnelResult:
    """Start the step, wait (at most ``start_timeout_s``) until ssh says the gateway accepted the
    forward, record it (with ``replica``, ``took_over_from`` and ``follower`` when given: see
    rundir.TunnelRecord). Raises :class:`TunnelFailed` (exit 1) when it does not come up.

    A ``takeover`` spec calls ``on_connected`` once its ssh is connected (the predecessor's forward is
    cancelled there), then tells the step to ask for the port (``GO_WORD``) and waits up to
    ``takeover_wait_s`` more for it. Its record is written as
    ``opening`` before the step starts, and the step ends by itself unless this process lives to
    :meth:`TunnelResult.commit` (after its records are written): a takeover is opened by the chain
    follower, and a follower killed half way must leave nothing running. ``before_record`` is called
    with the record once the forward is up, before it is written."""
    run_dir = acc.run_dir
    if run_dir is None:
        raise EnvLayersError(f"job {acc.job_id} has no run directory here", hint="pass --run-dir")
    old = acc.tunnel()
    if old is not None and old.state == "open" and is_recorded_process(old) is not False:
        raise EnvLayersError(
            f"job {acc.job_id} already has a tunnel to {old.gateway['destination']} port {old.remote_port} "
            f"(srun pid {old.srun_pid})",
            hint=f"`env_layers release {acc.job_id}` ends it with the job; one tunnel per job")
    log = run_dir / TUNNEL_LOG
    argv = spec.srun_argv()
    record = TunnelRecord(
        job_id=spec.job_id, state="opening" if spec.takeover else "open", node=spec.node,
        local_port=spec.local_port, gateway=spec.gateway.to_dict(), remote_bind=spec.remote_bind,
        remote_port=spec.remote_port,
        route={"base_url": route_url(spec.remote_bind, spec.remote_port), "provider_model_id": acc.served},
        keep_alive=spec.keep_alive, restarts=spec.restarts if spec.keep_alive else 0,
        host=socket.gethostname(), srun_pid=None, srun_argv=argv, command=words(argv),
        ssh_command=words(spec.ssh_argv()), step_id=None, node_pid=None,
        log=str(log), opened_at=None, control=spec.control or spec.takeover,
        replica=replica, took_over_from=took_over_from, follower=follower,
    )
    if spec.takeover:
        write_tunnel(run_dir, record)  # the intent, before anything runs
    with open(log, "a", encoding="utf-8") as fh:
        fh.write(joblines.TUNNEL.line(f"{OPENER_WORDS} {_now()}: {words(argv)}") + "\n")
        fh.flush()
        said = _StepOutput(log)  # from here on: what the step says
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE if spec.takeover else subprocess.DEVNULL,
                                    stdout=fh, stderr=subprocess.STDOUT, start_new_session=True, env=_clean_env(),
                                    cwd=str(run_dir))
        except FileNotFoundError:
            if spec.takeover:
                write_tunnel(run_dir, replace(record, state="closed", closed_at=_now(), closed_by="opener end",
                                              closed_why="srun is not on PATH"))
            raise EnvLayersError("`srun` is not on PATH", hint="run this where Slurm's client tools are, e.g. "
                                 "the login node you submitted from") from None
    record.srun_pid = proc.pid
    try:
        if spec.takeover:
            write_tunnel(run_dir, record)
        outcome, text = _wait_up(proc, spec, said, start_timeout_s, on_connected)
        node_line = _node_line(text)
        settle = time.monotonic() + 2.0
        while outcome == "up" and node_line is None and time.monotonic() < settle:
            time.sleep(0.1)  # srun relays the task's stdout and stderr separately: the node's line may lag
            text = said.text()
            node_line = _node_line(text)
        record.step_id = node_line["step"] if node_line else None
        record.node_pid = int(node_line["pid"]) if node_line else None
        record.opened_at = _now()
        if outcome != "up":
            _stop(proc.pid, argv, record.step_id)
            text = said.text()  # srun's last lines (slurmstepd's word of a cancel) came meanwhile
            if spec.takeover:
                write_tunnel(run_dir, replace(record, state="closed", closed_at=_now(), closed_by="step end",
                                              closed_why="it did not come up"))
            raise _failure(outcome, spec, text, start_timeout_s,
                           ended=job_ended(spec.job_id, text) if outcome != "refused" else None)
        if before_record is not None:
            before_record(record)
        record.state = "open"
        write_tunnel(run_dir, record)
    except TunnelFailed:
        raise
    except BaseException:  # an error, or this process told to stop, half way: nothing may be left running
        _stop(proc.pid, argv, record.step_id)
        write_tunnel(run_dir, replace(record, state="closed", closed_at=_now(), closed_by="opener end",
                                      closed_why="its opener stopped before it was recorded; the step was stopped"))
        raise
    check = None
    if check_gateway:
        check = check_gateway_port(spec.gateway, spec.remote_bind, spec.remote_port).to_dict()
    return TunnelResult(record, check, proc if spec.takeover else None)


def _wait_up(proc: subprocess.Popen, spec: TunnelSpec, said: _StepOutput, start_timeout_s: float,
             on_connected: Callable[[], None] | None) -> tuple[str, str]:
    """Wait for the step's word: (``up`` | ``refused`` | ``exited`` | ``timeout``, its output so far)."""
    deadline = time.monotonic() + start_timeout_s + (spec.takeover_wait_s if spec.takeover else 0)
    connected = False
    while True:
        text = said.text()
        if _CONFIRMED_RE.search(text):
            return "up", text
        if spec.takeover and not connected and CONNECTED in text:
            connected = True
            if on_connected is not None:
                on_connected()  # the earlier forward is cancelled there
            _tell(proc, GO_WORD)
        if _REFUSED_RE.search(text) and not spec.takeover:
            return "refused", text
        if proc.poll() is not None:
            time.sleep(0.2)  # srun's last lines
            text = said.text()
            return ("refused" if _REFUSED_RE.search(text) else "exited"), text
        if time.monotonic() >= deadline:
            return "timeout", text
        time.sleep(0.1)


class _StepOutput:
    """What the step has written to tunnel.log since it started (its first ``_SAID_MAX`` bytes), read on as
    the log grows."""

    def __init__(self, log: Path):
        self._tail = Tail(log, chunk=_SAID_MAX)
        self._tail.last(0)  # the log's end now: what follows is the step's
        self._data = b""

    def text(self) -> str:
        if len(self._data) < _SAID_MAX:
            self._data += self._tail.read_bytes()
        return self._data[:_SAID_MAX].decode(errors="replace")


def _node_line(text: str) -> dict[str, str] | None:
    """The fields of the step's :data:`NODE_LINE` in its output ``text`` (None until it came)."""
    return next((f for line in text.split("\n") for f in [NODE_LINE.match_line(line)] if f), None)


# ssh's own lines when it cannot reach or log in to the gateway (the first match names the trouble)
_SSH_ERROR_RE = re.compile(
    r"^(ssh: .*|Host key verification failed\.?|.*Permission denied \(.*|Connection (closed|reset|timed out)"
    r".*|kex_exchange_identification: .*|.*REMOTE HOST IDENTIFICATION HAS CHANGED.*|No .*host key is known for .*"
    r"|Load key .*|Warning: Identity file .*|banner exchange: .*|Bad .*|.*: No such file or directory)$")
_SRUN_EXIT_RE = re.compile(r"exit code (\d+)")


def ssh_said(text: str) -> tuple[str | None, str | None]:
    """(ssh's own error line, the exit code srun reported) from the step's output; the line made safe to print."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    own = [ln for ln in lines if not ln.startswith(("srun:", joblines.TUNNEL.prefix.rstrip(), "OpenSSH_", "debug"))]
    picked = next((ln for ln in own if _SSH_ERROR_RE.match(ln)), None)
    if picked is None and own:
        picked = own[-1]
    code = next((m.group(1) for ln in reversed(lines) if ln.startswith("srun:") for m in [_SRUN_EXIT_RE.search(ln)] if m),
                None)
    if code is None:
        code = next((f["code"] for ln in reversed(lines) for f in [EXITED.match_line(ln)] if f), None)
    return (printable(picked) if picked else None), code


def _ssh_hint(line: str | None, spec: TunnelSpec) -> str:
    low = (line or "").lower()
    if "host key" in low or "identification has changed" in low:
        return ("the node's ssh does not trust the gateway's host key: add it to the known_hosts the node reads "
                "(or -o UserKnownHostsFile=FILE)")
    if "permission denied" in low or "load key" in low or "identity file" in low:
        return ("the gateway did not accept the login: --identity FILE must be a key the gateway user accepts, "
                "readable on the node")
    if "connect to host" in low or "resolve" in low or "timed out" in low or "connection" in low:
        return (f"is {spec.gateway.host} reachable from the node {spec.node}, and its sshd on "
                f"{'port ' + str(spec.gateway.ssh_port) if spec.gateway.ssh_port else 'the port ssh uses'}?")
    return "the full output is in tunnel.log of the run directory"


def job_ended(job_id: str, text: str, job_info: Callable | None = None) -> str | None:
    """Why the tunnel's step ended when it was not ssh: its job has ended (or is ending), in Slurm's words
    (the job's state, and slurmstepd's "CANCELLED AT" line from the step's output ``text``); None while the
    job runs and Slurm did not cancel the step."""
    said = slurm.slurm_cancelled(text)
    if job_info is None:
        def job_info(jid: str):
            return slurm.job_info(jid, run=slurm.run)
    try:
        info = job_info(job_id)
    except (EnvLayersError, OSError):  # Slurm did not answer: its line in the output is all there is
        info = False
    words = f"; Slurm said: {said}" if said else ""
    if info is None:
        return f"job {job_id} ended (no longer known to Slurm){words}"
    if info and (info.finished or info.state == "COMPLETING"):
        return f"job {job_id} ended ({info.state}){words}"
    return f"Slurm ended the step: {said}" if said else None


def _failure(outcome: str, spec: TunnelSpec, text: str, timeout_s: float, ended: str | None = None) -> TunnelFailed:
    said, code = ssh_said(text)
    last = said or "nothing"
    dest = spec.gateway.destination
    if outcome == "refused":
        return _held_failure(spec, last)
    if ended:  # the job's end (or Slurm) cut the step: ssh's last words are its end, not the cause
        return TunnelFailed(f"the tunnel step ended before the forward to the gateway {dest} was up: {ended} "
                            "(not an ssh failure)",
                            hint=f"a tunnel needs a running job: `env_layers status {spec.job_id}` says its state")
    if outcome == "exited":
        exit_said = f" (ssh exit {code})" if code else ""
        return TunnelFailed(f"ssh from {spec.node} to the gateway {dest} failed before the forward was up: {last}"
                            f"{exit_said}", hint=_ssh_hint(said, spec))
    return TunnelFailed(f"no confirmation from the gateway {dest} within {timeout_s:g}s (ssh said: {last}); the "
                        "tunnel was stopped", hint=_ssh_hint(said, spec) if said else
                        "is the gateway reachable from the node? raise --start-timeout")


def _held_failure(spec: TunnelSpec, last: str) -> TunnelFailed:
    """The gateway refused the forward: say what holds the port there, and the advice that fits it."""
    dest, port, host = spec.gateway.destination, spec.remote_port, spec.gateway.host
    holder = find_port_holder(spec.gateway, spec.remote_bind, port)
    where = f"port {port} on the gateway host {host}"
    lines = ["on the gateway host:", *(f"  {c}" for c in find_holder_commands(port, holder))]
    other = recorded_holder(spec) if holder.kind in ("forward", "unknown") else None
    also = (f"; job {other} recorded an open tunnel to that port: `env_layers release {other}` closes it"
            if other else "")
    if holder.kind == "forward" and holder.yours:
        return TunnelFailed(f"{where} is still held by an earlier forward: {holder.detail}, a login of the gateway "
                            f"user: an earlier allocation's tunnel, most likely{also}",
                            hint="end it on the gateway host (below), then run this command again", lines=lines)
    if holder.kind == "forward":
        return TunnelFailed(f"{where} is held by another user's ssh forward: {holder.detail}",
                            hint="it is not yours to end: give the route another --remote-port", lines=lines)
    if holder.kind in ("program", "hidden"):
        return TunnelFailed(f"{where} is held by {holder.detail}: another program listens there",
                            hint="give the route another --remote-port (or stop that program on the gateway host, "
                                 "if it is yours and should not run)", lines=lines)
    check = check_gateway_port(spec.gateway, spec.remote_bind, port)
    if check.held:
        what = f"{where} is held ({check.detail}); what holds it could not be asked: {holder.detail}{also}"
    else:
        what = (f"the gateway {dest} refused the forward of {spec.remote_bind}:{port} ({last}); most often "
                f"something still holds the port, else its sshd forbids remote forwards (AllowTcpForwarding)")
    return TunnelFailed(what, hint="see what holds it on the gateway host (below): an sshd is an earlier forward "
                        "of yours, end it; another program: give the route another --remote-port", lines=lines)


def recorded_holder(spec: TunnelSpec, job_info: Callable | None = None) -> str | None:
    """Another job whose run directory records an open tunnel to the same gateway and port (its record
    settled first: a job that ended holds nothing)."""
    from ..rundir import run_root_candidates
    from ..rundir import read_tunnel
    from .tunnelrecord import settle

    if job_info is None:
        def job_info(jid: str):
            return slurm.job_info(jid, run=slurm.run)

    for root in run_root_candidates(os.environ, Path.cwd()):
        for path in sorted(root.glob(f"*/{TUNNEL}")) if root.is_dir() else ():
            rec = read_tunnel(path.parent)
            if (rec is not None and rec.state == "open" and rec.job_id != spec.job_id
                    and rec.remote_port == spec.remote_port
                    and (rec.gateway or {}).get("destination") == spec.gateway.destination):
                try:
                    rec = settle(rec, path.parent, job_info(str(rec.job_id)))
                except EnvLayersError:
                    pass  # Slurm did not answer: the record may be right
                if rec.state == "open":
                    return str(rec.job_id)
    return None


def _stop(pid: int, argv: list[str], step_id: str | None, wait_s: float = 10.0) -> str:
    """End a tunnel step: scancel the step when known, then SIGTERM srun if it still runs ``argv``
    (SIGKILL after ``wait_s``). Returns what was done, in words."""
    said = []
    if step_id and "." in step_id and step_id.split(".", 1)[1]:
        try:
            slurm.cancel(step_id, run=slurm.run)
            said.append(f"scancel {step_id}")
        except EnvLayersError as err:
            said.append(f"scancel {step_id} failed: {err.message}")
    ended = stop_recorded(pid, argv, wait_s=wait_s)
    if ended is not None:
        said.append(f"srun pid {pid} {'ended' if ended else 'still runs after SIGKILL'}")
    return ", ".join(said)


def close_tunnel(acc: JobAccess) -> tuple[str, str]:
    """Close the recorded tunnel. Returns (status, detail): status ``closed`` (this call ended it),
    ``already`` (nothing was running) or ``skipped`` (the PID is not the recorded process)."""
    record = acc.tunnel()
    if record is None:
        return "already", "no tunnel recorded for this job"
    if record.state == "closed":
        why = record.closed_why
        return "already", f"closed at {record.closed_at}" + (f": {why}" if why else "")
    pid = int(record.srun_pid or 0)
    mine = is_recorded_process(record)
    info = acc.job.info
    step = record.step_id if info is not None and not info.finished else None
    if mine is False and step is None:
        status, detail = "already", (f"srun pid {pid} no longer runs the tunnel (it ended with the job or "
                                     "dropped); nothing to kill")
    elif mine is False:
        how = _stop(pid, [], step)
        status, detail = "closed", f"srun pid {pid} is gone or another process now (not touched); {how}"
    elif mine is None and step is None:
        return "skipped", (f"it was opened on {record.host}: its srun pid {pid} means nothing here; "
                           f"run `env_layers release {acc.job_id}` there")
    elif mine is None:
        how = _stop(pid, [], step)
        status, detail = "closed", f"opened on {record.host}, so its pid means nothing here; {how}"
    else:
        how = _stop(pid, record.srun_argv, step)
        status, detail = "closed", how
    if acc.run_dir is not None:
        write_tunnel(acc.run_dir, replace(record, state="closed", closed_at=_now(), closed_by="release",
                                          closed_why=f"closed by release: {detail}"))
    return status, detail
