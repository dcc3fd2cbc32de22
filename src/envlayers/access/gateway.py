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
import socket
import subprocess
from dataclasses import dataclass

from ..errors import EnvLayersError
from ..urls import host_port_base
from .. import shell

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
    return host_port_base(remote_bind, remote_port)


def find_holder_commands(remote_port: int, holder: "PortHolder | None" = None) -> list[str]:
    """What to run on the gateway host to see and clear whatever holds ``remote_port``: the kill only
    for an ssh forward of the gateway user's own (another program, or another user's, is not ours to end)."""
    find = f"ss -ltnp 'sport = :{remote_port}'    # or: lsof -nP -iTCP:{remote_port} -sTCP:LISTEN"
    if holder is None or holder.kind == "unknown":
        return [find, "kill <the pid it names>    # only if it is an sshd: an earlier forward of yours; "
                      "another program: give the route another --remote-port"]
    if holder.kind == "forward" and holder.yours:
        pids = " ".join(str(p.pid) for p in holder.processes)
        return [find, f"kill {pids}    # the child sshd of the earlier forward; the listener closes with it"]
    return [find]


# ------------------------------------------------------------------------------------------ port holder

def printable(text: str) -> str:
    """A remote end's text made safe to print: control characters (escape sequences, NUL) become '?'."""
    return "".join(c if c.isprintable() else "?" for c in text)


@dataclass
class HolderProcess:
    command: str  # the process's command name, as ss names it (``sshd``, ``python3``)
    pid: int
    user: str | None = None  # from ps on the gateway host
    args: str | None = None  # its command line there (``sshd: alice@notty``)


@dataclass
class PortHolder:
    """What listens on a port of the gateway host, asked there (``ss -ltnp`` through its sshd).

    ``kind``: ``forward`` (an sshd: a reverse forward), ``program`` (another process), ``hidden``
    (a listener ss shows without its process: another user's), ``unknown`` (could not be asked)."""

    kind: str
    processes: list[HolderProcess]
    yours: bool  # every holder runs as the gateway user the tunnel logs in as
    detail: str  # in words, for the error line

    def to_dict(self) -> dict:
        from dataclasses import asdict

        return asdict(self)


_SS_USER_RE = re.compile(r'\("((?:[^"\\]|\\.)*)",pid=(\d+),')
_SSHD_NAMES = ("sshd", "sshd-session")


def _remote_user(gateway: Gateway, authenticated_as: str | None) -> str | None:
    if "@" in gateway.destination:
        return gateway.destination.rsplit("@", 1)[0]
    return authenticated_as


def holder_script(port: int) -> str:
    """The command run on the gateway host (by its user's shell): the listeners on ``port``, then for
    each PID they name, ``ENVLAYERS-PS PID USER ARGS``; exit 127 without ss."""
    return (f"command -v ss >/dev/null 2>&1 || exit 127; out=$(ss -Hltnp 'sport = :{int(port)}') || exit 3; "
            "printf '%s\\n' \"$out\"; echo ENVLAYERS-WHOAMI \"$(id -un)\"; "
            "for p in $(printf '%s\\n' \"$out\" | grep -o 'pid=[0-9]*' | cut -d= -f2 | sort -u); do "
            "printf 'ENVLAYERS-PS %s ' \"$p\"; ps -o user=,args= -p \"$p\" || echo; done")


def parse_holder(text: str, bind: str, port: int, gateway_user: str | None) -> PortHolder:
    """Classify what ``holder_script``'s output says listens on ``bind:port``."""
    wanted = bind.strip("[]")
    ps: dict[int, tuple[str, str]] = {}
    me = gateway_user
    listeners = []
    for line in text.splitlines():
        if line.startswith("ENVLAYERS-PS "):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1].isdigit():
                ps[int(parts[1])] = (parts[2], parts[3].strip() if len(parts) > 3 else "")
        elif line.startswith("ENVLAYERS-WHOAMI "):
            me = me or line.split(None, 1)[1].strip()
        elif line.strip():
            fields = line.split()
            local = next((f for f in fields if f.endswith(f":{port}")), None)
            if local is None:
                continue
            addr = local.rsplit(":", 1)[0].strip("[]").split("%")[0]
            if addr in (wanted, "0.0.0.0", "*", "::", "::ffff:" + wanted) or addr == "":
                listeners.append(line)
    procs: list[HolderProcess] = []
    for line in listeners:
        for name, pid in _SS_USER_RE.findall(line):
            if all(p.pid != int(pid) for p in procs):
                user, args = ps.get(int(pid), (None, None))
                if args and len(args) > 100:
                    args = args[:97] + "..."
                procs.append(HolderProcess(printable(name), int(pid), printable(user) if user else None,
                                           printable(args) if args else None))
    if not listeners:
        return PortHolder("unknown", [], False, f"ss on the gateway host lists no listener on {bind}:{port} now")
    if not procs:
        return PortHolder("hidden", [], False, "a listener whose process ss does not show to "
                          f"{me or 'the gateway user'}: it runs as another user")
    yours = bool(me) and all(p.user == me for p in procs)
    named = ", ".join(f"{p.command} (pid {p.pid}" + (f", user {p.user}" if p.user else "")
                      + (f": {p.args}" if p.args and p.args != p.command else "") + ")" for p in procs)
    if all(p.command in _SSHD_NAMES for p in procs):
        return PortHolder("forward", procs, yours, f"an ssh forward: {named}")
    return PortHolder("program", procs, yours, f"{named}, not an ssh forward")


def find_port_holder(gateway: Gateway, bind: str, port: int, timeout_s: float = 15.0) -> PortHolder:
    """Ask the gateway host what listens on ``bind:port`` (``ss -ltnp`` there, through its sshd)."""
    argv = gateway.ssh_argv("-T", gateway.destination, holder_script(port))
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout_s)
    except FileNotFoundError:
        return PortHolder("unknown", [], False, "ssh is not on PATH here, so the gateway host could not be asked")
    except subprocess.TimeoutExpired:
        return PortHolder("unknown", [], False, f"the gateway host did not say within {timeout_s:g}s")
    out = proc.stdout.decode(errors="replace")
    err = [ln for ln in proc.stderr.decode(errors="replace").splitlines() if ln.strip()]
    if proc.returncode == 127:
        return PortHolder("unknown", [], False, "the gateway host has no `ss` for its user")
    if proc.returncode != 0:
        why = printable(err[-1].strip()) if err else f"exit {proc.returncode}"
        return PortHolder("unknown", [], False, f"could not ask the gateway host ({why})")
    return parse_holder(out, bind, port, _remote_user(gateway, None))


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
    how = shell.words(argv)
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
