"""The head node's fabric interfaces for a multi-node server (docs/keys.md, ENVLAYERS_HSN_IFACE).

Interfaces are matched as ``<prefix><digits>`` (default prefix ``hsn``), so VLAN children such as
``hsn0.561`` are left out. ``matching`` and ``choose`` are pure; ``local_ipv4`` reads this node's interfaces.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .joblines import TOPOLOGY, WARN

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


@dataclass(frozen=True)
class FabricChoice:
    """What the launcher says about the head node's fabric, and what it sets (pure result)."""

    lines: tuple[str, ...]  # ENVLAYERS-TOPOLOGY / ENVLAYERS-WARN lines, in order
    socket_ifname: str | None  # NCCL_SOCKET_IFNAME to derive; None: leave it as the layers have it
    error: str | None  # the launch must stop before srun: an interface the operator asked for is missing


def choose(ifaces: dict[str, str | None], asked: str | None, layers_ifname: str | None) -> FabricChoice:
    """Name the fabric interfaces, derive NCCL_SOCKET_IFNAME from them unless the layers set it
    (``layers_ifname``), and refuse when the prefix the operator asked for (``asked``,
    ENVLAYERS_HSN_IFACE) matches nothing."""
    prefix = asked or DEFAULT_PREFIX
    found = matching(ifaces, prefix)
    lines = [TOPOLOGY.line(f"iface {name} {addr}") for name, addr in found]
    if not found:
        have = ", ".join(sorted(n for n, a in ifaces.items() if a and n != "lo")) or "none"
        if asked:
            return FabricChoice((), None, f"no routable fabric IPv4 address on the head node: no interface "
                                          f"{prefix}<N> with an IPv4 address (have: {have}); check ENVLAYERS_HSN_IFACE")
        return FabricChoice((WARN.line(f"no {prefix}<N> interface with an IPv4 address on the head node "
                                       f"(have: {have}); NCCL picks its interface itself (set ENVLAYERS_HSN_IFACE to "
                                       "require one)"),), None, None)
    if layers_ifname:
        return FabricChoice((*lines, TOPOLOGY.line(f"nccl_socket_ifname={layers_ifname} (from the layers)")),
                            None, None)
    # one leading "=" makes the whole list exact names (NCCL), so hsn0.561 stays out
    derived = "=" + ",".join(name for name, _ in found)
    return FabricChoice((*lines, TOPOLOGY.line(f"nccl_socket_ifname={derived} (derived)")), derived, None)
