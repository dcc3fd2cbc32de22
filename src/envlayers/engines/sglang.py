"""SGLang (0.5.x): ``python3 -m sglang.launch_server`` for one rank.

Host and port are always explicit: SGLang binds 127.0.0.1:30000 by default. A
multi-node (pipeline) plan gives every rank ``--nnodes N --node-rank R
--dist-init-addr MASTER:RDZV_PORT``; ranks > 0 then run SGLang's dummy health server on
the same host and port of their own node, which is why readiness probes rank 0 only.
SGLang takes the API key only as ``--api-key`` on its command line; it is appended last,
filled in by ranks.sh at run time.

SGLang serves ``/metrics`` (Prometheus text) only with ``--enable-metrics``; the launcher
passes it unless ``SGLANG_ENABLE_METRICS`` is empty or false, so every engine answers
``<base>/metrics`` as vLLM does.
"""

from __future__ import annotations

from typing import Mapping

from envlayers.engines.command import (
    RankCommand,
    command_env,
    extra_args,
    flag,
    has_key,
    required,
    server_host,
)
from envlayers import keys
from envlayers.topology import Plan, RankPlan

COMMAND: tuple[str, ...] = ("python3", "-m", "sglang.launch_server")
DEFAULT_ATTENTION_BACKEND = "aiter"  # ROCm's kernels: AMD only (GPU_VENDOR); on NVIDIA SGLang picks its own
# SGLang reads its API key only from ``--api-key`` (ServerArgs.api_key; no environment variable):
# a known limit, see docs/keys.md
KEY_FLAG = "--api-key"


def build(plan: Plan, env: Mapping[str, str], rank: RankPlan, master_addr: str, node_addr: str = "") -> RankCommand:
    # node_addr: not needed, SGLang's ranks meet at --dist-init-addr and take their address from it
    argv = [
        *COMMAND,
        "--model-path", required(env, "INFERENCE_MODEL", "the model path or Hugging Face id"),
        "--served-model-name", required(env, "VLLM_SERVED_MODEL", "the model name clients use"),
        "--tp-size", str(plan.tp),
        "--pp-size", str(plan.pp),
    ]
    if plan.multi_node:
        argv += [
            "--nnodes", str(plan.nodes),
            "--node-rank", str(rank.rank),
            "--dist-init-addr", f"{master_addr}:{plan.rdzv_port}",
        ]
    argv += ["--host", server_host(env, plan.nodes), "--port", str(plan.api_port)]
    argv += flag(env, "MEM_FRACTION_STATIC", "--mem-fraction-static")
    argv += flag(env, "SGLANG_ATTENTION_BACKEND", "--attention-backend",
                 None if keys.value(env, "GPU_VENDOR") == "nvidia" else DEFAULT_ATTENTION_BACKEND)
    argv += flag(env, "MAX_MODEL_LEN", "--context-length")
    argv += metrics_flag(env)
    argv += flag(env, "REASONING_PARSER", "--reasoning-parser")
    argv += flag(env, "TOOL_CALL_PARSER", "--tool-call-parser")
    argv += extra_args(env)
    return RankCommand(argv=tuple(argv), env=command_env(env), key_flag=KEY_FLAG if has_key(env) else None)


def metrics_enabled(env: Mapping[str, str]) -> bool:
    """``SGLANG_ENABLE_METRICS``: absent -> on (vLLM serves /metrics always, SGLang only with
    ``--enable-metrics``), empty -> off, else a boolean (``envlayers.keys``' one rule)."""
    return keys.value(env, "SGLANG_ENABLE_METRICS")


def metrics_flag(env: Mapping[str, str]) -> list[str]:
    """``--enable-metrics`` unless ``SGLANG_ENABLE_METRICS`` turns it off."""
    return ["--enable-metrics"] if metrics_enabled(env) else []
