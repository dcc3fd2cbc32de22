"""The head node's fabric interfaces for a multi-node server (docs/keys.md, ENVLAYERS_HSN_IFACE).

Interfaces are matched as ``<prefix><digits>`` (default prefix ``hsn``), so VLAN children such as
``hsn0.561`` are left out. ``matching`` is pure; ``local_ipv4`` reads this node's interfaces.
"""

from __future__ import annotations

import re

DEFAULT_PREFIX = "hsn"


def matching(ifaces: dict[str, str | None], prefix: str = DEFAULT_PREFIX) -> list[tuple[str, str]]:
    """``(name, ipv4)`` of the interfaces named ``<prefix><digits>`` (or exactly ``prefix``, so an
    interface name works too) that have an IPv4 address, sorted."""
    pattern = re.compile(re.escape(prefix) + r"(\d+)?")
    return sorted((name, addr) for name, addr in ifaces.items() if pattern.fullmatch(name) and addr)


def local_ipv4() -> dict[str, str | None]:
    """This node's interfaces and their IPv4 address (None when an interface has none)."""
    import fcntl
    import socket
    import struct

    out: dict[str, str | None] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(sock.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))  # SIOCGIFADDR
                out[name] = socket.inet_ntoa(packed[20:24])
            except OSError:
                out[name] = None
    return out
