"""The Ray cluster of the ``ray`` and ``gateway`` shapes, decided before srun: the wrappers around each rank.

Pure: the launch keys, the plan and the allocation's node addresses in, argv words and file texts out.
What runs in the job is :mod:`envlayers.launch.raynode` (one per node: starts ``ray start --block``,
records the PIDs it started, waits until the head sees every node, runs the server, stops everything
by PID) and, for the gateway, :mod:`envlayers.gateway_app` (the Ray Serve deployment). Both are copied
into the run directory next to ranks.sh, because the ranks may run in a container that has Python
and Ray but not envlayers.

Every Ray cluster a job starts has Ray's token authentication on, with a per-job token the launcher
writes 0600 into the run directory before srun (:func:`write_token`; raynode.py points Ray at it), so
no one else who reaches the nodes' Ray ports can join the cluster or run code on it.

The ``ray start`` lines themselves (``RAY_PORT_BASE``, ``RAY_NUM_CPUS``) are built by
:mod:`envlayers.engines.ray`. Launch keys read here (docs/keys.md): ``RAY_JOIN_TIMEOUT_S`` (how long the
head waits for every node) and for the gateway ``GATEWAY_REPLACE_TIMEOUT_S`` (how long fewer than
``MIN_REPLICAS`` may be healthy while Serve replaces them; default the readiness budget). The head's own
port is ``RDZV_PORT`` (the plan's rendezvous port, scanned upward for a free one on the head node).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Mapping, Sequence

from .. import keys, shell
from ..engines.ray import head_argv
from ..joblines import STAGE, TOPOLOGY
from ..rundir import GATEWAY_APP, RAY_CLUSTER, RAY_NODE, RAY_TOKEN, RayCluster, ray_pids_name, read_record

RAY_SHAPES = ("ray", "gateway")
PYTHON = "python3"  # the ranks' Python: the container's, or the host's with CONTAINER_RUNTIME=none
TEMP_ROOT = "/tmp"  # Ray's socket paths must stay short (a Unix socket path has at most 107 bytes)


def join_timeout_s(env: Mapping[str, str]) -> int:
    """``RAY_JOIN_TIMEOUT_S``: seconds the head waits for every node to join; absent -> 300, empty -> error."""
    return keys.value(env, "RAY_JOIN_TIMEOUT_S")


def replace_timeout_s(env: Mapping[str, str], budget_s: int) -> int:
    """``GATEWAY_REPLACE_TIMEOUT_S``: seconds the gateway runs with fewer than MIN_REPLICAS healthy replicas
    while Serve replaces them; absent -> the readiness budget (a new replica starts a new server)."""
    return keys.value(env, "GATEWAY_REPLACE_TIMEOUT_S", budget_s)


def gateway_cap(plan) -> int:
    """Gateway replicas one node may hold: the instances its GPUs fit, at least 1 (an instance that
    spans nodes)."""
    return max(1, plan.gpus_per_node // plan.world)


# --------------------------------------------------------------------------- in the job


def wrappers(env: Mapping[str, str], plan, run_dir: Path, job_id: str, node_addrs: Sequence[str],
             served: str, budget_s: int, min_replicas: int) -> tuple[list[tuple[str, list[str]]], list[str]]:
    """Per rank, the words ranks.sh puts before the rank's command (``raynode.py ... --``), and the lines
    the launcher prints. Rank 0 starts the head and, once every node joined, its server: ``vllm serve``
    (ray) or the Ray Serve gateway in front of the replicas (gateway; ``min_replicas`` must stay healthy);
    ranks > 0 run the worker command they already have."""
    head_ip = node_addrs[0]
    address = f"{head_ip}:{plan.rdzv_port}"
    timeout = join_timeout_s(env)
    node = str(run_dir / RAY_NODE)
    if plan.shape == "gateway":
        minimum, grace = min_replicas, replace_timeout_s(env, budget_s)
    # the gateway's replicas read the endpoint's key from its file (0600): Ray's processes never carry it
    key_file = keys.text(env, "SERVER_API_KEY_FILE")
    key_words = ["--api-key-file", key_file] if key_file else []
    common = ["--run-dir", str(run_dir), "--job", job_id, "--address", address, "--nodes", str(plan.nodes),
              "--auth-token-file", str(run_dir / RAY_TOKEN)]
    out: list[tuple[str, list[str]]] = []
    for rank in range(plan.nodes):
        words = [PYTHON, node, "--rank", str(rank), *common]
        if rank == 0:
            words += ["--join-timeout", str(timeout), "--", *head_argv(env, plan, head_ip), "--"]
            if plan.shape == "gateway":
                words += [PYTHON, str(run_dir / GATEWAY_APP), "--address", address,
                          "--replicas", str(plan.replicas), "--max-per-node", str(gateway_cap(plan)),
                          "--served", served, "--ready-timeout", str(budget_s), "--min-replicas", str(minimum),
                          "--replace-timeout", str(grace), *key_words, "--"]
        else:
            words.append("--")
        out.append(("# a Ray node (raynode.py): Ray first, then the command after its last --", words))
    lines = [TOPOLOGY.line(f"ray_head={address} ray_nodes={plan.nodes} join_timeout={timeout}s "
                           f"temp_dir={TEMP_ROOT}/envlayers-ray-{job_id}-<rank>-<run dir crc32> "
                           f"pids={ray_pids_name('<rank>')} auth=token ({RAY_TOKEN}, 0600)"),
             STAGE.line(f"rank 0 starts the Ray head: {shell.words(head_argv(env, plan, head_ip))}")]
    if plan.shape == "gateway":
        lines.append(TOPOLOGY.line(f"gateway port={plan.api_port} replicas={plan.replicas} "
                                   f"max_replicas_per_node={gateway_cap(plan)} (Ray Serve; each replica runs rank "
                                   "0's vllm serve on a free loopback port and proxies to it)"))
        lines.append(TOPOLOGY.line(f"gateway survival: min_replicas={minimum} replace_timeout={grace}s "
                                   "(a replica whose server dies is replaced by Serve; the job ends after "
                                   "replace_timeout with fewer than min_replicas healthy)"))
    return out, lines


def files(shape: str) -> dict[str, str]:
    """The scripts the ranks run, by run-dir file name: the node helper, and the Serve app (gateway)."""
    pkg = resources.files("envlayers")
    out = {RAY_NODE: (pkg / "launch" / "raynode.py").read_text(encoding="utf-8")}
    if shape == "gateway":
        out[GATEWAY_APP] = (pkg / "gateway_app.py").read_text(encoding="utf-8")
    return out


def write_token(run_dir: Path) -> Path:
    """The job's Ray token: 32 random bytes as hex in ``run_dir/ray-token``, mode 0600 from its creation
    (fsutil.atomic_write: a temporary file made 0600, renamed over it; a successor or requeued run writes
    its own)."""
    import secrets

    from ..fsutil import atomic_write

    path = run_dir / RAY_TOKEN
    atomic_write(path, secrets.token_hex(32) + "\n", mode=0o600)
    return path


def joined_line(run_dir: Path) -> str | None:
    """What the launcher prints once live: the cluster node 0 saw form (ray-cluster.json, by raynode.py)."""
    seen = read_record(run_dir / RAY_CLUSTER, RayCluster)
    if seen is None or None in (seen.address, seen.nodes, seen.joined_after_s):
        return None
    return STAGE.line(f"ray cluster at {seen.address}: {seen.nodes} of {seen.nodes} node(s) "
                      f"joined after {seen.joined_after_s}s")
