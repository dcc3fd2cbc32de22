"""A private OpenSSH server for tests: the "gateway host" that reverse tunnels go to.

``Sshd.start(folder)`` writes its own host key, a user key pair, ``authorized_keys``, a
``known_hosts`` line and an ``sshd_config`` (no PAM, no passwords, ``GatewayPorts`` off), and starts
Debian's ``/usr/sbin/sshd`` on a free port of ``listen`` (``127.0.0.1`` by default). ``netns=NAME``
runs it inside that network namespace (``ip netns exec``), e.g. a lab node's, so that it is a host of
the lab's private network. ``stop()`` ends it by its PID (checked against its command line), and the connection children
it forked (they hold the forwarded ports) with it; it runs in the foreground (``-D``) as a child
of the test process. Nothing here is reachable beyond the address given.

``ensure_openssh()`` installs openssh-server and openssh-client with apt-get when run as root and
they are missing (without starting the system service); otherwise it returns why it cannot.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from nettools import free_port

SSHD = "/usr/sbin/sshd"


def ensure_openssh() -> str | None:
    """``None`` when sshd, ssh and ssh-keygen are there (installing them if root); else the reason."""
    if Path(SSHD).exists() and shutil.which("ssh") and shutil.which("ssh-keygen"):
        return None
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return "openssh-server/openssh-client missing and not root with apt-get to install them"
    created = False
    guard = Path("/usr/sbin/policy-rc.d")
    if not guard.exists():  # keep the package scripts from starting the system sshd
        guard.write_text("#!/bin/sh\n# created by the envlayers tests during apt-get; removed after\nexit 101\n")
        guard.chmod(0o755)
        created = True
    try:
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        apt = ["apt-get", "-o", "DPkg::Lock::Timeout=120"]
        install = [*apt, "install", "-y", "-qq", "--no-install-recommends", "openssh-server", "openssh-client"]
        proc = subprocess.run(install, env=env, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            subprocess.run([*apt, "update", "-qq"], env=env, capture_output=True, timeout=600)
            proc = subprocess.run(install, env=env, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            return f"apt-get install openssh-server failed: {proc.stderr.strip()[-300:]}"
    finally:
        if created:
            guard.unlink(missing_ok=True)
    return None if Path(SSHD).exists() else "sshd still missing after apt-get install"


def _children(pid: int) -> list[int]:
    """Every descendant of ``pid`` (from /proc/*/stat), deepest last."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, todo = [], [pid]
    while todo:
        cur = todo.pop()
        kids = [p for p, pp in parents.items() if pp == cur]
        found += kids
        todo += kids
    return found


def pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


@dataclass
class Sshd:
    folder: Path
    listen: str
    port: int
    user: str
    netns: str | None = None
    pid: int | None = None
    _proc: subprocess.Popen | None = None

    @property
    def identity(self) -> Path:
        return self.folder / "user_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.folder / "known_hosts"

    @property
    def log(self) -> Path:
        return self.folder / "sshd.log"

    @property
    def destination(self) -> str:
        return f"{self.user}@{self.listen}"

    def client_options(self) -> list[str]:
        """``-o`` options a client needs to trust this server's host key and nothing else."""
        return [f"UserKnownHostsFile={self.known_hosts}", "GlobalKnownHostsFile=/dev/null",
                "StrictHostKeyChecking=yes", "IdentitiesOnly=yes", "ConnectTimeout=5"]

    def ssh_argv(self, *args: str) -> list[str]:
        argv = ["ssh", "-F", "/dev/null", "-p", str(self.port), "-i", str(self.identity), "-o", "BatchMode=yes"]
        for opt in self.client_options():
            argv += ["-o", opt]
        return [*argv, *args]

    def in_netns(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.netns, *argv] if self.netns else list(argv)

    @classmethod
    def start(cls, folder: Path, *, listen: str = "127.0.0.1", port: int | None = None, netns: str | None = None,
              extra_config: str = "") -> "Sshd":
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        import pwd

        user = pwd.getpwuid(os.geteuid()).pw_name
        port = port or free_port()
        for name in ("host_ed25519", "user_ed25519"):
            if not (folder / name).exists():
                subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"envlayers-test-{name}",
                                "-f", str(folder / name)], check=True, capture_output=True, timeout=30)
        (folder / "authorized_keys").write_text((folder / "user_ed25519.pub").read_text())
        host_pub = (folder / "host_ed25519.pub").read_text().split()
        (folder / "known_hosts").write_text(f"[{listen}]:{port} {host_pub[0]} {host_pub[1]}\n")
        config = folder / "sshd_config"
        config.write_text(
            f"Port {port}\nListenAddress {listen}\nHostKey {folder / 'host_ed25519'}\n"
            f"PidFile {folder / 'sshd.pid'}\nAuthorizedKeysFile {folder / 'authorized_keys'}\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
            "PermitRootLogin prohibit-password\nAllowTcpForwarding yes\nGatewayPorts no\n"
            "ClientAliveInterval 5\nClientAliveCountMax 2\nLogLevel VERBOSE\n" + extra_config)
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)
        server = cls(folder, listen, port, user, netns)
        (folder / "sshd.pid").unlink(missing_ok=True)
        # -D: stay in the foreground (daemon() fails where /dev/null is not the usual device); own session
        proc = subprocess.Popen(server.in_netns([SSHD, "-D", "-f", str(config), "-E", str(server.log)]),
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        server.pid = proc.pid  # `ip netns exec` execs sshd in place: the same PID
        server._proc = proc
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with socket.create_connection((listen, port), timeout=1):
                    return server
            except OSError:
                time.sleep(0.05)
        server.stop()
        raise RuntimeError(f"sshd on {listen}:{port} did not listen within 10s: {server.log_text()}")

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def listeners(self, port: int) -> str:
        """``ss -Hltnp 'sport = :PORT'`` where this server runs (its namespace)."""
        return subprocess.run(self.in_netns(["ss", "-Hltnp", f"sport = :{port}"]), capture_output=True,
                              text=True, timeout=10).stdout

    def stop(self) -> list[int]:
        """SIGTERM the server and every process it forked; returns the PIDs that were alive."""
        if self.pid is None:
            return []
        try:
            cmdline = Path(f"/proc/{self.pid}/cmdline").read_bytes()
        except OSError:
            cmdline = b""
        if str(self.folder / "sshd_config").encode() not in cmdline:
            return []  # gone already (or the PID was reused: not ours to kill)
        victims = [*reversed(_children(self.pid)), self.pid]
        for pid in victims:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(pid_alive(p) for p in victims):
            time.sleep(0.05)
        for pid in victims:
            if pid_alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if self._proc is not None:
            self._proc.wait(5)  # reap it: no zombie left behind
        return victims
