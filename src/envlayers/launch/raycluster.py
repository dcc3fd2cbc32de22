"""The Ray cluster of the ``ray`` and ``gateway`` shapes, decided before srun: flags, ports, wrappers.

Pure: the launch keys, the plan and the allocation's node addresses in, argv words and file texts out.
What runs in the job is :mod:`envlayers.launch.raynode` (one per node: starts ``ray start --block``,
records the PIDs it started, waits until the head sees every node, runs the server, stops everything
by PID) and, for the gateway, :mod:`envlayers.gateway_app` (the Ray Serve deployment). Both are copied
into the run directory next to ranks.sh, because the ranks may run in a container that has Python
and Ray but not envlayers.

Every Ray cluster a job starts has Ray's token authentication on, with a per-job token the launcher
writes 0600 into the run directory before srun (:func:`write_token`; raynode.py points Ray at it), so
no one else who reaches the nodes' Ray ports can join the cluster or run code on it.

Launch keys (docs/keys.md): ``RAY_PORT_BASE`` (the fixed Ray ports, one block of 1000 from it),
``RAY_NUM_CPUS`` (``--num-cpus`` of every Ray node), ``RAY_JOIN_TIMEOUT_S`` (how long the head waits
for every node), and for the gateway ``MIN_REPLICAS`` (the replicas that must stay healthy, default 1)
and ``GATEWAY_REPLACE_TIMEOUT_S`` (how long fewer may be healthy while Serve replaces them; default the
readiness budget). The head's own port is ``RDZV_PORT`` (the plan's rendezvous port, scanned upward for
a free one on the head node).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from ..errors import EnvLayersError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: the dry run must start fast
if TYPE_CHECKING:
    from typing import Mapping, Sequence

RAY_SHAPES = ("ray", "gateway")
NODE_FILE = "raynode.py"
TOKEN_FILE = "ray-token"  # the job's Ray authentication token, 0600, written by the launcher before srun
GATEWAY_FILE = "gateway_app.py"
PYTHON = "python3"  # the ranks' Python: the container's, or the host's with CONTAINER_RUNTIME=none
DEFAULT_PORT_BASE = 28000
PORT_BLOCK = 1000
DEFAULT_JOIN_TIMEOUT_S = 300
TEMP_ROOT = "/tmp"  # Ray's socket paths must stay short (a Unix socket path has at most 107 bytes)

# RAY_PORT_BASE + offset: every port a Ray node would otherwise take at a fixed default (10001, 52365,
# 10002-19999) or at random, so two jobs sharing a node's port space never collide and a firewall
# can be told which ports a job uses
PORT_OFFSETS: tuple[tuple[str, int, bool], ...] = (  # flag, offset, head only
    ("--dashboard-agent-listen-port", 0, False),
    ("--ray-client-server-port", 1, True),
    ("--node-manager-port", 2, False),
    ("--object-manager-port", 3, False),
    ("--metrics-export-port", 4, False),
    ("--dashboard-agent-grpc-port", 5, False),
    ("--runtime-env-agent-port", 6, False),
    ("--dashboard-port", 7, True),
)
WORKER_PORTS = (100, PORT_BLOCK - 1)  # --min-worker-port / --max-worker-port offsets
_INT_RE = re.compile(r"[0-9]+\Z")


class RayKeyError(EnvLayersError):
    """A Ray launch key the cluster cannot be started with."""


def _whole(env: Mapping[str, str], key: str, default: int | None, what: str, *, empty_ok: bool) -> int | None:
    value = env.get(key)
    if value is None:
        return default
    text = value.strip()
    if text == "":
        if empty_ok:
            return None
        raise RayKeyError(f"is empty; it must be {what}", where=key,
                          hint=f"delete the line to use the default ({default})")
    if not _INT_RE.match(text) or int(text) <= 0:
        raise RayKeyError(f"must be {what}, got {value!r}", where=key)
    return int(text)


def port_base(env: Mapping[str, str]) -> int | None:
    """``RAY_PORT_BASE``: absent -> 28000, empty -> None (Ray's own port defaults), a value -> it."""
    base = _whole(env, "RAY_PORT_BASE", DEFAULT_PORT_BASE, f"a port from 1024 to {65535 - PORT_BLOCK + 1}",
                  empty_ok=True)
    if base is not None and not 1024 <= base <= 65535 - PORT_BLOCK + 1:
        raise RayKeyError(f"must be a port from 1024 to {65535 - PORT_BLOCK + 1} (the Ray ports take "
                          f"{PORT_BLOCK} from it), got {base}", where="RAY_PORT_BASE")
    return base


def num_cpus(env: Mapping[str, str]) -> int | None:
    """``RAY_NUM_CPUS``: absent or empty -> None (Ray counts the node's CPUs), a value -> it."""
    return _whole(env, "RAY_NUM_CPUS", None, "a positive number of CPUs", empty_ok=True)


def join_timeout_s(env: Mapping[str, str]) -> int:
    """``RAY_JOIN_TIMEOUT_S``: seconds the head waits for every node to join; absent -> 300, empty -> error."""
    return _whole(env, "RAY_JOIN_TIMEOUT_S", DEFAULT_JOIN_TIMEOUT_S, "a positive number of seconds",
                  empty_ok=False)


def replace_timeout_s(env: Mapping[str, str], budget_s: int) -> int:
    """``GATEWAY_REPLACE_TIMEOUT_S``: seconds the gateway runs with fewer than MIN_REPLICAS healthy replicas
    while Serve replaces them; absent -> the readiness budget (a new replica starts a new server)."""
    return _whole(env, "GATEWAY_REPLACE_TIMEOUT_S", budget_s, "a positive number of seconds", empty_ok=False)


def check_ports(env: Mapping[str, str], plan) -> None:
    """The plan's own ports (the service, the Ray head) must lie outside the Ray port block."""
    base = port_base(env)
    if base is None:
        return
    for key, value in (("SERVER_PORT", plan.api_port), ("RDZV_PORT", plan.rdzv_port)):
        if base <= value < base + PORT_BLOCK:
            raise RayKeyError(f"{key} = {value} lies in the Ray port block {base}-{base + PORT_BLOCK - 1}",
                              where=f"RAY_PORT_BASE, {key}",
                              hint=f"set RAY_PORT_BASE outside {max(1024, value - PORT_BLOCK + 1)}-{value}")


def node_flags(env: Mapping[str, str], plan, head: bool) -> list[str]:
    """The ``ray start`` flags of one node (without ``--head``, ``--address`` and ``--block``)."""
    flags = [f"--num-gpus={plan.gpus_per_node}"]
    cpus = num_cpus(env)
    if cpus is not None:
        flags.append(f"--num-cpus={cpus}")
    if head:
        flags += ["--include-dashboard=false", "--disable-usage-stats"]
    base = port_base(env)
    if base is not None:
        flags += [f"{name}={base + offset}" for name, offset, head_only in PORT_OFFSETS if head or not head_only]
        flags += [f"--min-worker-port={base + WORKER_PORTS[0]}", f"--max-worker-port={base + WORKER_PORTS[1]}"]
    return flags


def worker_argv(env: Mapping[str, str], plan, master_addr: str) -> tuple[str, ...]:
    """A rank > 0: a Ray worker node joining the head on node 0."""
    check_ports(env, plan)
    return ("ray", "start", f"--address={master_addr}:{plan.rdzv_port}", *node_flags(env, plan, head=False),
            "--block")


def head_argv(env: Mapping[str, str], plan, node_ip: str | None = None) -> tuple[str, ...]:
    """Node 0: the Ray head on the rendezvous port (``--node-ip-address`` when the job knows it)."""
    check_ports(env, plan)
    ip = [f"--node-ip-address={node_ip}"] if node_ip else []
    return ("ray", "start", "--head", f"--port={plan.rdzv_port}", *ip, *node_flags(env, plan, head=True),
            "--block")


def gateway_cap(plan) -> int:
    """Gateway replicas one node may hold: the instances its GPUs fit, at least 1 (an instance that
    spans nodes)."""
    return max(1, plan.gpus_per_node // plan.world)


# --------------------------------------------------------------------------- in the job


def wrappers(env: Mapping[str, str], plan, run_dir: Path, job_id: str, node_addrs: Sequence[str],
             served: str, budget_s: int) -> tuple[list[tuple[str, list[str]]], list[str]]:
    """Per rank, the words ranks.sh puts before the rank's command (``raynode.py ... --``), and the lines
    the launcher prints. Rank 0 starts the head and, once every node joined, its server: ``vllm serve``
    (ray) or the Ray Serve gateway in front of the replicas (gateway); ranks > 0 run the worker command
    they already have."""
    head_ip = node_addrs[0]
    address = f"{head_ip}:{plan.rdzv_port}"
    timeout = join_timeout_s(env)
    node = str(run_dir / NODE_FILE)
    if plan.shape == "gateway":
        from .replicas import min_replicas

        minimum, grace = min_replicas(env, plan.replicas), replace_timeout_s(env, budget_s)
    common = ["--run-dir", str(run_dir), "--job", job_id, "--address", address, "--nodes", str(plan.nodes),
              "--auth-token-file", str(run_dir / TOKEN_FILE)]
    out: list[tuple[str, list[str]]] = []
    for rank in range(plan.nodes):
        words = [PYTHON, node, "--rank", str(rank), *common]
        if rank == 0:
            words += ["--join-timeout", str(timeout), "--", *head_argv(env, plan, head_ip), "--"]
            if plan.shape == "gateway":
                words += [PYTHON, str(run_dir / GATEWAY_FILE), "--address", address,
                          "--replicas", str(plan.replicas), "--max-per-node", str(gateway_cap(plan)),
                          "--served", served, "--ready-timeout", str(budget_s), "--min-replicas", str(minimum),
                          "--replace-timeout", str(grace), "--"]
        else:
            words.append("--")
        out.append(("# a Ray node (raynode.py): Ray first, then the command after its last --", words))
    lines = [f"ENVLAYERS-TOPOLOGY: ray_head={address} ray_nodes={plan.nodes} join_timeout={timeout}s "
             f"temp_dir={TEMP_ROOT}/envlayers-ray-{job_id}-<rank>-<run dir crc32> pids=ray-pids-<rank>.txt "
             f"auth=token ({TOKEN_FILE}, 0600)",
             f"ENVLAYERS-STAGE: rank 0 starts the Ray head: {shlex.join(head_argv(env, plan, head_ip))}"]
    if plan.shape == "gateway":
        lines.append(f"ENVLAYERS-TOPOLOGY: gateway port={plan.api_port} replicas={plan.replicas} "
                     f"max_replicas_per_node={gateway_cap(plan)} (Ray Serve; each replica runs rank 0's vllm serve "
                     "on a free loopback port and proxies to it)")
        lines.append(f"ENVLAYERS-TOPOLOGY: gateway survival: min_replicas={minimum} replace_timeout={grace}s "
                     "(a replica whose server dies is replaced by Serve; the job ends after replace_timeout with "
                     "fewer than min_replicas healthy)")
    return out, lines


def files(shape: str) -> dict[str, str]:
    """The scripts the ranks run, by run-dir file name: the node helper, and the Serve app (gateway)."""
    from importlib import resources  # in the job only: it imports typing

    pkg = resources.files("envlayers")
    out = {NODE_FILE: (pkg / "launch" / "raynode.py").read_text(encoding="utf-8")}
    if shape == "gateway":
        out[GATEWAY_FILE] = (pkg / "gateway_app.py").read_text(encoding="utf-8")
    return out


def write_token(run_dir: Path) -> Path:
    """The job's Ray token: 32 random bytes as hex in ``run_dir/ray-token``, mode 0600 from its creation
    (a successor or requeued run writes its own)."""
    import os
    import secrets

    path = run_dir / TOKEN_FILE
    tmp = run_dir / f".{TOKEN_FILE}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, (secrets.token_hex(32) + "\n").encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return path


def joined_line(run_dir: Path) -> str | None:
    """What the launcher prints once live: the cluster node 0 saw form (ray-cluster.json, by raynode.py)."""
    import json

    try:
        data = json.loads((run_dir / "ray-cluster.json").read_text())
        return (f"ENVLAYERS-STAGE: ray cluster at {data['address']}: {data['nodes']} of {data['nodes']} node(s) "
                f"joined after {data['joined_after_s']}s")
    except (OSError, ValueError, KeyError, TypeError):
        return None
