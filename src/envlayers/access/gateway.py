"""The gateway host's side of a tunnel: who to ssh to, which remote binds are allowed, the ssh
command line, and asking the gateway whether a port on it answers.

A reverse tunnel's remote end must stay private: it is bound to a loopback address of the gateway
host, so only the gateway itself (and whoever can log in there) reaches the model server. Any
address other than a numeric loopback one is refused here, before ssh runs: sshd would silently
turn ``0.0.0.0`` into loopback when ``GatewayPorts`` is off, but publish it to every network where
an administrator turned it on.

Whether a port on the gateway answers is asked through the gateway's own sshd (``ssh -W
ADDR:PORT``, the connection is made from the gateway host), so no shell account is needed there.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
import socket
import subprocess
from dataclasses import dataclass

from ..errors import EnvLayersError

# ssh options the tunnel always sets; a user's -o cannot weaken them (ssh keeps the first value given)
FORCED_OPTIONS = ("ExitOnForwardFailure=yes", "BatchMode=yes")
# defaults a user's -o may change (theirs come first, so theirs win)
DEFAULT_OPTIONS = ("ServerAliveInterval=30", "ServerAliveCountMax=3", "ConnectTimeout=15")
# -o options that would open other forwards, past the loopback-only check
_REFUSED_OPTIONS = {"remoteforward", "localforward", "dynamicforward", "gatewayports", "exitonforwardfailure",
                    "permitremoteopen", "clearallforwardings", "sessiontype", "requesttty", "remotecommand",
                    "forkafterauthentication"}
_OPTION_RE = re.compile(r"^([A-Za-z][A-Za-z0-9]*)\s*(=|\s)\s*(\S.*)$")
_USER_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_HOST_RE = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_][A-Za-z0-9_.:-]*)$")


@dataclass(frozen=True)
class Gateway:
    """Where the tunnel goes: ``user@host`` (user optional), sshd port, identity file, extra -o options."""

    destination: str
    ssh_port: int | None = None
    identity: str | None = None
    options: tuple[str, ...] = ()

    @property
    def host(self) -> str:
        return self.destination.rsplit("@", 1)[-1].strip("[]")

    def ssh_argv(self, *args: str) -> list[str]:
        """``ssh`` with the forced options first, then the user's, then the defaults they did not set."""
        argv = ["ssh"]
        for opt in FORCED_OPTIONS:
            argv += ["-o", opt]
        given = {option_name(o) for o in self.options}
        for opt in self.options:
            argv += ["-o", opt]
        for opt in DEFAULT_OPTIONS:
            if option_name(opt) not in given:
                argv += ["-o", opt]
        if self.ssh_port is not None:
            argv += ["-p", str(self.ssh_port)]
        if self.identity:
            argv += ["-i", self.identity]
        return [*argv, *args]

    def to_dict(self) -> dict:
        return {"destination": self.destination, "ssh_port": self.ssh_port, "identity": self.identity,
                "options": list(self.options)}

    @classmethod
    def from_dict(cls, data: dict) -> "Gateway":
        return cls(data["destination"], data.get("ssh_port"), data.get("identity"), tuple(data.get("options") or ()))


def option_name(option: str) -> str:
    m = _OPTION_RE.match(option.strip())
    return m.group(1).lower() if m else option.strip().lower()


def check_destination(text: str) -> str:
    """``USER@HOST`` or ``HOST``; never something ssh would read as an option."""
    text = (text or "").strip()
    where = "--to"
    hint = "give the gateway host as USER@HOST, e.g. --to me@gateway.example.org"
    if not text:
        raise EnvLayersError("the gateway host is empty", where=where, hint=hint)
    if text.startswith("-") or any(c.isspace() for c in text):
        raise EnvLayersError(f"{text!r} is not a destination (it starts with '-' or holds a space)", where=where,
                             hint=hint)
    user, _, host = text.rpartition("@")
    if "@" in text and not _USER_RE.match(user):
        raise EnvLayersError(f"{user!r} is not a user name", where=where, hint=hint)
    if not _HOST_RE.match(host):
        raise EnvLayersError(f"{host!r} is not a host name or address", where=where, hint=hint)
    return text


def check_options(options) -> tuple[str, ...]:
    """The user's ``-o`` options, each ``Key=Value``; forwarding-related keys are refused."""
    out = []
    for opt in options or ():
        m = _OPTION_RE.match(opt.strip())
        if not m:
            raise EnvLayersError(f"-o {opt!r} is not an ssh option", where="-o",
                                 hint="write it as Key=Value, e.g. -o UserKnownHostsFile=~/.ssh/gw_known_hosts")
        if m.group(1).lower() in _REFUSED_OPTIONS:
            raise EnvLayersError(f"-o {m.group(1)} is set by the tunnel itself (or would open another forward)",
                                 where="-o", hint="the tunnel opens exactly one loopback forward; drop this option")
        out.append(f"{m.group(1)}={m.group(3).strip()}")
    return tuple(out)


def check_remote_bind(text: str | None) -> str:
    """The gateway-side bind address: a numeric loopback address only (default ``127.0.0.1``)."""
    if text is None:
        return "127.0.0.1"
    value = text.strip()
    where = "--remote-bind"
    hint = "leave --remote-bind out (127.0.0.1), or give another numeric loopback address such as 127.0.0.2"
    why_private = ("the gateway's route must stay private: only the gateway host itself may reach the model "
                   "server through the tunnel")
    if value in ("", "*", "0.0.0.0", "::", "[::]"):
        shown = value or "an empty address"
        raise EnvLayersError(f"{shown!r} binds every interface of the gateway host; {why_private}", where=where,
                             hint=hint)
    if value.lower() == "localhost":
        raise EnvLayersError("'localhost' is a name the gateway resolves itself (to 127.0.0.1, ::1 or both); "
                             "give the address", where=where, hint=hint)
    try:
        addr = ipaddress.ip_address(value.strip("[]"))
    except ValueError:
        raise EnvLayersError(f"{value!r} is not a numeric IP address; a host name can resolve to a routable "
                             f"address, and {why_private}", where=where, hint=hint) from None
    if not addr.is_loopback:
        raise EnvLayersError(f"{value} is not a loopback address: it would publish the model server on a network "
                             f"the gateway host is on; {why_private}", where=where, hint=hint)
    return f"[{addr}]" if addr.version == 6 else str(addr)


def check_identity(path: str | None) -> str | None:
    """The ``--identity`` file as an absolute path (ssh runs on the node, in the run directory)."""
    if path is None:
        return None
    from pathlib import Path

    p = Path(path).expanduser().absolute()
    if not p.is_file():
        raise EnvLayersError(f"{p} does not exist or is not a file", where="--identity",
                             hint="give the private key the node's ssh should use; the node must be able to read it")
    return str(p)


def check_port(value: int, where: str) -> int:
    if not 1 <= int(value) <= 65535:
        raise EnvLayersError(f"{value} is not a TCP port", where=where, hint="give a number from 1 to 65535")
    return int(value)


def route_url(remote_bind: str, remote_port: int) -> str:
    return f"http://{remote_bind}:{remote_port}/v1"


def find_holder_commands(remote_port: int) -> list[str]:
    """What to run on the gateway host to see and clear whatever holds ``remote_port``."""
    return [f"ss -ltnp 'sport = :{remote_port}'    # or: lsof -nP -iTCP:{remote_port} -sTCP:LISTEN",
            "kill <the sshd pid it names>    # the child sshd of the earlier forward; the listener closes with it"]


# ------------------------------------------------------------------------------------------ port check

@dataclass
class PortCheck:
    """Whether ``bind:port`` on the gateway host answers, as seen from the gateway host.

    ``state``: ``answers`` (an HTTP answer came back), ``listening`` (accepted, nothing came back in
    time), ``free`` (connection refused), ``unknown`` (the check itself could not run)."""

    state: str
    detail: str
    how: str

    @property
    def held(self) -> bool:
        return self.state in ("answers", "listening")

    def to_dict(self) -> dict:
        return {"state": self.state, "detail": self.detail, "how": self.how}


def check_gateway_port(gateway: Gateway, bind: str, port: int, timeout_s: float = 10.0) -> PortCheck:
    """Connect to ``bind:port`` from the gateway host through its sshd (``ssh -W``), send a GET of
    /v1/models, and classify what happens. Falls back to a direct connect when ssh cannot run and the
    gateway is this host."""
    target = f"{bind.strip('[]')}:{port}" if ":" not in bind.strip("[]") else f"[{bind.strip('[]')}]:{port}"
    argv = gateway.ssh_argv("-o", "LogLevel=VERBOSE", "-W", target, gateway.destination)
    how = shlex.join(argv)
    request = f"GET /v1/models HTTP/1.0\r\nHost: {bind.strip('[]')}:{port}\r\n\r\n"
    try:
        proc = subprocess.run(argv, input=request.encode(), capture_output=True, timeout=timeout_s)
        out, err, rc, timed_out = proc.stdout, proc.stderr, proc.returncode, False
    except FileNotFoundError:
        return _local_fallback(gateway, bind, port, "ssh is not on PATH", how)
    except subprocess.TimeoutExpired as exc:
        out, err, rc, timed_out = exc.stdout or b"", exc.stderr or b"", None, True
    text = err.decode(errors="replace")
    if out:
        first = out.decode(errors="replace").splitlines()[0].strip()
        return PortCheck("answers", f"answered: {first}", how)
    if "open failed" in text:
        reason = text.split("open failed:", 1)[1].splitlines()[0].strip()
        if "refused" in reason.lower():
            return PortCheck("free", "connection refused on the gateway host", how)
        return _local_fallback(gateway, bind, port, f"the gateway's sshd would not connect: {reason}", how)
    authenticated = "Authenticated to" in text
    if authenticated and (timed_out or rc == 0):
        return PortCheck("listening", "the gateway accepted the connection but no answer came back"
                         + (f" within {timeout_s:g}s" if timed_out else ""), how)
    last = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("Authenticated")]
    reason = last[-1].strip() if last else (f"no answer within {timeout_s:g}s" if timed_out else f"ssh exit {rc}")
    return _local_fallback(gateway, bind, port, f"ssh to the gateway failed: {reason}", how)


def _local_fallback(gateway: Gateway, bind: str, port: int, why: str, how: str) -> PortCheck:
    if not is_this_host(gateway.host):
        return PortCheck("unknown", why, how)
    try:
        with socket.create_connection((bind.strip("[]"), port), timeout=3):
            return PortCheck("listening", f"{why}; the gateway is this host and {bind}:{port} accepts connections",
                             f"connect {bind}:{port}")
    except ConnectionRefusedError:
        return PortCheck("free", f"{why}; the gateway is this host and {bind}:{port} refuses connections",
                         f"connect {bind}:{port}")
    except OSError as err:
        return PortCheck("unknown", f"{why}; connecting to {bind}:{port} here: {err}", f"connect {bind}:{port}")


def is_this_host(host: str) -> bool:
    """True when ``host`` resolves to an address of this machine (it can be bound here)."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    for family, _, _, _, sockaddr in infos:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.bind((sockaddr[0], 0))
                return True
        except OSError:
            continue
    return False
