"""Who can reach the server: the refusal of a keyless server that others can reach (login node).

On a cluster every node's fabric addresses are reachable from every other node, so a server bound to
every interface, or to any address but loopback, with no API key serves anyone on the cluster.
:func:`public_keyless` names that case; ``jobscript.prepare`` turns it into a blocker: the dry run shows
it with the fix, a submission is refused. The operator who means it says so with
``ALLOW_PUBLIC_UNAUTHENTICATED=1`` in a layer (docs/keys.md).

What the server binds is decided from the address the engine's bind would parse, never from the spelling:
the engines bind through the C library, which reads ``0``, ``0x0``, ``0.0`` and ``000.000.000.000`` as
0.0.0.0 (the classic ``inet_aton`` forms) and ``::0``, ``0:0:0:0:0:0:0:0`` and ``::ffff:0.0.0.0`` as every
interface too. So :func:`parse_host` reads ``SERVER_HOST`` as those forms, or as a host name, and refuses
anything else; :func:`reach` classifies the result: loopback alone is private (``127.0.0.0/8``, ``::1``,
their IPv4-mapped forms, ``localhost``), every other address and host name can be reached from other
nodes. Pure.
"""

from __future__ import annotations

import re
from typing import Mapping

from .apikey import GENERATE
from .errors import EnvLayersError

ACK_KEY = "ALLOW_PUBLIC_UNAUTHENTICATED"
DEFAULT_HOST = "0.0.0.0"  # engines.DEFAULT_SERVER_HOST: an absent SERVER_HOST binds every interface
KEY = "SERVER_HOST"
EVERY_INTERFACE, ROUTABLE, LOOPBACK, UNKNOWN = "every interface", "routable", "loopback", "unknown"  # reach()
_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)\Z")  # one label of a host name (RFC 1123)
_NUMERIC_PART = re.compile(r"0[xX][0-9A-Fa-f]*|[0-9]+")  # a part of what inet_aton reads as a number
_LIMITS = {1: 0xFFFFFFFF, 2: 0xFFFFFF, 3: 0xFFFF, 4: 0xFF}  # the last part's limit, by the number of parts
HOST_HINT = (f"give an IP address or a host name: 127.0.0.1 (this node only, e.g. behind `env_layers tunnel`), "
             f"{DEFAULT_HOST} (every interface) or the node's name")


def inet_aton(text: str) -> int | None:
    """The IPv4 address the C library's ``inet_aton`` (and so ``getaddrinfo``, and so the engine's bind)
    reads in ``text``, as a number; None when it reads none. One to four parts separated by dots, each
    decimal, octal with a leading ``0`` or hexadecimal with ``0x``; the last part fills the bytes left
    (``127.1`` is 127.0.0.1, ``0`` is 0.0.0.0)."""
    parts = text.split(".")
    if not 1 <= len(parts) <= 4:
        return None
    values = []
    for part in parts:
        if not _NUMERIC_PART.fullmatch(part):
            return None
        if part[:2] in ("0x", "0X"):
            if len(part) == 2:
                return None  # glibc wants a digit after 0x
            value = int(part[2:], 16)
        elif part.startswith("0"):
            if not all(c in "01234567" for c in part):
                return None
            value = int(part, 8)
        else:
            value = int(part)
        values.append(value)
    if any(v > 0xFF for v in values[:-1]) or values[-1] > _LIMITS[len(values)]:
        return None
    number = 0
    for v in values[:-1]:
        number = number << 8 | v
    return number << 8 * (5 - len(values)) | values[-1]


def _is_host_name(text: str) -> bool:
    labels = text[:-1].split(".") if text.endswith(".") else text.split(".")
    return (len(text) <= 253 and all(_LABEL.match(label) for label in labels)
            and not labels[-1].isdigit())  # an all-digit last label reads as an address, not a name


def parse_host(text: str):
    """``SERVER_HOST`` as the engine's bind reads it: an ``ipaddress`` address, or the host name as a
    ``str``; an ``EnvLayersError`` (exit 2) naming the key for anything else."""
    import ipaddress

    shown = text if len(text) <= 80 else text[:77] + "..."
    if text != text.strip() or not text or any(ord(c) < 0x21 or ord(c) == 0x7F for c in text):
        raise EnvLayersError(f"{shown!r} holds a blank or a control character: it is not an address or a host "
                             "name", where=KEY, hint=HOST_HINT)
    try:
        return ipaddress.ip_address(text)  # dotted IPv4, every IPv6 form (with a %scope too)
    except ValueError:
        pass
    if all(_NUMERIC_PART.fullmatch(p) for p in text.split(".")):  # numbers and dots: an address or nothing
        number = inet_aton(text)
        if number is None:
            raise EnvLayersError(f"{shown!r} is not an IPv4 address (the parts must be numbers of at most 255, "
                                 "a leading 0 means octal) and not a host name", where=KEY, hint=HOST_HINT)
        return ipaddress.IPv4Address(number)
    if text.startswith("[") and text.endswith("]"):
        raise EnvLayersError(f"{shown!r}: an address is written without brackets here", where=KEY,
                             hint=f"write {text[1:-1]!r}")
    if not _is_host_name(text):
        raise EnvLayersError(f"{shown!r} is not an IP address or a host name (letters, digits and '-' in labels "
                             "separated by dots)", where=KEY, hint=HOST_HINT)
    return text.lower()


def reach(host: str | None) -> tuple[str, str]:
    """(EVERY_INTERFACE | ROUTABLE | LOOPBACK | UNKNOWN, what the server binds, in words) for a
    ``SERVER_HOST`` value (None: absent, which binds every interface)."""
    if host is None:
        return EVERY_INTERFACE, f"{KEY} absent (binds {DEFAULT_HOST})"
    if "${" in host:  # a reference the job's shell expands (Env.text() writes it so): the login node cannot tell
        return UNKNOWN, f"{KEY}={host}, decided in the job"
    address = parse_host(host)
    if isinstance(address, str):
        if address == "localhost" or address.rstrip(".").endswith(".localhost"):
            return LOOPBACK, f"{KEY}={host}"
        return ROUTABLE, f"{KEY}={host}, a host name other nodes resolve to this node"
    mapped = getattr(address, "ipv4_mapped", None) or address
    spelled = "" if str(address) == host else f", which is {address}"
    if mapped.is_unspecified:
        return EVERY_INTERFACE, f"{KEY}={host}{spelled}"
    if mapped.is_loopback:
        return LOOPBACK, f"{KEY}={host}{spelled}"
    return ROUTABLE, f"{KEY}={host}{spelled}, an address other nodes reach"


def loopback_host(env: Mapping[str, str]) -> str | None:
    """The host to reach the server at, from its own node, when ``SERVER_HOST`` binds loopback only
    (``127.0.0.1``, ``[::1]``; ``localhost`` is reached at 127.0.0.1); None when other nodes can reach it."""
    host = env.get(KEY)
    if reach(host)[0] != LOOPBACK:
        return None
    address = parse_host(host)
    if isinstance(address, str):  # localhost and its subdomains
        return "127.0.0.1"
    address = getattr(address, "ipv4_mapped", None) or address
    return f"[{address}]" if address.version == 6 else str(address)


def loopback_unreachable(env: Mapping[str, str], serving_nodes: list[int]) -> str | None:
    """The refusal when the server binds loopback only and a rank that must answer runs on another node
    than the launcher's (node 0): the launcher could never see it, nor could a tunnel from node 0."""
    host = env.get(KEY)
    others = sorted({n for n in serving_nodes if n != 0})
    if not others or loopback_host(env) is None:
        return None
    return (f"the server binds loopback only ({KEY}={host}), but this shape serves on {len(others)} node(s) "
            f"besides the first (node index {', '.join(map(str, others))}), whose loopback neither the launcher "
            "nor a tunnel reaches; fix: bind every interface with a key (SERVER_HOST=0.0.0.0 and "
            f"SERVER_API_KEY_FILE={GENERATE}), or serve from one node")


def public_keyless(env: Mapping[str, str]) -> str | None:
    """The refusal text when ``env`` serves an address other nodes reach (every interface, a routable
    address or host name, or one the job decides) without a key and no acknowledgement; None when the
    server takes a key, binds loopback only, or the operator acknowledged it. A ``SERVER_HOST`` that is
    neither an address nor a host name is an ``EnvLayersError`` whatever the rest says."""
    kind, bound = reach(env.get(KEY))
    if kind == LOOPBACK or env.get("SERVER_API_KEY_FILE"):
        return None
    ack = (env.get(ACK_KEY) or "").strip()
    if ack == "1":
        return None
    what = "every interface" if kind == EVERY_INTERFACE else "an address other nodes can reach"
    told = f" ({ACK_KEY}={ack!r} is not 1)" if ack and ack != "0" else ""
    return (f"the server binds {what} ({bound}) and takes no API key: anyone who can reach a node of "
            f"the cluster could use it{told}; fix: set SERVER_API_KEY_FILE={GENERATE} (a per-job key) or "
            f"SERVER_API_KEY_FILE=<your key file>, or bind loopback only (SERVER_HOST=127.0.0.1 with "
            f"`env_layers tunnel`), or acknowledge it in a layer with {ACK_KEY}=1 (docs/keys.md)")
