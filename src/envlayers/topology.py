"""Deployment shape: nodes x GPUs x TP x PP -> a Plan of ranks, roles and ports.

Pure: ``plan()`` takes the merged launch keys (key -> final string; a key missing from
the mapping is *absent*, ``""`` is *empty*, see docs/keys.md) and either returns a
``Plan`` or raises ``TopologyError`` naming the key(s), what the mistake would cost,
and how to fix it. Nothing here reads the environment, files or Slurm.

Shapes
------
``single``
    One server on one node. ``tp x pp`` may use fewer GPUs than the node has (legal:
    asking for less than you allocated is a choice), never more.
``pipeline``
    One server instance across ``INFERENCE_NODES`` nodes, one rank per node; rank 0
    serves the API, ranks > 0 join through the rendezvous port. ``tp x pp`` must equal
    ``INFERENCE_NODES x GPUS_PER_NODE``: fewer would leave GPUs idle and billed for the
    whole walltime, more cannot start.
``replicas``
    ``INFERENCE_MODE=replicas``: one independent server per node, each on the same
    port, each with its own endpoint; ``tp x pp`` must fit one node.

``INFERENCE_MODE`` absent or empty is derived: one node -> ``single``, more ->
``pipeline``. ``INFERENCE_MODE=single`` or ``pipeline`` on one node plans ``single``
(a pipeline within one node needs no rendezvous); ``single`` on several nodes is an
error (the other nodes would sit idle).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, Mapping

from envlayers.errors import TopologyError

Shape = Literal["single", "pipeline", "replicas"]

MODES: tuple[str, ...] = ("single", "pipeline", "replicas")
"""Valid values of ``INFERENCE_MODE``."""

DEFAULT_NODES = 1
DEFAULT_GPUS_PER_NODE = 4
DEFAULT_PIPELINE_PARALLEL_SIZE = 1
DEFAULT_SERVER_PORT = 8000
DEFAULT_RDZV_PORT = 29500

TOPOLOGY_PREFIX = "ENVLAYERS-TOPOLOGY:"

_INT_RE = re.compile(r"[0-9]+")


@dataclass(frozen=True)
class RankPlan:
    """One srun task (one per node).

    ``serves_api`` is true for the rank(s) that bind ``port`` and answer readiness:
    rank 0 of a single or pipeline server, every rank of a replicas plan. ``port`` is
    ``None`` on a rank that serves no API (a pipeline worker).
    """

    rank: int
    node_index: int
    serves_api: bool
    port: int | None


@dataclass(frozen=True)
class Plan:
    """What the launcher deploys. ``tp`` and ``pp`` are per server instance."""

    shape: Shape
    nodes: int
    gpus_per_node: int
    tp: int
    pp: int
    replicas: int
    ranks: tuple[RankPlan, ...]
    api_port: int
    rdzv_port: int
    notes: tuple[str, ...] = ()

    @property
    def world(self) -> int:
        """GPUs one server instance uses (``tp x pp``)."""
        return self.tp * self.pp

    @property
    def multi_node(self) -> bool:
        """True when one instance spans nodes and the ranks need the rendezvous."""
        return self.shape == "pipeline"

    @property
    def gpus_used(self) -> int:
        """GPUs all instances together use."""
        return self.world * self.replicas

    def readiness_ranks(self) -> tuple[RankPlan, ...]:
        """The ranks that must answer ``/v1/models`` before the endpoint is live.

        Rank 0 for single and pipeline plans (pipeline workers may run a dummy health
        server that always says OK: never probe them); every replica for replicas.
        """
        return tuple(r for r in self.ranks if r.serves_api)

    def readiness_ports(self) -> tuple[tuple[int, int], ...]:
        """``(node_index, port)`` for every rank in :meth:`readiness_ranks`."""
        return tuple((r.node_index, r.port) for r in self.readiness_ranks() if r.port is not None)


# --------------------------------------------------------------------------- parsing


def _positive_int(env: Mapping[str, str], key: str, default: int | None, *, default_text: str = "") -> int:
    value = env.get(key)
    if value is None:
        if default is None:  # pragma: no cover - every caller passes a default
            raise TopologyError("is not set", where=key)
        return default
    text = value.strip()
    if text == "":
        shown = default_text or str(default)
        raise TopologyError(
            "is empty; it must be a positive integer",
            where=key,
            hint=f"delete the line to use the default ({shown}), or set a value",
        )
    if not _INT_RE.fullmatch(text):
        raise TopologyError(f"must be a positive integer, got {value!r}", where=key)
    number = int(text)
    if number <= 0:
        raise TopologyError(f"must be a positive integer, got {value!r}", where=key)
    return number


def _port(env: Mapping[str, str], key: str, default: int) -> int:
    value = env.get(key)
    if value is None:
        return default
    text = value.strip()
    if text == "":
        raise TopologyError(
            "is empty; it must be a TCP port (1-65535)",
            where=key,
            hint=f"delete the line to use the default ({default}), or set a port",
        )
    if not _INT_RE.fullmatch(text) or not 1 <= int(text) <= 65535:
        raise TopologyError(f"must be a TCP port (1-65535), got {value!r}", where=key)
    return int(text)


def _mode(env: Mapping[str, str]) -> str | None:
    value = env.get("INFERENCE_MODE")
    if value is None or value.strip() == "":
        return None
    mode = value.strip()
    if mode not in MODES:
        raise TopologyError(
            f"unknown mode {value!r}; valid modes: {', '.join(MODES)}",
            where="INFERENCE_MODE",
            hint="set it empty (or delete it) to derive the mode from INFERENCE_NODES and TENSOR_PARALLEL_SIZE x PIPELINE_PARALLEL_SIZE",
        )
    return mode


# --------------------------------------------------------------------------- errors

_TP_PP = "TENSOR_PARALLEL_SIZE x PIPELINE_PARALLEL_SIZE"
_WHERE_TP_PP = "TENSOR_PARALLEL_SIZE, PIPELINE_PARALLEL_SIZE"


def _alloc_text(nodes: int, gpn: int) -> str:
    return f"INFERENCE_NODES x GPUS_PER_NODE = {nodes} x {gpn} = {nodes * gpn} GPU(s) are allocated"


def _idle_error(nodes: int, gpn: int, tp: int, pp: int) -> TopologyError:
    total = nodes * gpn
    used = tp * pp
    fixes: list[str] = []
    if total % tp == 0:
        fixes.append(f"set PIPELINE_PARALLEL_SIZE={total // tp}")
    else:
        fixes.append(f"set TENSOR_PARALLEL_SIZE={gpn} and PIPELINE_PARALLEL_SIZE={nodes}")
    if used <= gpn:
        fixes.append("INFERENCE_MODE=replicas for independent servers")
    elif used % gpn == 0:
        fixes.append(f"INFERENCE_NODES={used // gpn}")
    return TopologyError(
        f"{_TP_PP} = {tp} x {pp} uses {used} GPU(s), but {_alloc_text(nodes, gpn)}; "
        f"{total - used} GPU(s) would sit idle and be billed for the whole walltime",
        where=_WHERE_TP_PP,
        hint=", or ".join(fixes),
    )


def _missing_error(nodes: int, gpn: int, tp: int, pp: int) -> TopologyError:
    total = nodes * gpn
    used = tp * pp
    fixes: list[str] = []
    if used % gpn == 0:
        fixes.append(f"set INFERENCE_NODES={used // gpn}")
    if total % tp == 0:
        fixes.append(f"PIPELINE_PARALLEL_SIZE={total // tp}")
    elif total % pp == 0:
        fixes.append(f"TENSOR_PARALLEL_SIZE={total // pp}")
    if not fixes:
        fixes.append(f"set TENSOR_PARALLEL_SIZE={gpn} and PIPELINE_PARALLEL_SIZE={nodes}")
    elif not fixes[0].startswith("set "):
        fixes[0] = "set " + fixes[0]
    return TopologyError(
        f"{_TP_PP} = {tp} x {pp} needs {used} GPU(s), but {_alloc_text(nodes, gpn)}; "
        f"{used - total} GPU(s) are missing, so the server would fail at start after the job waited in the queue",
        where=_WHERE_TP_PP,
        hint=", or ".join(fixes),
    )


def _replica_too_big_error(nodes: int, gpn: int, tp: int, pp: int) -> TopologyError:
    used = tp * pp
    fixes = []
    if used == nodes * gpn:
        fixes.append(f"set INFERENCE_MODE= (empty) for one instance across the {nodes} nodes")
    if tp <= gpn and gpn % tp == 0:
        fixes.append(f"PIPELINE_PARALLEL_SIZE={gpn // tp}")
    elif gpn % pp == 0:
        fixes.append(f"TENSOR_PARALLEL_SIZE={gpn // pp}")
    else:
        fixes.append(f"TENSOR_PARALLEL_SIZE={gpn} and PIPELINE_PARALLEL_SIZE=1")
    if not fixes[0].startswith("set INFERENCE_MODE="):
        fixes[0] = "set " + fixes[0]
    elif len(fixes) > 1:
        fixes[1] = f"set {fixes[1]} if one node's memory holds the model"
    return TopologyError(
        f"{_TP_PP} = {tp} x {pp} needs {used} GPU(s) per replica, but INFERENCE_MODE=replicas runs one "
        f"independent server per node and a node has GPUS_PER_NODE = {gpn} GPU(s); "
        f"the server would fail at start after the job waited in the queue",
        where=_WHERE_TP_PP,
        hint=", or ".join(fixes),
    )


# --------------------------------------------------------------------------- planning


def plan(env: Mapping[str, str]) -> Plan:
    """Decide the deployment shape for the merged launch keys ``env``.

    Raises ``TopologyError`` for a value that is not a positive integer (or a port), an
    unknown ``INFERENCE_MODE``, and every shape that would leave allocated GPUs idle or
    ask for GPUs the allocation does not have.
    """
    nodes = _positive_int(env, "INFERENCE_NODES", DEFAULT_NODES)
    gpn = _positive_int(env, "GPUS_PER_NODE", DEFAULT_GPUS_PER_NODE)
    tp = _positive_int(env, "TENSOR_PARALLEL_SIZE", gpn, default_text=f"GPUS_PER_NODE = {gpn}")
    pp = _positive_int(env, "PIPELINE_PARALLEL_SIZE", DEFAULT_PIPELINE_PARALLEL_SIZE)
    api_port = _port(env, "SERVER_PORT", DEFAULT_SERVER_PORT)
    rdzv_port = _port(env, "RDZV_PORT", DEFAULT_RDZV_PORT)
    mode = _mode(env)
    used = tp * pp
    total = nodes * gpn
    notes: list[str] = []

    if mode == "replicas":
        if used > gpn:
            raise _replica_too_big_error(nodes, gpn, tp, pp)
        if used < gpn:
            notes.append(f"each replica uses {used} of the {gpn} GPU(s) on its node")
        ranks = tuple(RankPlan(rank=i, node_index=i, serves_api=True, port=api_port) for i in range(nodes))
        return Plan("replicas", nodes, gpn, tp, pp, nodes, ranks, api_port, rdzv_port, tuple(notes))

    if nodes == 1:
        if used > total:
            raise _missing_error(nodes, gpn, tp, pp)
        if used < gpn:
            notes.append(f"the server uses {used} of the {gpn} GPU(s) on the node")
        ranks = (RankPlan(rank=0, node_index=0, serves_api=True, port=api_port),)
        return Plan("single", nodes, gpn, tp, pp, 1, ranks, api_port, rdzv_port, tuple(notes))

    if mode == "single":
        raise TopologyError(
            f"INFERENCE_MODE=single runs one server on one node, but INFERENCE_NODES = {nodes}; "
            f"{nodes - 1} node(s) ({(nodes - 1) * gpn} GPU(s)) would sit idle and be billed for the whole walltime",
            where="INFERENCE_MODE, INFERENCE_NODES",
            hint="set INFERENCE_NODES=1, or INFERENCE_MODE=replicas for one server per node, "
            "or INFERENCE_MODE= (empty) for one instance across the nodes",
        )

    if used < total:
        raise _idle_error(nodes, gpn, tp, pp)
    if used > total:
        raise _missing_error(nodes, gpn, tp, pp)
    if rdzv_port == api_port:
        raise TopologyError(
            f"RDZV_PORT and SERVER_PORT are both {api_port}; rank 0 binds both on the same node",
            where="RDZV_PORT, SERVER_PORT",
            hint=f"delete RDZV_PORT to use the default ({DEFAULT_RDZV_PORT}), or pick another port",
        )
    if gpn % tp != 0:
        notes.append(
            f"tp={tp} does not fit inside one node of {gpn} GPU(s): tensor parallelism crosses the "
            "network, which is usually slower than pipeline parallelism across nodes"
        )
    ranks = tuple(
        RankPlan(rank=i, node_index=i, serves_api=(i == 0), port=api_port if i == 0 else None) for i in range(nodes)
    )
    return Plan("pipeline", nodes, gpn, tp, pp, 1, ranks, api_port, rdzv_port, tuple(notes))


def topology_lines(p: Plan) -> list[str]:
    """Greppable ``ENVLAYERS-TOPOLOGY:`` lines saying what was decided.

    The first line is the summary, e.g.
    ``ENVLAYERS-TOPOLOGY: shape=pipeline nodes=4 gpus_per_node=4 tp=4 pp=4 world=16 api_rank=0 port=8000``;
    then one line per rank, the rendezvous port for a pipeline, and any notes.
    """
    head = f"{TOPOLOGY_PREFIX} shape={p.shape} nodes={p.nodes} gpus_per_node={p.gpus_per_node} tp={p.tp} pp={p.pp} world={p.world}"
    if p.shape == "replicas":
        api = ",".join(str(r.rank) for r in p.readiness_ranks())
        head += f" replicas={p.replicas} api_ranks={api} port={p.api_port}"
    else:
        head += f" api_rank=0 port={p.api_port}"
    lines = [head]
    if p.multi_node:
        lines.append(f"{TOPOLOGY_PREFIX} rendezvous=rank0 rdzv_port={p.rdzv_port}")
    for r in p.ranks:
        role = "api" if r.serves_api else "worker"
        text = f"{TOPOLOGY_PREFIX} rank={r.rank} node_index={r.node_index} role={role}"
        if r.port is not None:
            text += f" port={r.port}"
        lines.append(text)
    lines.extend(f"{TOPOLOGY_PREFIX} note: {n}" for n in p.notes)
    return lines
