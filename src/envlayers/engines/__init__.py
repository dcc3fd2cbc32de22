"""Engine command builders: Plan + launch keys -> the real server command line of every rank.

Pure: nothing here runs a process or reads the environment; the merged keys come in as
a mapping (a key missing from it is *absent*, ``""`` is *empty*: docs/keys.md).

``build_rank_command(plan, env, rank, master_addr)`` dispatches on ``INFERENCE_ENGINE``
to ``engines.sglang`` or ``engines.vllm``; both build on ``engines.command`` (the
:class:`RankCommand` record, the key helpers, and ``shell_line()``, the exact bash line the
job runs, or prints with the API key masked). ``engines.ray`` builds the ``ray start`` lines
of the Ray shapes, ``engines.choices`` checks values against each engine's own choices.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from .. import keys
from ..topology import Plan, RankPlan
from . import sglang, vllm
from .command import (  # noqa: F401  (the package's public names: the command and its printed line)
    EngineError,
    RankCommand,
    extra_args,
    redact,
    shell_line,
)

ENGINES: tuple[str, ...] = keys.allowed("INFERENCE_ENGINE")
"""Valid values of ``INFERENCE_ENGINE`` (the keys table declares them)."""


def rank_plan(plan: Plan, rank: int) -> RankPlan:
    if not 0 <= rank < len(plan.ranks):
        raise ValueError(f"rank {rank} is not in the plan (ranks 0..{len(plan.ranks) - 1})")
    return plan.ranks[rank]


def rendezvous_master(plan: Plan, master_addr: str) -> str:
    """``master_addr`` checked for a multi-node plan (kept verbatim: may be ``${NAME}``)."""
    if plan.multi_node and not master_addr:
        raise ValueError("a multi-node plan needs master_addr (the address of rank 0's node)")
    return master_addr


# --------------------------------------------------------------------------- dispatch


def engine_name(env: Mapping[str, str]) -> str:
    value = env.get("INFERENCE_ENGINE")
    valid = ", ".join(ENGINES)
    if value is None:
        raise EngineError(f"is not set; valid engines: {valid}", where="INFERENCE_ENGINE")
    if value.strip() == "":
        raise EngineError(f"is empty; valid engines: {valid}", where="INFERENCE_ENGINE")
    if value not in ENGINES:
        origin = getattr(env, "origins", {}).get("INFERENCE_ENGINE")  # keys.Located: the line that set it
        raise EngineError(f"unknown engine {value!r}; valid engines: {valid}",
                          where=f"{origin}: INFERENCE_ENGINE" if origin else "INFERENCE_ENGINE")
    return value


NODE_ADDR_REF = "${ENVLAYERS_NODE_ADDR}"
"""What the dry run shows for a rank's own node address (the launcher knows it only in the job)."""


def build_rank_command(plan: Plan, env: Mapping[str, str], rank: int, master_addr: str,
                       node_addr: str = NODE_ADDR_REF) -> RankCommand:
    """The server command of ``rank`` (an index into ``plan.ranks``).

    ``master_addr`` is the address of rank 0's node for the multi-node rendezvous; it may
    be a shell reference such as ``${ENVLAYERS_MASTER_ADDR}`` that the job fills in, and
    is kept verbatim. Ignored for single and replicas plans. ``node_addr`` is the address of
    the rank's own node (the engine announces it to its peers on a multi-node plan).
    """
    module = sglang if engine_name(env) == "sglang" else vllm
    return module.build(plan, env, rank_plan(plan, rank), rendezvous_master(plan, master_addr), node_addr)


def build_commands(plan: Plan, env: Mapping[str, str], master_addr: str,
                   node_addrs: Sequence[str] | None = None) -> tuple[RankCommand, ...]:
    """``build_rank_command`` for every rank of the plan, in rank order; ``node_addrs`` (one per node of
    the plan) gives each rank its own node's address, else the dry run's ``${ENVLAYERS_NODE_ADDR}``."""
    return tuple(build_rank_command(plan, env, r.rank, master_addr,
                                    node_addrs[r.node_index] if node_addrs is not None else NODE_ADDR_REF)
                 for r in plan.ranks)
