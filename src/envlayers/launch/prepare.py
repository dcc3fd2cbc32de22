"""The launch plan: launch keys + facts about the allocation -> everything the launcher will do.

Pure: no process, no file, no network. :func:`prepare` returns a :class:`LaunchPlan` (the lines
to print, the rank commands, the nodes and their addresses, the budgets, the srun argv and the
text of the files to write); ``launch.launcher`` gathers the :class:`Allocation` facts, writes the
files and hands the plan to the supervision loop. :func:`envlayers.slurm.ranks_step_argv` is also what
the dry run prints, so the operator sees the very srun line the job runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping

from .. import engines, slurm, topology
from .. import keys as keytable
from ..engines import RankCommand
from ..errors import LaunchFailure
from ..rundir import LAUNCH, RANKS_SH, LaunchRecord, json_text
from ..engines.sglang import metrics_enabled as sglang_metrics_enabled
from ..joblines import STAGE, TOPOLOGY, WARN
from ..urls import host_port_base
from . import raycluster
from ..runtimes import rank_wrappers as runtime_wrappers, runtime_name

CLAMP = 0.9
# what the job script itself exports besides the merged environment
JOB_SCRIPT_KEYS = ("ENVLAYERS_KEYS", "ENVLAYERS_TARGET", "ENVLAYERS_EDF", "ENVLAYERS_READY_TIMEOUT_S",
                   "ENVLAYERS_SITE", "ENVLAYERS_IMAGE", "ENVLAYERS_GPU_DEVICES")  # the last two: podman, apptainer (runtimes/)


@dataclass(frozen=True)
class Node:
    """One allocated node: its Slurm name, the address to reach it at, and the host to print in URLs
    (the name when it resolves, else the address: a URL that works from the login node)."""

    name: str
    address: str
    resolves: bool

    @property
    def url_host(self) -> str:
        return self.name if self.resolves else self.address


@dataclass(frozen=True)
class Allocation:
    """What the launcher learns about its allocation before planning (gathered by ``launch.launcher``)."""

    job_id: str
    run_dir: Path
    nodes: tuple[Node, ...]
    cpus_on_node: str = "1"
    time_left_s: int | None = None  # None: unlimited or unknown
    restart: int = 0  # SLURM_RESTART_COUNT
    ifaces: Mapping[str, str | None] = field(default_factory=dict)  # the head node's IPv4 interfaces
    api_key: bool = False  # a key was read from SERVER_API_KEY_FILE (the key itself stays out of the plan)
    busy_ports: frozenset[int] = frozenset()  # ports from RDZV_PORT up that are in use on the head node


@dataclass(frozen=True)
class Target:
    """A rank that must answer the readiness probe: ``url`` is printed, ``probe_url`` is probed."""

    rank: int
    url: str
    probe_url: str
    address: str


@dataclass(frozen=True)
class LaunchPlan:
    job_id: str
    restart: int
    run_dir: Path
    plan: topology.Plan
    engine: str
    served: str
    model: str
    nodes: tuple[Node, ...]
    commands: tuple[RankCommand, ...]
    targets: tuple[Target, ...]
    budget_s: int
    rank_start_s: int
    srun: tuple[str, ...]
    api_key: bool
    key_file: str | None
    lines: tuple[str, ...]  # printed before srun, in order
    files: Mapping[str, str]  # run-dir file name -> text
    metrics: bool = True  # the engine serves /metrics (vLLM always; SGLang unless SGLANG_ENABLE_METRICS is off)
    stall_s: int = keytable.BY_NAME["STARTUP_STALL_S"].default  # STARTUP_STALL_S: no rank's log grew for this long before live; 0: off
    node_local: bool = False  # SERVER_HOST binds loopback: reached on node 0 itself or through `env_layers tunnel`

    @property
    def ranks(self) -> int:
        return self.plan.nodes


def launch_keys(environ: Mapping[str, str]) -> dict[str, str]:
    """The launch keys: exactly the keys the merged environment assigns (ENVLAYERS_KEYS, written by
    the job script), with the values the job's shell gave them (deferred references expanded). A
    variable merely exported in the submitting shell is not a launch key: sbatch passes the whole
    environment on, and the dry run would lie."""
    keys = environ.get("ENVLAYERS_KEYS", "").split()
    env = {k: environ[k] for k in keys if k in environ}
    env.update({k: environ[k] for k in JOB_SCRIPT_KEYS if k in environ})
    return env


def startup_stall_s(keys: Mapping[str, str]) -> int:
    """``STARTUP_STALL_S``: absent or empty -> 900, ``0`` -> the stall detector is off, a whole number of
    seconds -> it; anything else ends the launch before srun, naming the key (``envlayers.keys``)."""
    return keytable.value(keys, "STARTUP_STALL_S")


def min_replicas(keys: Mapping[str, str], replicas: int) -> int:
    """``MIN_REPLICAS``: a whole number from 1 to the number of replicas, else an error naming the key."""
    n = keytable.value(keys, "MIN_REPLICAS")
    if n > replicas:
        raise keytable.error(keys, "MIN_REPLICAS", f"must be a whole number from 1 to {replicas} (the replicas "
                             f"this job runs), got {n}", "the default 1 keeps serving while any replica is alive")
    return n


RDZV_SCAN_PORTS = 64
RDZV_SHAPES = ("pipeline", "ray", "gateway")  # the shapes whose ranks meet on RDZV_PORT


def choose_rdzv_port(plan: topology.Plan, busy: frozenset[int],
                     span: int = RDZV_SCAN_PORTS) -> tuple[topology.Plan, list[str]]:
    """The first port from ``RDZV_PORT`` up (at most ``span`` ports) that is free on the head node and is
    neither the API port nor the data-parallel port; the plan carries it, and a line says so when it
    moved. Raises LaunchFailure when none of them is free."""
    if plan.shape not in RDZV_SHAPES or plan.nodes < 2:
        return plan, []
    start = plan.rdzv_port
    taken = set(busy) | {plan.api_port, plan.dp_rpc_port}
    for port in range(start, min(start + span, 65536)):
        if port not in taken:
            if port == start:
                return plan, []
            line = (TOPOLOGY.line(f"rdzv_port={port} (RDZV_PORT={start} is in use on the head node; the first "
                                  f"free port above it)"))
            return replace(plan, rdzv_port=port), [line]
    last = min(start + span, 65536) - 1
    raise LaunchFailure(f"no free rendezvous port on the head node in {start}-{last} (RDZV_PORT and the {span - 1} "
                        "ports above it are in use); set RDZV_PORT to a free range in your SERVE_ENV_FILE")


def prepare(keys: Mapping[str, str], alloc: Allocation) -> LaunchPlan:
    """The whole launch, decided: raises LaunchFailure (or an EnvLayersError from the plan or an
    engine) when the job must stop before srun."""
    from .. import fabric
    from .ranks import rank_script

    plan, moved = choose_rdzv_port(topology.plan(dict(keys)), alloc.busy_ports)
    lines = list(topology.topology_lines(plan)) + moved
    nodes = alloc.nodes
    if len(nodes) != plan.nodes:
        raise LaunchFailure(f"allocation has {len(nodes)} node(s), expected {plan.nodes}: "
                            "an extra --nodes on the sbatch line? Slurm honours the last one", lines=tuple(lines))
    build_env = dict(keys)
    build_env.pop("SERVER_API_KEY", None)  # only SERVER_API_KEY_FILE sets a key
    if plan.multi_node:  # every shape whose ranks talk across nodes
        choice = fabric.choose(dict(alloc.ifaces), keys.get("ENVLAYERS_HSN_IFACE"), keys.get("NCCL_SOCKET_IFNAME"))
        lines += choice.lines
        if choice.error:
            raise LaunchFailure(choice.error, lines=tuple(lines))
        if choice.socket_ifname:
            build_env["NCCL_SOCKET_IFNAME"] = choice.socket_ifname
    key_file = keys.get("SERVER_API_KEY_FILE") or None
    if alloc.api_key:
        build_env["SERVER_API_KEY"] = "<from SERVER_API_KEY_FILE>"  # only its presence reaches the commands
    # the master address is known now: the commands carry it, ranks.sh expands nothing
    commands = engines.build_commands(plan, build_env, nodes[0].url_host, [n.address for n in nodes])
    engine = engines.engine_name(keys)
    for rank, cmd in enumerate(commands):
        lines.append(STAGE.line(f"rank {rank} on {nodes[rank].name}: {engines.shell_line(cmd)}"))
    if alloc.api_key and any(c.key_flag for c in commands):
        lines.append(WARN.line("SGLang takes the API key only on its command line (--api-key): other users "
                               "of the node can read it in /proc/<pid>/cmdline while the server runs (a known limit, "
                               "docs/keys.md)"))
    budget = keytable.value(keys, "ENVLAYERS_READY_TIMEOUT_S")
    left = alloc.time_left_s
    if left is not None and budget > CLAMP * left:
        clamped = int(CLAMP * left)
        lines.append(WARN.line(f"readiness budget {budget}s exceeds the allocation; clamping to {clamped}s "
                               f"(90% of the {left}s left)"))
        budget = clamped
    rank_start_s = keytable.value(keys, "ENVLAYERS_RANK_START_TIMEOUT")
    stall_s = startup_stall_s(keys)
    lines.append(TOPOLOGY.line(f"readiness_budget={budget}s rank_start_budget={rank_start_s}s"))
    # -- the container runtime's wrapper (runtimes/): podman run, apptainer exec, ch-run before each command
    wrappers, containers = None, []  # containers: their names, which launch.json records for release
    runtime = runtime_name(keys)
    wrapped = runtime_wrappers(runtime, keys, plan, alloc.job_id, commands)
    if wrapped is not None:
        wrappers, runtime_lines, containers = wrapped
        lines += runtime_lines
    # -- end of the runtime's wrapper
    # SERVER_HOST on loopback: the launcher (on node 0) probes the server there, and prints that URL
    from ..exposure import loopback_host, loopback_unreachable

    refused = loopback_unreachable(keys, [r.node_index for r in plan.readiness_ranks()])
    if refused:
        raise LaunchFailure(refused, lines=tuple(lines))
    local = loopback_host(keys)
    ray_files: dict[str, str] = {}
    if plan.shape in raycluster.RAY_SHAPES:  # -- the Ray cluster (launch/raycluster.py): raynode.py before each command
        if wrappers is not None:
            raise LaunchFailure(f"CONTAINER_RUNTIME={runtime} cannot run the {plan.shape} shape (Ray across the "
                                "container boundary); use CONTAINER_RUNTIME=ce or none", lines=tuple(lines))
        wrappers, ray_lines = raycluster.wrappers(keys, plan, alloc.run_dir, alloc.job_id,
                                                  [n.address for n in nodes], keys.get("VLLM_SERVED_MODEL", ""),
                                                  budget,
                                                  min_replicas(keys, plan.replicas) if plan.shape == "gateway" else 1)
        lines += ray_lines
        ray_files = raycluster.files(plan.shape)
    targets = tuple(Target(r.rank, host_port_base(local or nodes[r.node_index].url_host, r.port),
                           host_port_base(local or nodes[r.node_index].address, r.port),
                           local or nodes[r.node_index].address)
                    for r in plan.readiness_ranks())
    container: list[str] = []
    if runtime == "pyxis":  # the step itself runs in the container (runtimes/pyxis.py)
        from ..runtimes import pyxis

        container = pyxis.step_args(pyxis.Settings(keys.get("ENVLAYERS_IMAGE") or ""), keys, str(alloc.run_dir),
                                    pyxis.passed(keys, commands))
        lines.append(STAGE.line(f"the ranks run in pyxis: {' '.join(container)}"))
    srun = slurm.ranks_step_argv(plan.nodes, alloc.cpus_on_node, keys.get("ENVLAYERS_EDF") or None,
                     str(alloc.run_dir / RANKS_SH), container)
    served = keys.get("VLLM_SERVED_MODEL", "")
    launch_json = json_text(LaunchRecord(
        job_id=alloc.job_id, restart=alloc.restart, target=keys.get("ENVLAYERS_TARGET"), engine=engine,
        model=keys.get("INFERENCE_MODEL") or None, served_model_name=served, shape=plan.shape,
        nodes=[n.name for n in nodes], addresses=[n.address for n in nodes], ready_timeout_s=budget,
        containers=containers, site=keys.get("ENVLAYERS_SITE") or None,
        container_program=runtime if containers and runtime != "podman" else None).to_dict())
    files = {RANKS_SH: rank_script(commands, alloc.run_dir, wrappers), LAUNCH: launch_json, **ray_files}
    return LaunchPlan(alloc.job_id, alloc.restart, alloc.run_dir, plan, engine, served, keys.get("INFERENCE_MODEL", ""),
                      nodes, commands, targets, budget, rank_start_s, tuple(srun), alloc.api_key, key_file,
                      tuple(lines), files,
                      # the gateway answers /metrics itself, with every replica's samples (gateway_app.py)
                      metrics=sglang_metrics_enabled(keys) if engine == "sglang" else True, stall_s=stall_s,
                      node_local=local is not None)
