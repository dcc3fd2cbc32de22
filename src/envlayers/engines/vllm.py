"""vLLM (0.28 era): ``vllm serve MODEL`` for one rank.

A multi-node (pipeline) plan runs without Ray: every rank gets ``--nnodes N --node-rank
R --master-addr MASTER --master-port RDZV_PORT`` and ranks > 0 add ``--headless`` (no
API server). The API key goes to vLLM as ``VLLM_API_KEY`` in its environment (vLLM's
``build_app`` uses it when ``--api-key`` is absent), never on its command line. vLLM rejects ``--api-server-count`` in headless mode, so it is removed from
``SERVER_EXTRA_ARGS`` on those ranks: one value works for every node.
"""

from __future__ import annotations

from typing import Mapping

from envlayers.engines import (
    RankCommand,
    command_env,
    drop_flag,
    extra_args,
    flag,
    has_key,
    required,
    server_host,
)
from envlayers.topology import Plan, RankPlan

COMMAND: tuple[str, ...] = ("vllm", "serve")
KEY_ENV = "VLLM_API_KEY"
HEADLESS_REJECTS: tuple[str, ...] = ("--api-server-count", "--api_server_count", "-asc")


def build(plan: Plan, env: Mapping[str, str], rank: RankPlan, master_addr: str) -> RankCommand:
    headless = plan.multi_node and rank.rank > 0
    argv = [
        *COMMAND,
        required(env, "INFERENCE_MODEL", "the model path or Hugging Face id"),
        "--served-model-name", required(env, "VLLM_SERVED_MODEL", "the model name clients use"),
        "--tensor-parallel-size", str(plan.tp),
        "--pipeline-parallel-size", str(plan.pp),
    ]
    if plan.multi_node:
        argv += [
            "--nnodes", str(plan.nodes),
            "--node-rank", str(rank.rank),
            "--master-addr", master_addr,
            "--master-port", str(plan.rdzv_port),
        ]
        if headless:
            argv.append("--headless")
    argv += ["--host", server_host(env), "--port", str(plan.api_port)]
    argv += flag(env, "GPU_MEMORY_UTILIZATION", "--gpu-memory-utilization")
    argv += flag(env, "MAX_MODEL_LEN", "--max-model-len")
    argv += flag(env, "REASONING_PARSER", "--reasoning-parser")
    tool_parser = flag(env, "TOOL_CALL_PARSER", "--tool-call-parser")
    if tool_parser:
        argv += [*tool_parser, "--enable-auto-tool-choice"]
    extras = extra_args(env)
    if headless:
        extras = drop_flag(extras, HEADLESS_REJECTS)
    argv += extras
    # the key through the environment (vLLM reads VLLM_API_KEY when --api-key is absent), never
    # on the command line, which every user of the node can read in /proc/<pid>/cmdline
    return RankCommand(argv=tuple(argv), env=command_env(env), key_env=KEY_ENV if has_key(env) else None)
