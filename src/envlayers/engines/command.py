"""One rank's server command (:class:`RankCommand`), the key helpers every engine builds it with, and the
bash line it is printed as (:func:`shell_line`, the API key masked).

Pure: the merged keys come in as a mapping (a key missing from it is *absent*, ``""`` is *empty*:
docs/keys.md). For a key that maps to an engine flag: absent -> the flag with the launcher's default (if it
has one), empty -> the flag is omitted, a value -> the flag with that value.
"""

from __future__ import annotations

import shlex
from typing import Iterable, Mapping, NamedTuple

from .. import keys
from ..errors import EnvLayersError
from ..shell import word_with_refs

DEFAULT_SERVER_HOST = "0.0.0.0"
REDACTED = "***"
API_KEY_FLAG = "--api-key"

# Variables set on the server command itself when their key has a value: the CE
# netstack hook writes its own defaults into the container after the step
# environment, so only an assignment on the command line wins. Every fabric setting a
# layer gives (NCCL's, libfabric's, RCCL's) goes there, not only these two.
COMMAND_ENV_KEYS: tuple[str, ...] = ("NCCL_NET_GDR_LEVEL", "NCCL_SOCKET_IFNAME")
COMMAND_ENV_PREFIXES: tuple[str, ...] = ("NCCL_", "FI_", "RCCL_")


class EngineError(EnvLayersError):
    """A launch key the engine command cannot be built from."""


class _RankCommandFields(NamedTuple):
    argv: tuple[str, ...]
    env: dict[str, str]
    key_env: str | None = None
    key_flag: str | None = None


class RankCommand(_RankCommandFields):
    """The server command of one rank: ``argv`` as exec'd, ``env`` assigned on the command.

    The API key itself is never part of it: ``key_env`` names the variable the engine reads
    the key from (vLLM: ``VLLM_API_KEY``), ``key_flag`` the flag it must be given on the
    command line instead (SGLang: ``--api-key``, appended after ``argv``). ranks.sh fills
    either in from the rank's ``SERVER_API_KEY`` at run time.

    A named tuple (``_replace`` for a changed copy); ``env`` left out is a new empty dict of its own.
    """

    __slots__ = ()

    def __new__(cls, argv: tuple[str, ...], env: dict[str, str] | None = None, key_env: str | None = None,
                key_flag: str | None = None) -> RankCommand:
        return super().__new__(cls, argv, {} if env is None else env, key_env, key_flag)


# --------------------------------------------------------------------------- key helpers


def required(env: Mapping[str, str], key: str, what: str) -> str:
    """The value of a key that must be set and non-empty."""
    value = env.get(key)
    if value is None:
        raise EngineError(f"is not set; it names {what}", where=key)
    if value.strip() == "":
        raise EngineError(f"is empty; it must name {what}", where=key)
    return value


def flag(env: Mapping[str, str], key: str, name: str, default: str | None = None) -> list[str]:
    """``[name, value]`` by the absent-vs-empty rule, or ``[]`` when the flag is omitted.

    absent -> ``default`` (omitted when there is none), empty -> omitted, value -> value.
    """
    value = env.get(key)
    if value is None:
        value = default
    if value is None or value == "":
        return []
    return [name, value]


def server_host(env: Mapping[str, str], nodes: int = 1) -> str:
    """The engine's ``--host``: ``SERVER_HOST``, absent -> 0.0.0.0, empty -> error (the engine's default is
    loopback). Under ``CONTAINER_RUNTIME=podman`` on one node the engine binds the container's own interface
    (0.0.0.0), which the publish needs; SERVER_HOST then decides only where the node publishes the port. A
    plan of ``nodes`` > 1 runs podman on the node's network, where the engine binds SERVER_HOST itself
    (runtimes/podman.py)."""
    value = env.get("SERVER_HOST")
    if (keys.text(env, "CONTAINER_RUNTIME") == "podman" and nodes == 1
            and (value is None or value.strip() != "")):
        return DEFAULT_SERVER_HOST
    if value is None:
        return DEFAULT_SERVER_HOST
    if value.strip() == "":
        raise EngineError(
            "is empty; it must be the address the server binds",
            where="SERVER_HOST",
            hint=f"set SERVER_HOST={DEFAULT_SERVER_HOST} to bind every interface, or 127.0.0.1 for the node alone",
        )
    return value


def extra_args(env: Mapping[str, str]) -> list[str]:
    """``SERVER_EXTRA_ARGS`` split like a shell would; absent or empty -> none."""
    value = env.get("SERVER_EXTRA_ARGS")
    if value is None or value.strip() == "":
        return []
    try:
        return shlex.split(value)
    except ValueError as err:
        raise EngineError(f"cannot be split like a shell would: {err}", where="SERVER_EXTRA_ARGS") from None


def command_env(env: Mapping[str, str]) -> dict[str, str]:
    """Variables to assign on the server command: ``NCCL_NET_GDR_LEVEL`` and ``NCCL_SOCKET_IFNAME`` when they
    have a value, then every other ``NCCL_*``, ``FI_*`` and ``RCCL_*`` key with a value, by name (``env``
    holds the launch keys, so only what a layer set)."""
    out = {key: env[key] for key in COMMAND_ENV_KEYS if env.get(key)}
    for key in sorted(env):
        if key.startswith(COMMAND_ENV_PREFIXES) and key not in out and env.get(key):
            out[key] = env[key]
    return out


def drop_flag(args: Iterable[str], names: Iterable[str]) -> list[str]:
    """``args`` without the flags ``names`` and their values (``--f v`` and ``--f=v``)."""
    names = tuple(names)
    out: list[str] = []
    items = list(args)
    i = 0
    while i < len(items):
        arg = items[i]
        if arg in names:
            i += 2 if i + 1 < len(items) and not items[i + 1].startswith("-") else 1
            continue
        if any(arg.startswith(n + "=") for n in names):
            i += 1
            continue
        out.append(arg)
        i += 1
    return out


# --------------------------------------------------------------------------- printing


def redact(argv: Iterable[str]) -> tuple[str, ...]:
    """``argv`` with the value of every ``--api-key`` masked as ``***``."""
    out: list[str] = []
    mask_next = False
    for arg in argv:
        if mask_next:
            out.append(REDACTED)
            mask_next = False
        elif arg == API_KEY_FLAG:
            out.append(arg)
            mask_next = True
        elif arg.startswith(API_KEY_FLAG + "="):
            out.append(f"{API_KEY_FLAG}={REDACTED}")
        else:
            out.append(arg)
    return tuple(out)


def shell_line(cmd: RankCommand, redact: bool = True) -> str:
    """The bash line a rank runs: ``NAME=value ... argv...``, assignments sorted by name.

    The API key shows as ``***`` where the rank passes it (``VLLM_API_KEY=***`` or
    ``--api-key ***``); with ``redact`` (the default) an ``--api-key`` inside the arguments
    (``SERVER_EXTRA_ARGS``) is masked too. For printing only: ranks.sh is written by
    ``envlayers.launch.ranks``, which quotes every value so it reaches the engine as it is.
    """
    argv = _redact(cmd.argv) if redact else cmd.argv
    env = dict(cmd.env)
    if cmd.key_env:
        env[cmd.key_env] = REDACTED
    words = [f"{name}={word_with_refs(value)}" for name, value in sorted(env.items())]
    words.extend(word_with_refs(arg) for arg in argv)
    if cmd.key_flag:
        words += [cmd.key_flag, word_with_refs(REDACTED)]
    return " ".join(words)


def has_key(env: Mapping[str, str]) -> bool:
    """Whether the rank gets an API key (``SERVER_API_KEY`` has a value)."""
    return bool(env.get("SERVER_API_KEY"))


_redact = redact
