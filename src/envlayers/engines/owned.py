"""The server flags the plan and the exposure check decide, refused in ``SERVER_EXTRA_ARGS``.

The engines keep the last value of a repeated flag, and ``SERVER_EXTRA_ARGS`` comes after the flags the
launcher writes: ``--host 0.0.0.0`` there would undo the exposure check (a keyless server on every
interface), ``--pipeline-parallel-size 1`` would leave the nodes the plan asked for idle and billed. Each
such flag is refused before submission, naming the key that sets it instead.

Both engines' parsers are argparse's: a unique prefix of an option is that option (``--tp`` is SGLang's
``--tp-size``), and vLLM reads ``_`` as ``-`` in a flag's name; the option table (``data/<engine>-choices.json``,
generated from the real parsers) resolves such spellings here as the engine would.

Pure: data in, messages out.
"""

from __future__ import annotations

from typing import Iterable, Mapping

_PLAN_NODES = "the plan (INFERENCE_NODES, TENSOR_PARALLEL_SIZE, PIPELINE_PARALLEL_SIZE)"
_PLAN_DP = "the plan (INFERENCE_MODE, NUMBER_OF_INSTANCES, INFERENCE_NODES)"
_API_KEY = "SERVER_API_KEY_FILE (a file readable only by you)"

# engine -> {option string: what sets it instead}; every spelling the engine's parser has for it
OWNED: dict[str, dict[str, str]] = {
    "vllm": {
        "--host": "SERVER_HOST", "--port": "SERVER_PORT",
        "--model": "INFERENCE_MODEL", "--served-model-name": "VLLM_SERVED_MODEL", "--api-key": _API_KEY,
        "--tensor-parallel-size": "TENSOR_PARALLEL_SIZE", "-tp": "TENSOR_PARALLEL_SIZE",
        "--pipeline-parallel-size": "PIPELINE_PARALLEL_SIZE", "-pp": "PIPELINE_PARALLEL_SIZE",
        "--nnodes": _PLAN_NODES, "--node-rank": _PLAN_NODES, "--headless": _PLAN_NODES,
        "--master-addr": _PLAN_NODES, "--master-port": "RDZV_PORT",
        "--distributed-executor-backend": "DISTRIBUTED_BACKEND",
        "--data-parallel-size": _PLAN_DP, "-dp": _PLAN_DP,
        "--data-parallel-rank": _PLAN_DP, "-dpn": _PLAN_DP,
        "--data-parallel-start-rank": _PLAN_DP, "-dpr": _PLAN_DP,
        "--data-parallel-size-local": _PLAN_DP, "-dpl": _PLAN_DP,
        "--data-parallel-address": _PLAN_DP, "-dpa": _PLAN_DP,
        "--data-parallel-rpc-port": "DATA_PARALLEL_RPC_PORT", "-dpp": "DATA_PARALLEL_RPC_PORT",
    },
    "sglang": {
        "--host": "SERVER_HOST", "--port": "SERVER_PORT",
        "--model-path": "INFERENCE_MODEL", "--model": "INFERENCE_MODEL",
        "--served-model-name": "VLLM_SERVED_MODEL", "--api-key": _API_KEY,
        "--tp-size": "TENSOR_PARALLEL_SIZE", "--tensor-parallel-size": "TENSOR_PARALLEL_SIZE",
        "--pp-size": "PIPELINE_PARALLEL_SIZE", "--pipeline-parallel-size": "PIPELINE_PARALLEL_SIZE",
        "--dp-size": _PLAN_DP, "--data-parallel-size": _PLAN_DP,
        "--nnodes": _PLAN_NODES, "--node-rank": _PLAN_NODES, "--dist-init-addr": "RDZV_PORT and the plan's head node",
    },
}


def _name(word: str, engine: str) -> str | None:
    """The option name ``word`` spells (``--flag=value`` -> ``--flag``; vLLM's ``_`` read as ``-``), or None for a value."""
    if not word.startswith("-") or word in ("-", "--"):
        return None
    name = word.partition("=")[0]
    if engine == "vllm" and name.startswith("--"):
        name = "--" + name[2:].replace("_", "-")
    return name


def resolve(word: str, engine: str, options: Iterable[str]) -> str | None:
    """The option the engine's parser reads ``word`` (``--flag`` or ``--flag=value``) as, or None when it is
    not an option (a value) or matches none or several (the engine refuses those itself)."""
    name = _name(word, engine)
    if name is None:
        return None
    known = set(options) | set(OWNED.get(engine, ()))
    if name in known:
        return name
    if not name.startswith("--"):
        return None
    found = [o for o in known if o.startswith(name)]
    return found[0] if len(found) == 1 else None


def refusals(extra: Iterable[str], engine: str, options: Iterable[str], where: str) -> list[str]:
    """One message per flag of ``extra`` (SERVER_EXTRA_ARGS, split) that the plan or the exposure check
    decides; ``where`` is SERVER_EXTRA_ARGS's file:line. Linear in ``extra``: only a word that is an owned
    option, or a prefix of one, is resolved against the whole table."""
    owned = OWNED.get(engine, {})
    options = tuple(options)
    out: list[str] = []
    for word in extra:
        name = _name(word, engine)
        maybe_owned = name is not None and (name in owned or name.startswith("--")
                                            and any(o.startswith(name) for o in owned))
        if not maybe_owned:
            continue
        option = resolve(word, engine, options)
        if option in owned:
            spelled = word.partition("=")[0]
            as_typed = spelled if spelled == option else f"{spelled} (the engine reads it as {option})"
            message = (f"SERVER_EXTRA_ARGS ({where}): {as_typed} is decided by {owned[option]}; the engine keeps "
                       f"the last {option} it is given, so this one would override it: set {owned[option]} instead "
                       "and take the flag out")
            if message not in out:
                out.append(message)
    return out
