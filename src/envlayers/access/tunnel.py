"""``tunnel``: a reverse SSH tunnel from the node that serves the API to a fixed loopback port on a
gateway host, run as a step of the job so that it ends when the job does.

The step is ``srun --overlap --jobid=J --nodes=1 --nodelist=<api node> bash -c SCRIPT``; the script
runs ``ssh -v -N -o ExitOnForwardFailure=yes ... -R <bind>:<port>:127.0.0.1:<api port> <gateway>``
with ssh's debug lines filtered down to the few that say whether the forward was accepted, so
``tunnel.log`` stays small however much traffic passes. With ``--keep-alive`` the script restarts
ssh when it drops (bounded restarts, doubling delays), still inside the job.

``tunnel.json`` (written atomically) records the exact commands, the srun PID on this host, the
node's PID and the step id; ``release`` closes the tunnel from it. Only one open tunnel per job.

For a job of a chain of successors the tunnel can be handed over (access.handover): ssh then runs as
a control master (``-M -S /tmp/envlayers-tunnel-<job>.<step>.sock``), so a step in the same job can
cancel its forward (``ssh -O cancel``) while connections already forwarded go on; the successor's
tunnel (``takeover``) connects first, then asks for the same gateway port every 20 ms
(``ssh -O forward``) until the earlier forward lets it go.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable
from urllib.parse import urlsplit

from .. import slurm
from ..errors import EnvLayersError
from ..fsutil import atomic_write
from .gateway import Gateway, check_gateway_port, find_holder_commands, route_url
from .job import TUNNEL_FILE, JobAccess

STEP_NAME = "envlayers-tunnel"
LOG_NAME = "tunnel.log"
RESTART_RESET_S = 60  # a connection that stayed up this long resets the restart count
MAX_DELAY_S = 60
CONTROL_DIR = "/tmp"  # where a handed-over tunnel's control socket lives, on the API node
# keep ssh's non-debug lines, and of its debug lines only those that say how the forward went; a bash
# loop, not awk or sed, since those may hold lines back in their input buffers
_FILTER = ('while IFS= read -r l || [ -n "$l" ]; do case $l in "debug1: remote forward "*) ;; debug*) continue ;; '
           "mux_confirm_remote_forward:*) continue ;; esac; printf '%s\\n' \"$l\"; done")
TAKEOVER_POLL_S = 0.02  # how often a taking-over tunnel asks for the port while the earlier forward holds it
CONNECTED = "ENVLAYERS-TUNNEL: connected;"
_CONFIRMED_RE = re.compile(r"remote forward success for: listen (\S+)")
_REFUSED_RE = re.compile(r"remote forward failure for:|remote port forwarding failed for listen port")
_NODE_RE = re.compile(r"^ENVLAYERS-TUNNEL: node=(\S+) step=(\S+) pid=(\d+)", re.M)


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
        return shlex.join(self.gateway.ssh_argv()) + ctl + " " + shlex.join([*args, self.gateway.destination])

    def node_script(self) -> str:
        ssh = shlex.join(self.ssh_argv())
        if self.control or self.takeover:
            ssh = self._ssh("-v", "-N", "-R", self.forward, master=True)
        run_ssh = f"{ssh} 2> >({_FILTER} >&2)"
        head = ('echo "ENVLAYERS-TUNNEL: node=$(hostname) step=${SLURM_JOB_ID}.${SLURM_STEP_ID} pid=$$'
                + (f' keep_alive={self.restarts}"' if self.keep_alive else '"'))
        lines = [head]
        if self.control or self.takeover:
            lines += [f"sock={CONTROL_DIR}/envlayers-tunnel-${{SLURM_JOB_ID}}.${{SLURM_STEP_ID}}.sock", 'rm -f "$sock"']
        if self.takeover:
            lines += self._takeover_lines()
        elif not self.keep_alive:
            return "\n".join([*lines, f"exec {run_ssh}"]) + "\n"
        if not self.keep_alive:  # taken over: serve until ssh ends
            return "\n".join([*lines, 'wait "$pid"']) + "\n"
        n = self.restarts
        return "\n".join([
            *lines,
            "restarts=0 delay=2",
            "while :; do",
            '  if [ -z "${pid-}" ]; then',
            "    started=$SECONDS",
            '    rm -f "${sock:-/nonexistent}"' if (self.control or self.takeover) else "    :",
            f"    {run_ssh} &",
            "    pid=$!",
            '    echo "ENVLAYERS-TUNNEL: ssh pid=$pid"',
            "  fi",
            '  wait "$pid"; rc=$?; pid=',
            *(['  if [ -e "$sock.handed-over" ]; then echo "ENVLAYERS-TUNNEL: ssh exited with code $rc after the '
               'handover to the successor\'s tunnel: not restarted"; exit 0; fi']
              if (self.control or self.takeover) else []),
            "  up=$((SECONDS - started))",
            f'  if [ "$up" -ge {RESTART_RESET_S} ]; then restarts=0 delay=2; fi',
            f'  if [ "$restarts" -ge {n} ]; then',
            f'    echo "ENVLAYERS-TUNNEL: ssh exited with code $rc after ${{up}}s; giving up after {n} restarts"',
            '    exit "$rc"',
            "  fi",
            "  restarts=$((restarts + 1))",
            f'  echo "ENVLAYERS-TUNNEL: ssh exited with code $rc after ${{up}}s; restart $restarts/{n} in ${{delay}}s"',
            '  sleep "$delay"',
            f"  delay=$((delay * 2)); if [ $delay -gt {MAX_DELAY_S} ]; then delay={MAX_DELAY_S}; fi",
            "done",
        ]) + "\n"

    def _takeover_lines(self) -> list[str]:
        """Connect (a master without forwards), say so, then ask for the port until it is free."""
        master = self._ssh("-v", "-N", master=True) + f" 2> >({_FILTER} >&2)"
        gone = 'if ! kill -0 "$pid" 2>/dev/null; then wait "$pid"; rc=$?; echo "ENVLAYERS-TUNNEL: ssh exited with ' \
               'code $rc before the forward was up"; exit "$rc"; fi'
        where = f"{self.remote_bind}:{self.remote_port}"
        return [
            "started=$SECONDS",
            f"{master} &",
            "pid=$!",
            'echo "ENVLAYERS-TUNNEL: ssh pid=$pid"',
            f"until {self._ssh('-O', 'check')} >/dev/null 2>&1; do {gone}; sleep 0.05; done",
            f'echo "{CONNECTED} taking over {where} once the earlier forward lets it go"',
            f"until {self._ssh('-O', 'forward', '-R', self.forward)} >/dev/null 2>&1; do",
            f"  {gone}",
            f'  if [ $((SECONDS - started)) -ge {int(self.takeover_wait_s)} ]; then',
            f'    echo "ENVLAYERS-TUNNEL: {where} is still held after {int(self.takeover_wait_s)}s; giving up"',
            '    kill "$pid"; exit 1',
            "  fi",
            f"  sleep {TAKEOVER_POLL_S}",
            "done",
            f'echo "ENVLAYERS-TUNNEL: remote forward success for: listen {where} (taken over)"',
        ]

    def cancel_argv(self, step_id: str) -> list[str]:
        """A step of this job that cancels the forward of the tunnel step ``step_id`` (its control
        master stays connected; connections already forwarded go on)."""
        sock = f"{CONTROL_DIR}/envlayers-tunnel-{step_id}.sock"
        cancel = shlex.join(self.gateway.ssh_argv("-S", sock, "-O", "cancel", "-R", self.forward,
                                                  self.gateway.destination))
        # the mark keeps --keep-alive from taking the port back when this master ends later
        return [*self._step_head(), "bash", "-c", f"touch {shlex.quote(sock + '.handed-over')}; {cancel}"]

    def _step_head(self) -> list[str]:
        return ["srun", "--overlap", f"--jobid={self.job_id}", "--nodes=1", "--ntasks=1",
                f"--nodelist={self.node}", "--cpus-per-task=1", "--gres=none", f"--job-name={STEP_NAME}"]

    def srun_argv(self) -> list[str]:
        return [*self._step_head(), "bash", "-c", self.node_script()]


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
    nodes = (acc.endpoint or {}).get("nodes") or []
    if host in ("127.0.0.1", "localhost", "::1") and replica < len(nodes):
        host = str(nodes[replica])  # podman publishes on its node's loopback (docs/podman.md): that node
    return host, parts.port


# ------------------------------------------------------------------------------------------ processes

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


def is_recorded_process(record: dict) -> bool | None:
    """True: the recorded srun PID still runs the recorded command. False: it does not (gone or
    reused). None: the tunnel was opened on another host, so its PID means nothing here."""
    if record.get("host") and record["host"] != socket.gethostname():
        return None
    pid = record.get("srun_pid")
    return bool(pid) and cmdline(int(pid)) == record.get("srun_argv")


def _clean_env() -> dict[str, str]:
    """This shell's environment without another job's SLURM_* settings (which srun would read)."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith("SLURM_") or k in ("SLURM_CONF", "SLURM_TIME_FORMAT")}


def write_record(run_dir: Path, record: dict) -> None:
    atomic_write(run_dir / TUNNEL_FILE, json.dumps(record, indent=2) + "\n")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


# ------------------------------------------------------------------------------------------ open

@dataclass
class TunnelResult:
    record: dict
    gateway_check: dict | None

    def to_dict(self) -> dict:
        return {**self.record, "gateway_check": self.gateway_check}


def open_tunnel(acc: JobAccess, spec: TunnelSpec, *, start_timeout_s: float = 30.0,
                check_gateway: bool = True, on_connected: Callable[[], None] | None = None,
                extra: dict | None = None) -> TunnelResult:
    """Start the step, wait (at most ``start_timeout_s``) until ssh says the gateway accepted the
    forward, record it (with ``extra``). Raises :class:`TunnelFailed` (exit 1) when it does not come up.

    A ``takeover`` spec calls ``on_connected`` once its ssh is connected (the predecessor's forward is
    cancelled there) and waits up to ``takeover_wait_s`` more for the port."""
    run_dir = acc.run_dir
    if run_dir is None:
        raise EnvLayersError(f"job {acc.job_id} has no run directory here", hint="pass --run-dir")
    old = acc.tunnel()
    if old and old.get("state") == "open" and is_recorded_process(old) is not False:
        raise EnvLayersError(
            f"job {acc.job_id} already has a tunnel to {old['gateway']['destination']} port {old['remote_port']} "
            f"(srun pid {old.get('srun_pid')})",
            hint=f"`env_layers release {acc.job_id}` ends it with the job; one tunnel per job")
    log = run_dir / LOG_NAME
    argv = spec.srun_argv()
    with open(log, "a", encoding="utf-8") as fh:
        fh.write(f"ENVLAYERS-TUNNEL: starting at {_now()}: {shlex.join(argv)}\n")
        fh.flush()
        offset = fh.tell()
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                                    start_new_session=True, env=_clean_env(), cwd=str(run_dir))
        except FileNotFoundError:
            raise EnvLayersError("`srun` is not on PATH", hint="run this where Slurm's client tools are, e.g. "
                                 "the login node you submitted from") from None
    deadline = time.monotonic() + start_timeout_s + (spec.takeover_wait_s if spec.takeover else 0)
    text = ""
    outcome = "timeout"
    connected = False
    while True:
        text = _read_from(log, offset)
        if _CONFIRMED_RE.search(text):
            outcome = "up"
            break
        if spec.takeover and not connected and CONNECTED in text:
            connected = True
            if on_connected is not None:
                on_connected()
        if _REFUSED_RE.search(text) and not spec.takeover:
            outcome = "refused"
            break
        if proc.poll() is not None:
            time.sleep(0.2)  # srun's last lines
            text = _read_from(log, offset)
            outcome = "refused" if _REFUSED_RE.search(text) else "exited"
            break
        if time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    node_line = _NODE_RE.search(text)
    settle = time.monotonic() + 2.0
    while outcome == "up" and node_line is None and time.monotonic() < settle:
        time.sleep(0.1)  # srun relays the task's stdout and stderr separately: the node's line may lag
        text = _read_from(log, offset)
        node_line = _NODE_RE.search(text)
    record = {
        "job_id": spec.job_id, "state": "open", "node": spec.node, "local_port": spec.local_port,
        "gateway": spec.gateway.to_dict(), "remote_bind": spec.remote_bind, "remote_port": spec.remote_port,
        "route": {"base_url": route_url(spec.remote_bind, spec.remote_port), "provider_model_id": acc.served},
        "keep_alive": spec.keep_alive, "restarts": spec.restarts if spec.keep_alive else 0,
        "host": socket.gethostname(), "srun_pid": proc.pid, "srun_argv": argv, "command": shlex.join(argv),
        "ssh_command": shlex.join(spec.ssh_argv()),
        "step_id": node_line.group(2) if node_line else None,
        "node_pid": int(node_line.group(3)) if node_line else None,
        "log": str(log), "opened_at": _now(), "control": spec.control or spec.takeover,
        **(extra or {}),
    }
    if outcome != "up":
        _stop(proc.pid, argv, record["step_id"], acc)
        raise _failure(outcome, spec, text, start_timeout_s)
    write_record(run_dir, record)
    check = None
    if check_gateway:
        check = check_gateway_port(spec.gateway, spec.remote_bind, spec.remote_port).to_dict()
    return TunnelResult(record, check)


def _read_from(path: Path, offset: int) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            return fh.read(1 << 20).decode(errors="replace")
    except OSError:
        return ""


def _failure(outcome: str, spec: TunnelSpec, text: str, timeout_s: float) -> TunnelFailed:
    said = [ln.strip() for ln in text.splitlines()
            if ln.strip() and not ln.startswith(("ENVLAYERS-TUNNEL:", "OpenSSH_", "debug1: remote forward"))]
    last = said[-1] if said else "nothing"
    dest, port = spec.gateway.destination, spec.remote_port
    if outcome == "refused":
        check = check_gateway_port(spec.gateway, spec.remote_bind, port)
        if check.held:
            what = (f"port {port} on the gateway host {spec.gateway.host} is still held by an earlier forward "
                    f"({check.detail}): an earlier allocation's tunnel, which lives on the gateway host")
            other = recorded_holder(spec)
            if other:
                what += (f"; job {other} recorded an open tunnel to that port: `env_layers release {other}` "
                         "closes it if that job still runs")
        else:
            what = (f"the gateway {dest} refused the forward of {spec.remote_bind}:{port} ({last}); most often "
                    f"an earlier forward still holds the port, else its sshd forbids remote forwards "
                    f"(AllowTcpForwarding)")
        return TunnelFailed(what, hint="clear it on the gateway host, then run this command again",
                            lines=["on the gateway host:", *(f"  {c}" for c in find_holder_commands(port))])
    if outcome == "exited":
        return TunnelFailed(f"the tunnel to {dest} ended before the forward was up: {last}",
                            hint="the full output is in tunnel.log of the run directory; a key or host-key problem "
                                 "shows as 'Permission denied' or 'Host key verification failed'")
    return TunnelFailed(f"no confirmation from the gateway {dest} within {timeout_s:g}s (last: {last}); the tunnel "
                        "was stopped", hint="is the gateway reachable from the node? raise --start-timeout")


def recorded_holder(spec: TunnelSpec) -> str | None:
    """Another job whose run directory records an open tunnel to the same gateway and port."""
    from ..rundir import run_root_candidates

    for root in run_root_candidates(os.environ, Path.cwd()):
        for path in sorted(root.glob(f"*/{TUNNEL_FILE}")) if root.is_dir() else ():
            try:
                rec = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if (isinstance(rec, dict) and rec.get("state") == "open" and rec.get("job_id") != spec.job_id
                    and rec.get("remote_port") == spec.remote_port
                    and (rec.get("gateway") or {}).get("destination") == spec.gateway.destination):
                return str(rec.get("job_id"))
    return None


def _stop(pid: int, argv: list[str], step_id: str | None, acc: JobAccess | None, wait_s: float = 10.0) -> str:
    """End a tunnel step: scancel the step when known, then SIGTERM srun if it still runs ``argv``
    (SIGKILL after ``wait_s``). Returns what was done, in words."""
    said = []
    if step_id and "." in step_id and step_id.split(".", 1)[1]:
        try:
            slurm.cancel(step_id, run=slurm.run)
            said.append(f"scancel {step_id}")
        except EnvLayersError as err:
            said.append(f"scancel {step_id} failed: {err.message}")
    if not argv or cmdline(pid) != argv:
        return ", ".join(said)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait_s
        while cmdline(pid) == argv and time.monotonic() < deadline:
            time.sleep(0.1)
        if cmdline(pid) != argv:
            break
    ended = cmdline(pid) != argv
    said.append(f"srun pid {pid} {'ended' if ended else 'still runs after SIGKILL'}")
    return ", ".join(said)


def close_tunnel(acc: JobAccess) -> tuple[str, str]:
    """Close the recorded tunnel. Returns (status, detail): status ``closed`` (this call ended it),
    ``already`` (nothing was running) or ``skipped`` (the PID is not the recorded process)."""
    record = acc.tunnel()
    if record is None:
        return "already", "no tunnel recorded for this job"
    if record.get("state") == "closed":
        return "already", f"closed at {record.get('closed_at')}"
    pid = int(record.get("srun_pid") or 0)
    mine = is_recorded_process(record)
    info = acc.job.info
    step = record.get("step_id") if info is not None and not info.finished else None
    if mine is False and step is None:
        status, detail = "already", (f"srun pid {pid} no longer runs the tunnel (it ended with the job or "
                                     "dropped); nothing to kill")
    elif mine is False:
        how = _stop(pid, [], step, acc)
        status, detail = "closed", f"srun pid {pid} is gone or another process now (not touched); {how}"
    elif mine is None and step is None:
        return "skipped", (f"it was opened on {record['host']}: its srun pid {pid} means nothing here; "
                           f"run `env_layers release {acc.job_id}` there")
    elif mine is None:
        how = _stop(pid, [], step, acc)
        status, detail = "closed", f"opened on {record['host']}, so its pid means nothing here; {how}"
    else:
        how = _stop(pid, record["srun_argv"], step, acc)
        status, detail = "closed", how
    record.update(state="closed", closed_at=_now())
    if acc.run_dir is not None:
        write_record(acc.run_dir, record)
    return status, detail
