"""Deployment shape: the allocation and a few numbers -> a Plan of ranks, roles, ports and why.

Pure: ``plan()`` takes the merged launch keys (key -> final string; a key missing from
the mapping is *absent*, ``""`` is *empty*, see docs/keys.md) and either returns a
``Plan`` or raises ``TopologyError`` naming the key(s), what the mistake would cost,
and how to fix it. Nothing here reads the environment, files or Slurm. Parsing, the
derivation of an absent TP or PP and the refusals live in :mod:`envlayers.topology_checks`.

Shapes (docs/topology.md says when each is chosen)
------
``single``
    One server on one node; it may use fewer GPUs than the node has, never more.
``pipeline``
    One instance across ``INFERENCE_NODES`` nodes through the engine's own rendezvous; rank
    0 serves the API. ``tp x pp`` must equal ``INFERENCE_NODES x GPUS_PER_NODE``.
``ray``
    One instance across nodes through Ray (vLLM's Ray executor): the rule when tensor
    parallelism is larger than one node's GPUs, or ``DISTRIBUTED_BACKEND=ray``.
``replicas``
    ``INFERENCE_MODE=replicas``: one independent server per node, each its own endpoint.
``data-parallel``
    ``NUMBER_OF_INSTANCES`` > 1 instances that each fit a node, behind one endpoint (vLLM
    data parallelism): one ``vllm serve`` per node, node 0 serves the API and coordinates.
``gateway``
    A Ray Serve gateway in front of ``NUMBER_OF_INSTANCES`` vLLM servers: many instances
    that each span nodes, or ``USE_RAY_SERVE=true``.

On more than one node every plan uses every allocated GPU; an override that does not is
refused with the idle GPUs named. On one node asking for fewer GPUs is allowed (a note).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Mapping, NamedTuple

from envlayers.errors import KeyValueError, TopologyError
from envlayers.joblines import TOPOLOGY
from envlayers import keys
from envlayers import topology_checks as chk
from envlayers.topology_checks import (  # noqa: F401  (re-exported: the planner's public names)
    BACKENDS,
    DEFAULT_DP_RPC_PORT,
    DEFAULT_GPUS_PER_NODE,
    DEFAULT_INSTANCES,
    DEFAULT_NODES,
    DEFAULT_RDZV_PORT,
    DEFAULT_SERVER_PORT,
    ENGINE_SHAPES,
    MODES,
    SHAPES,
)

Shape = Literal["single", "pipeline", "replicas", "data-parallel", "ray", "gateway"]


class RankPlan(NamedTuple):
    """One srun task (one per node).

    ``serves_api`` is true for the rank(s) that bind ``port`` and answer readiness:
    rank 0 of every shape but replicas, every rank of a replicas plan. ``port`` is
    ``None`` on a rank that serves no API (a worker or headless rank).
    """

    rank: int
    node_index: int
    serves_api: bool
    port: int | None


@dataclass(frozen=True)
class Plan:
    """What the launcher deploys. ``tp`` and ``pp`` are per server instance.

    ``replicas`` is the number of instances (independent servers for ``replicas``; vLLM
    data-parallel ranks; gateway replicas). ``instances_per_node`` is how many instances
    one node runs (data-parallel: ``--data-parallel-size-local``; gateway: the cap per
    node, 0 when an instance spans nodes). ``backend`` says how the ranks of an instance
    meet: ``native`` (the engine's own rendezvous) or ``ray``. ``rdzv_port`` is the
    engine's rendezvous port (pipeline) or the Ray head's port (ray, gateway);
    ``dp_rpc_port`` the data-parallel coordination port on node 0. ``reason`` and
    ``derived`` say why the shape and any derived TP/PP were chosen; two plans that deploy
    the same are equal (and hash alike) whatever they say.
    """

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
    backend: str = "native"
    dp_rpc_port: int = DEFAULT_DP_RPC_PORT
    instances_per_node: int = 1
    reason: str = field(default="", compare=False)
    derived: tuple[str, ...] = field(default=(), compare=False)

    @property
    def world(self) -> int:
        """GPUs one server instance uses (``tp x pp``)."""
        return self.tp * self.pp

    @property
    def multi_node(self) -> bool:
        """True when ranks on different nodes must meet (anything but replicas on one node each)."""
        return self.nodes > 1 and self.shape != "replicas"

    @property
    def edf_topology(self) -> str:
        """The EDF variant the ranks need: ``pipeline`` (fabric hooks) when ranks talk across nodes."""
        if self.multi_node:
            return "pipeline"
        return "replicas" if self.shape == "replicas" else "single"

    def readiness_ranks(self) -> tuple[RankPlan, ...]:
        """The ranks that must answer ``/v1/models`` before the endpoint is live.

        Rank 0 for every shape but replicas (workers and headless ranks may run a dummy health
        server that always says OK, or none: never probe them); every replica for replicas.
        """
        return tuple(r for r in self.ranks if r.serves_api)

    def dp_start_rank(self, rank: RankPlan) -> int:
        """The first data-parallel rank a node runs (``--data-parallel-start-rank``)."""
        return rank.node_index * self.instances_per_node


# --------------------------------------------------------------------------- planning


def _tp_pp(env: Mapping[str, str], nodes: int, gpn: int, instances: int) -> chk.Parallelism:
    def given(key: str) -> int | None:
        value = env.get(key)
        if value is None or value.strip() == "":
            return None
        try:
            return chk.count(env, key, None)
        except KeyValueError:
            return None

    guess = chk.derive(nodes, gpn, instances, given("TENSOR_PARALLEL_SIZE"), given("PIPELINE_PARALLEL_SIZE"))
    tp = chk.count(env, "TENSOR_PARALLEL_SIZE", None, default_text=str(guess.tp))
    pp = chk.count(env, "PIPELINE_PARALLEL_SIZE", None, default_text=str(guess.pp))
    return chk.derive(nodes, gpn, instances, tp, pp)


def _nodes(env: Mapping[str, str], gpn: int, mode: str | None, instances: int) -> tuple[int, str | None]:
    """``INFERENCE_NODES``, or, absent, the nodes the model's GPUs fill: TP x PP x NUMBER_OF_INSTANCES over
    GPUS_PER_NODE (1 when they fit one node or fill no whole number of nodes, which the checks refuse). So a model layer says what the model needs (its
    parallelism) and the site's GPUS_PER_NODE decides the nodes: tp=4 x pp=4 is 4 nodes of 4 GPUs, 2 of 8.
    With why, when derived past one node."""
    if env.get("INFERENCE_NODES") is not None or mode == "replicas":
        return chk.count(env, "INFERENCE_NODES", DEFAULT_NODES), None
    one = _tp_pp(env, 1, gpn, instances)
    need = one.tp * one.pp * instances
    if need <= gpn or need % gpn:  # fits one node, or fills no whole number of nodes: the checks say why
        return DEFAULT_NODES, None
    nodes = need // gpn
    parts = " x ".join(f"{name} {value}" for name, value in (("tp", one.tp), ("pp", one.pp), ("instances", instances))
                       if name != "instances" or instances > 1)
    return nodes, f"INFERENCE_NODES absent: {parts} = {need} GPU(s) at GPUS_PER_NODE = {gpn}"


def _ranks(nodes: int, api_port: int, every_rank_serves: bool = False) -> tuple[RankPlan, ...]:
    return tuple(
        RankPlan(rank=i, node_index=i, serves_api=every_rank_serves or i == 0,
                 port=api_port if every_rank_serves or i == 0 else None)
        for i in range(nodes)
    )


class Stacking(NamedTuple):
    """Where the layers set ``INFERENCE_NODES`` and ``PIPELINE_PARALLEL_SIZE`` (``file:line``), and whether
    the first comes from a layer of higher precedence than the second (``nodes_above``)."""

    nodes_origin: str
    pp_origin: str
    nodes_above: bool


def stacking(sources, env) -> Stacking | None:
    """The :class:`Stacking` of a merged stack: ``sources`` are its layers lowest first (``layers.Source``,
    each with its assignments), ``env`` the merge of them. The precedence of a key's value is the position of
    the layer holding the line that set it, as ``env_layers explain`` names it. ``None`` when a layer leaves
    either key absent."""
    nodes_b = env.bindings.get("INFERENCE_NODES")
    pp_b = env.bindings.get("PIPELINE_PARALLEL_SIZE")
    if nodes_b is None or pp_b is None:
        return None
    position = {a.origin: i for i, source in enumerate(sources) for a in source.assignments}
    above = position.get(nodes_b.origin, -1) > position.get(pp_b.origin, -1)
    return Stacking(str(nodes_b.origin), str(pp_b.origin), above)


def plan(env: Mapping[str, str], layered: Stacking | None = None) -> Plan:
    """Decide the deployment shape for the merged launch keys ``env``.

    With ``layered`` (where the layers set the node count and PP), a PP from a layer below the one that
    set ``INFERENCE_NODES`` is derived for one instance across the allocation (docs/topology.md,
    "Parallelism from the allocation"); the plan says so in ``derived``.

    Raises ``TopologyError`` for a value that is not a positive integer, a port or a known
    word, contradicting keys, a shape the engine (``INFERENCE_ENGINE``, when present) cannot
    serve, and every plan that would leave allocated GPUs idle on more than one node or ask
    for GPUs the allocation does not have.
    """
    gpn = chk.count(env, "GPUS_PER_NODE", DEFAULT_GPUS_PER_NODE)
    mode = chk.mode(env)
    instances_set = chk.count(env, "NUMBER_OF_INSTANCES", None, default_text=str(DEFAULT_INSTANCES))
    instances = instances_set or DEFAULT_INSTANCES
    nodes, nodes_why = _nodes(env, gpn, mode, instances)
    par = _tp_pp(env, nodes, gpn, nodes if mode == "replicas" else instances)
    tp, pp = par.tp, par.pp
    api_port = chk.port(env, "SERVER_PORT", DEFAULT_SERVER_PORT)
    rdzv_port = chk.port(env, "RDZV_PORT", DEFAULT_RDZV_PORT)
    dp_port = chk.port(env, "DATA_PARALLEL_RPC_PORT", DEFAULT_DP_RPC_PORT)
    backend = chk.backend(env)
    ray_serve = chk.use_ray_serve(env)
    engine = keys.text(env, "INFERENCE_ENGINE")
    derived = tuple(f"{name}={value} ({why})" for name, value, why in
                    (("nodes", nodes, nodes_why), ("tp", tp, par.tp_derived), ("pp", pp, par.pp_derived)) if why)
    if (layered is not None and layered.nodes_above and par.pp_derived is None and mode != "replicas"
            and instances == 1 and not ray_serve):  # one instance: its nodes are the allocation's
        wanted = chk.pp_for_allocation(nodes, gpn, tp, pp)
        if wanted is not None:
            derived += (f"pp={wanted} (INFERENCE_NODES={nodes} at {layered.nodes_origin} stands above "
                        f"PIPELINE_PARALLEL_SIZE={pp} at {layered.pp_origin}: INFERENCE_NODES x GPUS_PER_NODE / "
                        f"TENSOR_PARALLEL_SIZE = {nodes} x {gpn} / {tp})",)
            pp = wanted
    world, total = tp * pp, nodes * gpn
    common = dict(api_port=api_port, rdzv_port=rdzv_port, dp_rpc_port=dp_port, derived=derived)

    if mode == "replicas":
        return _replicas(nodes, gpn, tp, pp, instances_set, ray_serve, backend, common)
    if mode in ("single", "pipeline") and (instances > 1 or ray_serve):
        asked = f"NUMBER_OF_INSTANCES={instances}" if instances > 1 else "USE_RAY_SERVE=true"
        raise chk.conflict(
            f"INFERENCE_MODE={mode} serves one instance without a gateway, but {asked} asks for another shape",
            where=f"INFERENCE_MODE, {asked.split('=')[0]}",
            hint="set INFERENCE_MODE= (empty) and the planner derives the shape from the numbers",
        )

    if ray_serve or (instances > 1 and nodes > 1 and world > gpn):
        why = ("USE_RAY_SERVE=true" if ray_serve else
               f"{instances} instances that each span nodes: tp x pp = {world} > {gpn} GPU(s) per node")
        chk.check_engine(engine, "gateway", why)
        return _gateway(nodes, gpn, tp, pp, instances, backend, why, common)
    if instances > 1:
        why = f"{instances} instances of tp x pp = {world} GPU(s), each fits a node"
        chk.check_engine(engine, "data-parallel", why)
        return _data_parallel(nodes, gpn, tp, pp, instances, backend, why, common)
    if backend == "ray" and nodes == 1:
        raise chk.conflict(
            "DISTRIBUTED_BACKEND=ray, but the plan is one server on one node, which needs no executor across nodes",
            where="DISTRIBUTED_BACKEND, INFERENCE_NODES",
            hint="set DISTRIBUTED_BACKEND= (empty), or USE_RAY_SERVE=true for a Ray Serve gateway on the node",
        )
    if nodes == 1:
        if world > total:
            raise chk.missing_error(nodes, gpn, tp, pp)
        notes = [f"the server uses {world} of the {gpn} GPU(s) on the node"] if world < gpn else []
        return Plan("single", nodes, gpn, tp, pp, 1, _ranks(1, api_port), notes=tuple(notes),
                    reason="one node, one instance: one server", **common)
    if mode == "single":
        raise TopologyError(
            f"INFERENCE_MODE=single runs one server on one node, but INFERENCE_NODES = {nodes}; "
            f"{nodes - 1} node(s) ({(nodes - 1) * gpn} GPU(s)) would sit idle and be billed for the whole walltime",
            where="INFERENCE_MODE, INFERENCE_NODES",
            hint="set INFERENCE_NODES=1, or INFERENCE_MODE=replicas for one server per node, "
            "or INFERENCE_MODE= (empty) for one instance across the nodes",
        )
    return _one_across_nodes(nodes, gpn, tp, pp, mode, backend, engine, common)


def _replicas(nodes, gpn, tp, pp, instances_set, ray_serve, backend, common) -> Plan:
    if instances_set is not None and instances_set != nodes:
        raise chk.conflict(
            f"INFERENCE_MODE=replicas runs one server per node ({nodes}), but NUMBER_OF_INSTANCES = {instances_set}",
            where="INFERENCE_MODE, NUMBER_OF_INSTANCES",
            hint=f"set NUMBER_OF_INSTANCES={nodes}, or INFERENCE_MODE= (empty) for instances behind one endpoint",
        )
    if ray_serve or backend == "ray":
        asked = "USE_RAY_SERVE=true" if ray_serve else "DISTRIBUTED_BACKEND=ray"
        raise chk.conflict(
            f"INFERENCE_MODE=replicas runs independent servers, one per node, but {asked} asks for Ray",
            where=f"INFERENCE_MODE, {asked.split('=')[0]}",
            hint=f"set {'USE_RAY_SERVE=false' if ray_serve else 'DISTRIBUTED_BACKEND= (empty)'}, "
            "or INFERENCE_MODE= (empty)",
        )
    world = tp * pp
    if world > gpn:
        raise chk.replica_too_big_error(nodes, gpn, tp, pp)
    notes: list[str] = []
    if world < gpn:
        if nodes > 1:
            raise chk.replicas_idle_error(nodes, gpn, tp, pp)
        notes.append(f"each replica uses {world} of the {gpn} GPU(s) on its node")
    return Plan("replicas", nodes, gpn, tp, pp, nodes, _ranks(nodes, common["api_port"], True), notes=tuple(notes),
                reason="INFERENCE_MODE=replicas: one independent server per node, an endpoint each", **common)


def _one_across_nodes(nodes, gpn, tp, pp, mode, backend, engine, common) -> Plan:
    world, total = tp * pp, nodes * gpn
    if world < total:
        raise chk.idle_error(nodes, gpn, tp, pp)
    if world > total:
        raise chk.missing_error(nodes, gpn, tp, pp)
    if backend is not None:
        why = f"DISTRIBUTED_BACKEND={backend}"
    elif mode == "pipeline":
        backend, why = "native", "INFERENCE_MODE=pipeline"
    elif tp > gpn and engine == "sglang":
        backend, why = "native", (f"tp={tp} is larger than a node's {gpn} GPU(s), and SGLang spans nodes only "
                                  "with its own rendezvous")
    elif tp > gpn:
        backend, why = "ray", f"tp={tp} is larger than a node's {gpn} GPU(s): tensor parallelism across nodes uses Ray"
    else:
        backend, why = "native", (f"tp={tp} fits a node of {gpn} GPU(s): tensor parallelism inside a node, "
                                  f"pipeline parallelism (pp={pp}) across nodes, the engine's own rendezvous")
    shape = "pipeline" if backend == "native" else "ray"
    chk.check_engine(engine, shape, why)
    chk.check_ports("RDZV_PORT", common["rdzv_port"], "SERVER_PORT", common["api_port"], DEFAULT_RDZV_PORT)
    notes = []
    if shape == "pipeline" and gpn % tp != 0:
        notes.append(f"tp={tp} does not fit inside one node of {gpn} GPU(s): tensor parallelism crosses the "
                     "network, which is usually slower than pipeline parallelism across nodes")
    reason = f"one instance across {nodes} nodes ({why})"
    return Plan(shape, nodes, gpn, tp, pp, 1, _ranks(nodes, common["api_port"]), notes=tuple(notes),
                backend=backend, reason=reason, **common)


def _data_parallel(nodes, gpn, tp, pp, instances, backend, why, common) -> Plan:
    world = tp * pp
    if backend == "ray":
        raise chk.conflict(
            f"DISTRIBUTED_BACKEND=ray, but each of the {instances} instances fits one node, so no instance spans "
            "nodes; vLLM's own data parallelism coordinates the nodes",
            where="DISTRIBUTED_BACKEND, NUMBER_OF_INSTANCES",
            hint="set DISTRIBUTED_BACKEND= (empty), or USE_RAY_SERVE=true for a Ray Serve gateway",
        )
    if instances % nodes != 0:
        lower = instances // nodes * nodes
        fixes = " or ".join(str(n) for n in (lower, lower + nodes) if n > 0)
        raise TopologyError(
            f"NUMBER_OF_INSTANCES = {instances} does not divide evenly across INFERENCE_NODES = {nodes} nodes; "
            "vLLM data parallelism runs the same number of instances on every node",
            where="NUMBER_OF_INSTANCES, INFERENCE_NODES",
            hint=f"set NUMBER_OF_INSTANCES to a multiple of {nodes} ({fixes})",
        )
    per_node = instances // nodes
    share = per_node * world
    if share > gpn:
        fits = gpn // world
        fixes = [f"set NUMBER_OF_INSTANCES={fits * nodes}"] if fits else []
        if gpn % per_node == 0 and gpn // per_node >= pp and (gpn // per_node) % pp == 0:
            fixes.append(f"TENSOR_PARALLEL_SIZE={gpn // per_node // pp}")
        if share % gpn == 0 and nodes > 0:
            fixes.append(f"INFERENCE_NODES={share * nodes // gpn}")
        raise TopologyError(
            f"{per_node} instance(s) per node x {chk.TP_PP} = {per_node} x {tp} x {pp} = {share} GPU(s) per node, "
            f"but a node has GPUS_PER_NODE = {gpn}; the servers would fail at start after the job waited in the queue",
            where="NUMBER_OF_INSTANCES, TENSOR_PARALLEL_SIZE, PIPELINE_PARALLEL_SIZE",
            hint=", or ".join(fixes) if fixes else "use fewer, smaller instances",
        )
    notes = []
    if share < gpn:
        if nodes > 1:
            fill = gpn // world * nodes
            raise chk.instance_idle_error(
                f"NUMBER_OF_INSTANCES x {chk.TP_PP} = {instances} x {tp} x {pp}", instances * world, nodes, gpn,
                hint=f"set NUMBER_OF_INSTANCES={fill} ({fill // nodes} per node)" if fill != instances else
                f"set TENSOR_PARALLEL_SIZE={gpn // per_node // pp} or fewer nodes",
            )
        notes.append(f"the {instances} instances use {share} of the {gpn} GPU(s) on the node")
    chk.check_ports("DATA_PARALLEL_RPC_PORT", common["dp_rpc_port"], "SERVER_PORT", common["api_port"],
                 DEFAULT_DP_RPC_PORT)
    reason = f"{why}: vLLM data parallelism, {per_node} per node, one endpoint on node 0"
    return Plan("data-parallel", nodes, gpn, tp, pp, instances, _ranks(nodes, common["api_port"]),
                notes=tuple(notes), instances_per_node=per_node, reason=reason, **common)


def _gateway(nodes, gpn, tp, pp, instances, backend, why, common) -> Plan:
    world, total = tp * pp, nodes * gpn
    used = world * instances
    what = f"NUMBER_OF_INSTANCES x {chk.TP_PP} = {instances} x {tp} x {pp}"
    if backend == "native":
        raise chk.conflict(
            f"DISTRIBUTED_BACKEND=native, but the plan is a Ray Serve gateway ({why}), whose instances run on Ray",
            where="DISTRIBUTED_BACKEND", hint="set DISTRIBUTED_BACKEND= (empty) or ray",
        )
    if used > total:
        fit = total // world
        raise chk.instances_missing_error(what, used, nodes, gpn,
                                          hint=f"set NUMBER_OF_INSTANCES={fit}" if fit else
                                          f"set INFERENCE_NODES={-(-used // gpn)}")
    notes = []
    if used < total:
        if nodes > 1:
            fit = total // world
            raise chk.instance_idle_error(what, used, nodes, gpn, hint=f"set NUMBER_OF_INSTANCES={fit}"
                                          if total % world == 0 else f"set INFERENCE_NODES={-(-used // gpn)}")
        notes.append(f"the {instances} instance(s) use {used} of the {gpn} GPU(s) on the node")
    chk.check_ports("RDZV_PORT", common["rdzv_port"], "SERVER_PORT", common["api_port"], DEFAULT_RDZV_PORT)
    cap = gpn // world
    reason = f"{why}: a Ray Serve gateway on node 0 in front of {instances} vLLM instance(s) on Ray"
    return Plan("gateway", nodes, gpn, tp, pp, instances, _ranks(nodes, common["api_port"]), notes=tuple(notes),
                backend="ray", instances_per_node=cap, reason=reason, **common)


# --------------------------------------------------------------------------- printing


def topology_lines(p: Plan) -> list[str]:
    """Greppable ``ENVLAYERS-TOPOLOGY:`` lines saying what was decided.

    The first line is the summary, e.g.
    ``ENVLAYERS-TOPOLOGY: shape=pipeline nodes=4 gpus_per_node=4 tp=4 pp=4 world=16 api_rank=0 port=8000``;
    then where the ranks meet (multi-node shapes), one line per rank, and any notes.
    """
    head = TOPOLOGY.prefix + f"shape={p.shape} nodes={p.nodes} gpus_per_node={p.gpus_per_node} tp={p.tp} pp={p.pp} world={p.world}"
    if p.shape == "replicas":
        api = ",".join(str(r.rank) for r in p.readiness_ranks())
        head += f" replicas={p.replicas} api_ranks={api} port={p.api_port}"
    elif p.shape == "data-parallel":
        head += f" instances={p.replicas} instances_per_node={p.instances_per_node} api_rank=0 port={p.api_port}"
    elif p.shape == "gateway":
        per = (f"max_instances_per_node={p.instances_per_node}" if p.instances_per_node else
               f"nodes_per_instance={-(-p.world // p.gpus_per_node)}")
        head += f" instances={p.replicas} {per} api_rank=0 port={p.api_port}"
    else:
        head += f" api_rank=0 port={p.api_port}"
    lines = [head]
    if p.shape == "pipeline":
        lines.append(TOPOLOGY.line(f"rendezvous=rank0 rdzv_port={p.rdzv_port}"))
    elif p.shape in ("ray", "gateway"):
        lines.append(TOPOLOGY.line(f"rendezvous=rank0 backend=ray ray_port={p.rdzv_port}"))
    elif p.shape == "data-parallel" and p.nodes > 1:
        lines.append(TOPOLOGY.line(f"rendezvous=rank0 dp_rpc_port={p.dp_rpc_port}"))
    for r in p.ranks:
        lines.append(_rank_line(p, r))
    lines.extend(TOPOLOGY.line(f"note: {n}") for n in p.notes)
    return lines


def _rank_line(p: Plan, r: RankPlan) -> str:
    if p.shape == "gateway":
        role = "gateway" if r.serves_api else "ray-worker"
    elif p.shape == "ray":
        role = "api" if r.serves_api else "ray-worker"
    elif p.shape == "data-parallel" and not r.serves_api:
        role = "headless"
    else:
        role = "api" if r.serves_api else "worker"
    text = TOPOLOGY.prefix + f"rank={r.rank} node_index={r.node_index} role={role}"
    if p.shape == "data-parallel":
        text += f" dp_start_rank={p.dp_start_rank(r)} dp_local={p.instances_per_node}"
    if r.port is not None:
        text += f" port={r.port}"
    return text


def reason_lines(p: Plan) -> list[str]:
    """Why this shape (``why: ...``) and which of TP/PP were derived (``derived: ...``)."""
    return [f"why: {p.shape}: {p.reason}", *(f"derived: {d}" for d in p.derived)]
