"""vLLM (0.28 era): ``vllm serve MODEL`` for one rank.

A multi-node (pipeline) plan runs without Ray: every rank gets ``--nnodes N --node-rank
R --master-addr MASTER --master-port RDZV_PORT`` and ranks > 0 add ``--headless`` (no
API server). The API key goes to vLLM as ``VLLM_API_KEY`` in its environment (vLLM's
``build_app`` uses it when ``--api-key`` is absent), never on its command line. vLLM rejects ``--api-server-count`` in headless mode, so it is removed from
``SERVER_EXTRA_ARGS`` on those ranks: one value works for every node.

The other shapes (docs/topology.md), each in its own function below:

- ``data-parallel``: one ``vllm serve`` per node with ``--data-parallel-size N
  --data-parallel-size-local L --data-parallel-address NODE0 --data-parallel-rpc-port P``;
  node 0 serves the API and coordinates, the others add ``--headless
  --data-parallel-start-rank K`` (vLLM's multi-node data-parallel layout). Node 0 never gets
  a start rank: vLLM takes ``--data-parallel-start-rank`` without ``--headless`` as hybrid
  load balancing. On one node only ``--data-parallel-size N``.
- ``ray`` and ``gateway``: ``--distributed-executor-backend ray`` on the head only; the other
  ranks run a Ray worker (``ray start --address=NODE0:RDZV_PORT ... --block``, its flags from
  engines/ray.py). In the job, node 0 first starts the Ray head and waits for every node
  (launch/raynode.py); the gateway runs this ``vllm serve`` once per Ray Serve replica.

Every multi-node rank gets ``VLLM_HOST_IP`` set to its own node's address, the same way in every
shape (vLLM otherwise guesses it from the default route, and falls back to 0.0.0.0).

Headless ranks also lose ``--data-parallel-hybrid-lb``, which vLLM rejects in headless mode.
Every multi-node vLLM command gets ``VLLM_ALLREDUCE_USE_SYMM_MEM=0`` unless the key says
otherwise (vLLM turns symmetric-memory all-reduce on by default, and it deadlocks across nodes
at engine start).
"""

from __future__ import annotations

from typing import Mapping

from envlayers.engines.command import (
    RankCommand,
    command_env,
    drop_flag,
    extra_args,
    flag,
    has_key,
    required,
    server_host,
)
from envlayers.engines.ray import head_argv, worker_argv
from envlayers.topology import Plan, RankPlan

COMMAND: tuple[str, ...] = ("vllm", "serve")
KEY_ENV = "VLLM_API_KEY"
HEADLESS_REJECTS: tuple[str, ...] = ("--api-server-count", "--api_server_count", "-asc")
HEADLESS_REJECTS_BARE: tuple[str, ...] = ("--data-parallel-hybrid-lb", "--data_parallel_hybrid_lb", "-dph")
SYMM_MEM_KEY = "VLLM_ALLREDUCE_USE_SYMM_MEM"
HOST_IP_KEY = "VLLM_HOST_IP"
DEFAULT_SYMM_MEM = "0"


def build(plan: Plan, env: Mapping[str, str], rank: RankPlan, master_addr: str, node_addr: str) -> RankCommand:
    if plan.backend == "ray" and rank.rank > 0:
        return ray_worker_command(plan, env, master_addr, node_addr)
    headless = is_headless(plan, rank)
    argv = [
        *COMMAND,
        required(env, "INFERENCE_MODEL", "the model path or Hugging Face id"),
        "--served-model-name", required(env, "VLLM_SERVED_MODEL", "the model name clients use"),
        "--tensor-parallel-size", str(plan.tp),
        "--pipeline-parallel-size", str(plan.pp),
    ]
    argv += shape_flags(plan, rank, master_addr)
    argv += ["--host", server_host(env, plan.nodes), "--port", str(plan.api_port)]
    argv += flag(env, "GPU_MEMORY_UTILIZATION", "--gpu-memory-utilization")
    argv += flag(env, "MAX_MODEL_LEN", "--max-model-len")
    argv += flag(env, "REASONING_PARSER", "--reasoning-parser")
    tool_parser = flag(env, "TOOL_CALL_PARSER", "--tool-call-parser")
    if tool_parser:
        argv += [*tool_parser, "--enable-auto-tool-choice"]
    extras = extra_args(env)
    if headless:
        extras = drop_headless_rejects(extras)
    argv += extras
    # the key through the environment (vLLM reads VLLM_API_KEY when --api-key is absent), never
    # on the command line, which every user of the node can read in /proc/<pid>/cmdline
    return RankCommand(argv=tuple(argv), env={**command_env(env), **multi_node_env(plan, env, node_addr)},
                       key_env=KEY_ENV if has_key(env) else None)


# --------------------------------------------------------------------------- per shape


def is_headless(plan: Plan, rank: RankPlan) -> bool:
    """A rank that runs engines but no API server: ranks > 0 of a pipeline or data-parallel plan."""
    return plan.multi_node and rank.rank > 0 and plan.shape in ("pipeline", "data-parallel")


def shape_flags(plan: Plan, rank: RankPlan, master_addr: str) -> list[str]:
    """The flags that place this rank in its shape (after ``--pipeline-parallel-size``)."""
    if plan.shape == "pipeline":
        flags = [
            "--nnodes", str(plan.nodes),
            "--node-rank", str(rank.rank),
            "--master-addr", master_addr,
            "--master-port", str(plan.rdzv_port),
        ]
        return flags + (["--headless"] if is_headless(plan, rank) else [])
    if plan.shape == "data-parallel":
        return data_parallel_flags(plan, rank, master_addr)
    if plan.backend == "ray":
        return ["--distributed-executor-backend", "ray"]
    return []


def data_parallel_flags(plan: Plan, rank: RankPlan, master_addr: str) -> list[str]:
    """vLLM's multi-node data-parallel flags for one node (only the size on one node)."""
    flags = ["--data-parallel-size", str(plan.replicas)]
    if plan.nodes == 1:
        return flags
    if is_headless(plan, rank):
        flags = ["--headless", *flags, "--data-parallel-start-rank", str(plan.dp_start_rank(rank))]
    return flags + [
        "--data-parallel-size-local", str(plan.instances_per_node),
        "--data-parallel-address", master_addr,
        "--data-parallel-rpc-port", str(plan.dp_rpc_port),
    ]


def ray_worker_command(plan: Plan, env: Mapping[str, str], master_addr: str, node_addr: str) -> RankCommand:
    """A rank > 0 of a Ray plan: a Ray worker joining the head on node 0 (no vLLM of its own).

    The workers Ray starts on this node inherit this environment, so it carries the same
    variables as the head's server command."""
    return RankCommand(argv=worker_argv(env, plan, master_addr),
                       env={**command_env(env), **multi_node_env(plan, env, node_addr)})


def ray_head_command(plan: Plan, env: Mapping[str, str] | None = None, node_ip: str | None = None) -> tuple[str, ...]:
    """What node 0 of a Ray plan starts before its server: the Ray head on ``RDZV_PORT``."""
    return head_argv(env or {}, plan, node_ip)


def drop_headless_rejects(args: list[str]) -> list[str]:
    """``SERVER_EXTRA_ARGS`` without the flags vLLM rejects in headless mode."""
    kept = drop_flag(args, HEADLESS_REJECTS)
    return [a for a in kept if a not in HEADLESS_REJECTS_BARE]


def multi_node_env(plan: Plan, env: Mapping[str, str], node_addr: str) -> dict[str, str]:
    """The variables of a multi-node command: ``VLLM_HOST_IP``, the rank's own node address (vLLM announces
    it to its peers; without it a node with no default route, or whose name does not resolve, says
    `Failed to get the IP address, using 0.0.0.0 by default` and the ranks never meet), and
    ``VLLM_ALLREDUCE_USE_SYMM_MEM``: absent -> 0, empty -> not set, a value -> it."""
    if not plan.multi_node:
        return {}
    out = {HOST_IP_KEY: node_addr}
    value = env.get(SYMM_MEM_KEY)
    if value is None:
        out[SYMM_MEM_KEY] = DEFAULT_SYMM_MEM
    elif value != "":
        out[SYMM_MEM_KEY] = value
    return out
