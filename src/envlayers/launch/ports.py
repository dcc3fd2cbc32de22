"""Which TCP ports node 0 can bind now: the one check behind the rendezvous port and the router's ports.

A port is free when a listener could bind it. The check binds with SO_REUSEADDR, as the engines', Ray's
(gRPC, torch's TCP store) and the router's (Rust's standard listener) do: a port whose last connection of
such a listener lingers in TIME_WAIT (a previous job's rendezvous or router) is free to them, so it is free
here; a port a listener holds is not.
"""

from __future__ import annotations

import socket


def port_free(port: int, host: str = "0.0.0.0") -> bool:
    """Whether a listener could bind ``host:port`` now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def ports_in_use(start: int, count: int, host: str = "0.0.0.0") -> frozenset[int]:
    """The ports in ``start .. start+count-1`` that a listener could not bind now."""
    return frozenset(p for p in range(start, min(start + count, 65536)) if not port_free(p, host))
