"""Who can reach the server: the refusal of a keyless server bound to every interface (login node).

On a cluster every node's fabric addresses are reachable from every other node, so a server bound
to every interface (``SERVER_HOST`` absent, ``0.0.0.0`` or ``::``) with no API key serves anyone on
the cluster. :func:`public_keyless` names that case; ``jobscript.prepare`` turns it into a blocker:
the dry run shows it with the fix, a submission is refused. The operator who means it says so with
``ALLOW_PUBLIC_UNAUTHENTICATED=1`` in a layer (docs/keys.md). Pure.
"""

from __future__ import annotations


from .apikey import GENERATE

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: the dry run must start fast
if TYPE_CHECKING:
    from typing import Mapping

ACK_KEY = "ALLOW_PUBLIC_UNAUTHENTICATED"
ALL_INTERFACES = frozenset({"0.0.0.0", "::", "[::]", "*"})
DEFAULT_HOST = "0.0.0.0"  # engines.DEFAULT_SERVER_HOST: an absent SERVER_HOST binds every interface


def binds_everywhere(env: Mapping[str, str]) -> bool:
    """Whether the server binds every interface of the node (an absent SERVER_HOST does)."""
    host = env.get("SERVER_HOST")
    return (DEFAULT_HOST if host is None else host.strip()) in ALL_INTERFACES


def public_keyless(env: Mapping[str, str]) -> str | None:
    """The refusal text when ``env`` serves every interface without a key and no acknowledgement;
    None when the server takes a key, binds one address, or the operator acknowledged it."""
    if not binds_everywhere(env) or env.get("SERVER_API_KEY_FILE"):
        return None
    if (env.get("CONTAINER_RUNTIME") or "").strip() == "podman":
        return None  # 0.0.0.0 is the container's own interface; the node publishes on 127.0.0.1 only
    ack = (env.get(ACK_KEY) or "").strip()
    if ack == "1":
        return None
    host = env.get("SERVER_HOST")
    bound = f"SERVER_HOST={host}" if host is not None else f"SERVER_HOST absent (binds {DEFAULT_HOST})"
    told = f" ({ACK_KEY}={ack!r} is not 1)" if ack and ack != "0" else ""
    return (f"the server binds every interface ({bound}) and takes no API key: anyone who can reach a node of "
            f"the cluster could use it{told}; fix: set SERVER_API_KEY_FILE={GENERATE} (a per-job key) or "
            f"SERVER_API_KEY_FILE=<your key file>, or bind one address (SERVER_HOST=127.0.0.1 with "
            f"`env_layers tunnel`), or acknowledge it in a layer with {ACK_KEY}=1 (docs/keys.md)")
