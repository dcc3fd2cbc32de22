"""Ports on this machine for the tests: a free one, and one held only by a connection in TIME_WAIT."""

from __future__ import annotations

import socket
import time
from pathlib import Path


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the OS's pick; free until someone binds it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def time_wait_port() -> int:
    """A port whose only socket is a SO_REUSEADDR listener's connection in TIME_WAIT (the server closed first)."""
    from envlayers.launch.ports import ports_in_use

    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("0.0.0.0", 0))
        listener.listen()
        port = listener.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        server_side, _ = listener.accept()
        server_side.close()  # the active close: TIME_WAIT on the server's port
        client.recv(1)
        client.close()
        assert port in ports_in_use(port, 1)  # held while the listener lives
    deadline = time.monotonic() + 30
    while tcp_states(port) != {"06"} and time.monotonic() < deadline:  # the server's socket reaches TIME_WAIT
        time.sleep(0.01)
    assert tcp_states(port) == {"06"}
    return port


def tcp_states(port: int) -> set[str]:
    """The states (/proc/net/tcp's hex codes; 06 is TIME_WAIT) of the sockets bound locally to ``port``."""
    states = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        if int(local.split(":")[1], 16) == port:
            states.add(state)
    return states
