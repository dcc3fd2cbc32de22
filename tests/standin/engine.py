"""Test-only stand-in for the GPU inference engines (vLLM and SGLang).

Never used in production: it exists so that the launcher's real, rendered command lines
(``vllm serve ...`` and ``python3 -m sglang.launch_server ...``) can run unchanged on machines
without GPUs, e.g. on the project's local Slurm cluster. Standard library only; it is loaded by
path from ``bin/vllm`` and ``pypath/sglang/launch_server.py``, so it needs neither envlayers nor
any third-party package, and works from any working directory.

What it does, per engine:
- parses the command line against a table of the real engine's flags (unknown flag: exit 2 with
  an argparse error, as the real engine does; SGLang accepts unique prefixes like argparse, so
  ``--pp`` is an ambiguous option, while vLLM takes exact names and ``--snake_case`` spellings);
- prints the engine's real startup lines, in the real order, with the real prefixes and
  timestamps, spread over the load time, flushing every line (SGLang logs to stderr, vLLM to
  stdout, as the real ones do);
- serves an OpenAI-compatible API on the address and port the command line asks for (defaults
  as the real engines: SGLang 127.0.0.1:30000, vLLM all interfaces:8000), but only once the
  model is "loaded": before that the port refuses connections (vLLM binds it early and listens
  late; SGLang binds and listens at its uvicorn line, /health says 503 until "fired up");
- multi-node: ranks > 0 (SGLang ``--node-rank`` >= 1, vLLM ``--headless``) print their startup
  lines and then stay alive until terminated, never binding the API port;
- SIGTERM / SIGINT: exit 0 at once.

Endpoints (rank 0): ``GET /v1/models``, ``POST /v1/chat/completions``, ``POST /v1/completions``
(``stream: true`` supported), ``GET /health``, ``GET /health_generate``, ``GET /ping``,
``GET /version``, ``GET /metrics`` (Prometheus text; SGLang only with ``--enable-metrics``, as the
real one). With ``--api-key``, ``Authorization: Bearer <key>`` is needed as by the real engines:
vLLM on ``/v1/*`` only, SGLang everywhere but ``/health*`` and ``/metrics``.

Behaviour knobs (environment variables; all optional):

  STANDIN_LOAD_SECONDS=1            time from start to serving, spread over the phases
  STANDIN_CRASH_AT=<phase>          print a traceback at that phase and exit with STANDIN_EXIT_CODE
  STANDIN_EXIT_CODE=1               exit status of an injected crash
  STANDIN_CRASH_MESSAGE=<text>      last line of the injected traceback (default names the knob)
  STANDIN_CRASH_SIGNAL=<KILL|SEGV|ABRT|...>
                                    at the crash point, die by this signal instead, with no
                                    traceback (KILL looks like the kernel OOM killer)
  STANDIN_HANG_AT=<phase>           stop printing at that phase and never listen (until killed)
  STANDIN_CRASH_AFTER_READY_SECONDS=<s>
                                    serve, then crash (traceback, STANDIN_EXIT_CODE) s seconds later;
                                    on ranks > 0: s seconds after their startup lines
  STANDIN_CORE_DIES_AFTER_READY_SECONDS=<s>
                                    vLLM: serve, then s seconds later say what vLLM's API server says
                                    when its engine core process dies ("[shutdown] MPClient: engine core
                                    exited unexpectedly; starting cleanup"), answer 500 to completions and
                                    exit (STANDIN_EXIT_CODE) STANDIN_CORE_DEATH_EXIT_SECONDS (default 4,
                                    as the real 0.32 CPU build) later
  STANDIN_INJECT_AT=<phase>         print extra log lines at that phase (after its first lines):
  STANDIN_INJECT=<text|@file>       the lines (real newlines or the two characters \\n separate them)
  STANDIN_RANKS=0,2                 ranks the crash/hang/inject knobs apply to (default: all).
                                    rank = --node-rank if given (both engines); else vLLM
                                    --data-parallel-start-rank // --data-parallel-size-local;
                                    else SLURM_PROCID; else 0
  STANDIN_RECORD=<file>             append one JSON line per start: argv (the engine's arguments),
                                    entry, orig_argv (the whole command), engine, rank, host, pid,
                                    cwd, selected env (NCCL_*, RCCL_*, FI_*, SLURM_*, CUDA/HIP/ROCR
                                    visible devices, VLLM_*, SGLANG_*, HF_*), RLIMIT_CORE, CPU count
                                    of the affinity mask, and whether the command line was rejected
  STANDIN_HYBRID=0|1                print SGLang's "Mamba Cache is allocated" line (default: guessed
                                    from the model name, e.g. Qwen3.5+/Next/Mamba/Nemotron-H)
  STANDIN_KV_TOKENS=<n>             KV cache size in tokens printed by both engines
  STANDIN_AVAIL_MEM_GB=120          per-GPU free memory printed before weight loading
  STANDIN_NCCL_NETWORK=<name>       network printed in "NCCL INFO Using network <name>" (printed only
                                    when NCCL_DEBUG=INFO/TRACE and more than one GPU); default: the
                                    canonical name of NCCL_NET if set, else "Socket"
  STANDIN_NCCL_NETWORKS=Socket     networks this "machine" has (comma list). When set, a multi-GPU
                                    engine whose NCCL_NET names another one fails at init with NCCL's
                                    "Failed to initialize any NET plugin", as a forced NCCL_NET does
                                    without the fabric plugin (default: unset, any NCCL_NET works)
  STANDIN_SGLANG_DUMMY_HEALTH=1     SGLang ranks >= 1 run the real engine's dummy health server
                                    (/health, /health_generate, /ping answer 200) on --host/--port
                                    (off by default: on a one-host test cluster it would collide)
  STANDIN_PRINT_ARGS=0              do not print the engine's own argument dump (the real engines
                                    print it, API key included; default 1)
  STANDIN_REPLY=<text>              completion text (default: "Hello! You said: <last user message>")
  STANDIN_RAY_NODES=<n>             vLLM with --distributed-executor-backend ray: the live node count the
                                    Ray cluster must have (default: any count with enough GPUs)
  STANDIN_REASONING=0|1             the model thinks (default: guessed from its name); its reasoning is
                                    separate only with --reasoning-parser, else <think> inline in content
  (signals)                         SIGUSR1: hung (nothing answers); SIGUSR2: stalled (/health answers,
                                    completions never get a token): install_hang_signal
  STANDIN_WRONG_ANSWERS=1           answer the accuracy gate's prompts wrongly (env_layers verify)
  STANDIN_LOG_STREAM=stdout|stderr  override where log lines go
  STANDIN_TTFT_S=<s>                streamed replies: seconds before the first token (default 0)
  STANDIN_MAX_RUNNING=<n>           completions run at most n at a time; the others wait in a queue
                                    (vllm:num_requests_waiting / sglang:num_queue_reqs, and the queue-time
                                    histogram vllm:request_queue_time_seconds / sglang:queue_time_seconds)
  STANDIN_REQUEST_S=<s>             each completion holds its place s seconds before it is answered
  STANDIN_TOKENS_PER_S=<r>          streamed replies: tokens per second after it, per request
                                    (default unpaced); with ``ignore_eos: true`` a reply is padded to
                                    max_tokens, as the real engines generate to the limit

Phases, in order (aliases in brackets): start, init [dist], weights [load, weight],
kv [kv-cache, cache, memory], graphs [graph, capture, cuda-graph], listen [serve, http],
ready. ``listen`` is after the server-start lines and before the port listens; ``ready`` is
just after the engine says it is ready.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hmac
import io
import json
import os
import re
import signal
import socket
import socketserver
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

VERSIONS = {"sglang": "0.5.20", "vllm": "0.28.0"}

PHASES = ("start", "init", "weights", "kv", "graphs", "listen", "ready")
PHASE_ALIASES = {
    "dist": "init", "load": "weights", "weight": "weights", "kv-cache": "kv", "kv_cache": "kv",
    "cache": "kv", "memory": "kv", "graph": "graphs", "capture": "graphs", "cuda-graph": "graphs",
    "cuda_graph": "graphs", "serve": "listen", "http": "listen",
}
# share of STANDIN_LOAD_SECONDS spent in each phase
PHASE_SHARE = {"start": 0.05, "init": 0.10, "weights": 0.40, "kv": 0.10, "graphs": 0.25, "listen": 0.10,
               "ready": 0.0}

# the vLLM startup logs the stand-in prints (STANDIN_VLLM_LOG): 0.28 on GPUs (the catalog's images), 0.32 on
# GPUs, 0.32's CPU build (what tests/test_standin_vs_real.py compares with the real engine)
VLLM_LOGS = {"0.28": "0.28.0", "0.32": "0.32.0", "0.32-cpu": "0.32.0"}

RECORD_ENV_PREFIXES = ("NCCL_", "RCCL_", "FI_", "SLURM_", "VLLM_", "SGLANG_", "HF_")
RECORD_ENV_KEYS = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "SLURMD_NODENAME",
                   "TRANSFORMERS_CACHE", "OMP_NUM_THREADS", "PYTHONPATH",
                   "RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_TOKEN")  # the token itself: recorded to see it absent


class KnobError(Exception):
    pass


# ----------------------------------------------------------------------------------------------
# Flag tables: (option strings, dest, kind, extra). kind: "v" value, "b" boolean, "n" one or more
# values, "i"/"f" int/float value. Only flags that exist in the real engine belong here.
# ----------------------------------------------------------------------------------------------

SGLANG_ATTENTION_BACKENDS = (
    "triton", "torch_native", "flex_attention", "dsa", "nsa", "dsv4", "compressed", "cutlass_mla", "fa3",
    "fa4", "flashinfer", "flashmla", "trtllm_mla", "cutedsl_mla", "tokenspeed_mla", "trtllm_mha",
    "dual_chunk_flash_attn", "hpc_ops", "minicpm_flashattn", "minicpm_flashinfer", "aiter", "wave",
    "intel_amx", "ascend", "intel_xpu",
)
SGLANG_KV_DTYPES = ("auto", "fp8_e5m2", "fp8_e4m3", "mxfp8", "bf16", "bfloat16", "nvfp4", "fp4_mx_block16",
                    "fp4_e2m1")

SGLANG_FLAGS = [
    # model and tokenizer
    (("--model-path", "--model"), "model_path", "v", {"required": True}),
    (("--tokenizer-path",), "tokenizer_path", "v", {}),
    (("--tokenizer-mode",), "tokenizer_mode", "v", {"choices": ("auto", "slow")}),
    (("--tokenizer-worker-num",), "tokenizer_worker_num", "i", {}),
    (("--skip-tokenizer-init",), "skip_tokenizer_init", "b", {}),
    (("--load-format",), "load_format", "v", {}),
    (("--model-loader-extra-config",), "model_loader_extra_config", "v", {}),
    (("--trust-remote-code",), "trust_remote_code", "b", {}),
    (("--context-length",), "context_length", "i", {}),
    (("--is-embedding",), "is_embedding", "b", {}),
    (("--enable-multimodal",), "enable_multimodal", "b", {}),
    (("--revision",), "revision", "v", {}),
    (("--model-impl",), "model_impl", "v", {}),
    (("--json-model-override-args",), "json_model_override_args", "v", {}),
    (("--download-dir",), "download_dir", "v", {}),
    # quantization and data type
    (("--dtype",), "dtype", "v", {"choices": ("auto", "half", "float16", "bfloat16", "float", "float32")}),
    (("--quantization",), "quantization", "v", {}),
    (("--quantization-param-path",), "quantization_param_path", "v", {}),
    (("--kv-cache-dtype",), "kv_cache_dtype", "v", {"choices": SGLANG_KV_DTYPES}),
    # memory and scheduling
    (("--mem-fraction-static",), "mem_fraction_static", "f", {}),
    (("--max-running-requests",), "max_running_requests", "i", {}),
    (("--max-queued-requests",), "max_queued_requests", "i", {}),
    (("--max-total-tokens",), "max_total_tokens", "i", {}),
    (("--chunked-prefill-size",), "chunked_prefill_size", "i", {}),
    (("--max-prefill-tokens",), "max_prefill_tokens", "i", {}),
    (("--schedule-policy",), "schedule_policy", "v", {}),
    (("--schedule-conservativeness",), "schedule_conservativeness", "f", {}),
    (("--enable-priority-scheduling",), "enable_priority_scheduling", "b", {}),
    (("--page-size",), "page_size", "i", {}),
    (("--max-mamba-cache-size",), "max_mamba_cache_size", "i", {}),
    (("--mamba-ssm-dtype",), "mamba_ssm_dtype", "v", {}),
    (("--mamba-full-memory-ratio",), "mamba_full_memory_ratio", "f", {}),
    (("--mamba-scheduler-strategy",), "mamba_scheduler_strategy", "v", {}),
    (("--hybrid-kvcache-ratio",), "hybrid_kvcache_ratio", "f", {}),
    (("--enable-hierarchical-cache",), "enable_hierarchical_cache", "b", {}),
    (("--hicache-ratio",), "hicache_ratio", "f", {}),
    (("--hicache-size",), "hicache_size", "i", {}),
    (("--hicache-write-policy",), "hicache_write_policy", "v", {}),
    (("--hicache-storage-backend",), "hicache_storage_backend", "v", {}),
    (("--disable-radix-cache",), "disable_radix_cache", "b", {}),
    (("--allow-auto-truncate",), "allow_auto_truncate", "b", {}),
    # runtime
    (("--device",), "device", "v", {}),
    (("--tp-size", "--tensor-parallel-size"), "tp_size", "i", {"default": 1}),
    (("--pp-size", "--pipeline-parallel-size"), "pp_size", "i", {"default": 1}),
    (("--pp-max-micro-batch-size",), "pp_max_micro_batch_size", "i", {}),
    (("--pp-async-batch-depth",), "pp_async_batch_depth", "i", {}),
    (("--dp-size", "--data-parallel-size"), "dp_size", "i", {"default": 1}),
    (("--ep-size", "--expert-parallel-size"), "ep_size", "i", {"default": 1}),
    (("--load-balance-method",), "load_balance_method", "v", {}),
    (("--enable-dp-attention",), "enable_dp_attention", "b", {}),
    (("--enable-dp-lm-head",), "enable_dp_lm_head", "b", {}),
    (("--stream-interval",), "stream_interval", "i", {}),
    (("--random-seed",), "random_seed", "i", {}),
    (("--watchdog-timeout",), "watchdog_timeout", "f", {}),
    (("--dist-timeout",), "dist_timeout", "i", {}),
    (("--base-gpu-id",), "base_gpu_id", "i", {}),
    (("--gpu-id-step",), "gpu_id_step", "i", {}),
    (("--sleep-on-idle",), "sleep_on_idle", "b", {}),
    # HTTP server
    (("--host",), "host", "v", {"default": "127.0.0.1"}),
    (("--port",), "port", "i", {"default": 30000}),
    (("--nccl-port",), "nccl_port", "i", {}),
    (("--skip-server-warmup",), "skip_server_warmup", "b", {}),
    (("--warmups",), "warmups", "v", {}),
    (("--api-key",), "api_key", "v", {}),
    (("--served-model-name",), "served_model_name", "v", {}),
    (("--chat-template",), "chat_template", "v", {}),
    (("--completion-template",), "completion_template", "v", {}),
    (("--file-storage-path",), "file_storage_path", "v", {}),
    (("--enable-cache-report",), "enable_cache_report", "b", {}),
    (("--reasoning-parser",), "reasoning_parser", "v", {}),
    (("--tool-call-parser",), "tool_call_parser", "v", {}),
    (("--tool-server",), "tool_server", "v", {}),
    (("--preferred-sampling-params",), "preferred_sampling_params", "v", {}),
    # logging and metrics
    (("--log-level",), "log_level", "v", {}),
    (("--log-level-http",), "log_level_http", "v", {}),
    (("--log-requests",), "log_requests", "b", {}),
    (("--log-requests-level",), "log_requests_level", "i", {}),
    (("--show-time-cost",), "show_time_cost", "b", {}),
    (("--enable-metrics",), "enable_metrics", "b", {}),
    (("--enable-metrics-for-all-schedulers",), "enable_metrics_for_all_schedulers", "b", {}),
    (("--collect-tokens-histogram",), "collect_tokens_histogram", "b", {}),
    (("--decode-log-interval",), "decode_log_interval", "i", {}),
    (("--crash-dump-folder",), "crash_dump_folder", "v", {}),
    # multi-node
    (("--dist-init-addr", "--nccl-init-addr"), "dist_init_addr", "v", {}),
    (("--nnodes",), "nnodes", "i", {"default": 1}),
    (("--node-rank",), "node_rank", "i", {"default": 0}),
    # kernels and backends
    (("--attention-backend",), "attention_backend", "v", {"choices": SGLANG_ATTENTION_BACKENDS}),
    (("--prefill-attention-backend",), "prefill_attention_backend", "v", {"choices": SGLANG_ATTENTION_BACKENDS}),
    (("--decode-attention-backend",), "decode_attention_backend", "v", {"choices": SGLANG_ATTENTION_BACKENDS}),
    (("--mm-attention-backend",), "mm_attention_backend", "v", {}),
    (("--sampling-backend",), "sampling_backend", "v", {}),
    (("--grammar-backend",), "grammar_backend", "v", {}),
    (("--moe-runner-backend",), "moe_runner_backend", "v", {}),
    (("--moe-a2a-backend",), "moe_a2a_backend", "v", {}),
    (("--enable-eplb",), "enable_eplb", "b", {}),
    (("--speculative-algorithm",), "speculative_algorithm", "v", {}),
    (("--speculative-draft-model-path",), "speculative_draft_model_path", "v", {}),
    (("--speculative-num-steps",), "speculative_num_steps", "i", {}),
    (("--speculative-eagle-topk",), "speculative_eagle_topk", "i", {}),
    (("--speculative-num-draft-tokens",), "speculative_num_draft_tokens", "i", {}),
    (("--disable-cuda-graph",), "disable_cuda_graph", "b", {}),
    (("--disable-cuda-graph-padding",), "disable_cuda_graph_padding", "b", {}),
    (("--cuda-graph-max-bs",), "cuda_graph_max_bs", "i", {}),
    (("--cuda-graph-bs",), "cuda_graph_bs", "n", {}),
    (("--enable-torch-compile",), "enable_torch_compile", "b", {}),
    (("--torch-compile-max-bs",), "torch_compile_max_bs", "i", {}),
    (("--disable-overlap-schedule",), "disable_overlap_schedule", "b", {}),
    (("--enable-mixed-chunk",), "enable_mixed_chunk", "b", {}),
    (("--enable-two-batch-overlap",), "enable_two_batch_overlap", "b", {}),
    (("--disable-custom-all-reduce",), "disable_custom_all_reduce", "b", {}),
    (("--enable-mscclpp",), "enable_mscclpp", "b", {}),
    (("--disable-shared-experts-fusion",), "disable_shared_experts_fusion", "b", {}),
    (("--disable-chunked-prefix-cache",), "disable_chunked_prefix_cache", "b", {}),
    (("--enable-deterministic-inference",), "enable_deterministic_inference", "b", {}),
    (("--enable-nan-detection",), "enable_nan_detection", "b", {}),
    (("--enable-p2p-check",), "enable_p2p_check", "b", {}),
    (("--enable-memory-saver",), "enable_memory_saver", "b", {}),
    (("--delete-ckpt-after-loading",), "delete_ckpt_after_loading", "b", {}),
    (("--enable-lora",), "enable_lora", "b", {}),
    (("--lora-paths",), "lora_paths", "n", {}),
    (("--max-loras-per-batch",), "max_loras_per_batch", "i", {}),
    (("--config",), "config", "v", {}),
]

VLLM_FLAGS = [
    # frontend
    (("--host",), "host", "v", {}),
    (("--port",), "port", "i", {"default": 8000}),
    (("--uds",), "uds", "v", {}),
    (("--uvicorn-log-level",), "uvicorn_log_level", "v", {}),
    (("--disable-uvicorn-access-log",), "disable_uvicorn_access_log", "b", {}),
    (("--api-key",), "api_key", "n", {}),
    (("--served-model-name",), "served_model_name", "n", {}),
    (("--chat-template",), "chat_template", "v", {}),
    (("--chat-template-content-format",), "chat_template_content_format", "v", {}),
    (("--response-role",), "response_role", "v", {}),
    (("--ssl-keyfile",), "ssl_keyfile", "v", {}),
    (("--ssl-certfile",), "ssl_certfile", "v", {}),
    (("--root-path",), "root_path", "v", {}),
    (("--middleware",), "middleware", "v", {}),
    (("--enable-auto-tool-choice",), "enable_auto_tool_choice", "b", {}),
    (("--tool-call-parser",), "tool_call_parser", "v", {}),
    (("--tool-parser-plugin",), "tool_parser_plugin", "v", {}),
    (("--tool-server",), "tool_server", "v", {}),
    (("--reasoning-parser",), "reasoning_parser", "v", {}),
    (("--max-log-len",), "max_log_len", "i", {}),
    (("--disable-fastapi-docs",), "disable_fastapi_docs", "b", {}),
    (("--enable-prompt-tokens-details",), "enable_prompt_tokens_details", "b", {}),
    (("--enable-server-load-tracking",), "enable_server_load_tracking", "b", {}),
    (("--enable-force-include-usage",), "enable_force_include_usage", "b", {}),
    (("--enable-request-id-headers",), "enable_request_id_headers", "b", {}),
    (("--enable-log-outputs",), "enable_log_outputs", "b", {}),
    (("--enable-log-requests",), "enable_log_requests", "b", {}),
    (("--disable-log-requests",), "disable_log_requests", "b", {}),
    (("--disable-log-stats",), "disable_log_stats", "b", {}),
    (("--disable-frontend-multiprocessing",), "disable_frontend_multiprocessing", "b", {}),
    (("--enable-tokenizer-info-endpoint",), "enable_tokenizer_info_endpoint", "b", {}),
    (("--return-tokens-as-token-ids",), "return_tokens_as_token_ids", "b", {}),
    (("--headless",), "headless", "b", {}),
    (("--api-server-count", "-asc"), "api_server_count", "i", {}),
    (("--config",), "config", "v", {}),
    # model
    (("--model",), "model", "v", {}),
    (("--tokenizer",), "tokenizer", "v", {}),
    (("--tokenizer-mode",), "tokenizer_mode", "v", {}),
    (("--trust-remote-code",), "trust_remote_code", "b", {}),
    (("--dtype",), "dtype", "v", {}),
    (("--seed",), "seed", "i", {}),
    (("--revision",), "revision", "v", {}),
    (("--max-model-len",), "max_model_len", "h", {}),
    (("--quantization", "-q"), "quantization", "v", {}),
    (("--enforce-eager",), "enforce_eager", "b", {}),
    (("--max-logprobs",), "max_logprobs", "i", {}),
    (("--logprobs-mode",), "logprobs_mode", "v", {}),
    (("--generation-config",), "generation_config", "v", {}),
    (("--override-generation-config",), "override_generation_config", "v", {}),
    (("--hf-overrides",), "hf_overrides", "v", {}),
    (("--hf-config-path",), "hf_config_path", "v", {}),
    (("--skip-tokenizer-init",), "skip_tokenizer_init", "b", {}),
    (("--enable-prompt-embeds",), "enable_prompt_embeds", "b", {}),
    (("--limit-mm-per-prompt",), "limit_mm_per_prompt", "v", {}),
    (("--mm-processor-kwargs",), "mm_processor_kwargs", "v", {}),
    (("--allowed-local-media-path",), "allowed_local_media_path", "v", {}),
    # load
    (("--load-format",), "load_format", "v", {}),
    (("--download-dir",), "download_dir", "v", {}),
    (("--model-loader-extra-config",), "model_loader_extra_config", "v", {}),
    # attention and compilation
    (("--attention-backend",), "attention_backend", "v", {}),
    (("--compilation-config", "-O"), "compilation_config", "v", {}),
    (("--cuda-graph-sizes",), "cuda_graph_sizes", "n", {}),
    (("--async-scheduling",), "async_scheduling", "b", {}),
    # parallel
    # no argparse choices in the real one either: vllm_refusal checks the name after parsing
    (("--distributed-executor-backend",), "distributed_executor_backend", "v", {}),
    (("--tensor-parallel-size", "-tp"), "tensor_parallel_size", "i", {"default": 1}),
    (("--pipeline-parallel-size", "-pp"), "pipeline_parallel_size", "i", {"default": 1}),
    (("--decode-context-parallel-size", "-dcp"), "decode_context_parallel_size", "i", {}),
    (("--data-parallel-size", "-dp"), "data_parallel_size", "i", {"default": 1}),
    (("--data-parallel-rank", "-dpn"), "data_parallel_rank", "i", {}),
    (("--data-parallel-start-rank", "-dpr"), "data_parallel_start_rank", "i", {}),
    (("--data-parallel-size-local", "-dpl"), "data_parallel_size_local", "i", {}),
    (("--data-parallel-address", "-dpa"), "data_parallel_address", "v", {}),
    (("--data-parallel-rpc-port", "-dpp"), "data_parallel_rpc_port", "i", {}),
    (("--data-parallel-backend", "-dpb"), "data_parallel_backend", "v", {"choices": ("mp", "ray")}),
    (("--data-parallel-hybrid-lb",), "data_parallel_hybrid_lb", "b", {}),
    (("--data-parallel-external-lb",), "data_parallel_external_lb", "b", {}),
    (("--nnodes",), "nnodes", "i", {"default": 1}),
    (("--node-rank",), "node_rank", "i", {}),
    (("--master-addr",), "master_addr", "v", {}),
    (("--master-port",), "master_port", "i", {}),
    (("--enable-expert-parallel", "-ep"), "enable_expert_parallel", "b", {}),
    (("--enable-eplb",), "enable_eplb", "b", {}),
    (("--eplb-config",), "eplb_config", "v", {}),
    (("--all2all-backend",), "all2all_backend", "v", {}),
    (("--disable-custom-all-reduce",), "disable_custom_all_reduce", "b", {}),
    (("--worker-cls",), "worker_cls", "v", {}),
    (("--ray-workers-use-nsight",), "ray_workers_use_nsight", "b", {}),
    # cache
    (("--block-size",), "block_size", "i", {}),
    (("--gpu-memory-utilization",), "gpu_memory_utilization", "f", {}),
    (("--kv-cache-memory-bytes",), "kv_cache_memory_bytes", "v", {}),
    (("--swap-space",), "swap_space", "f", {}),
    (("--kv-cache-dtype",), "kv_cache_dtype", "v",
     {"choices": ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla")}),
    (("--calculate-kv-scales",), "calculate_kv_scales", "b", {}),
    (("--enable-prefix-caching",), "enable_prefix_caching", "b", {}),
    (("--prefix-caching-hash-algo",), "prefix_caching_hash_algo", "v", {}),
    (("--cpu-offload-gb",), "cpu_offload_gb", "f", {}),
    (("--mamba-ssm-cache-dtype",), "mamba_ssm_cache_dtype", "v", {}),
    (("--kv-transfer-config",), "kv_transfer_config", "v", {}),
    # scheduler
    (("--max-num-seqs",), "max_num_seqs", "i", {}),
    (("--max-num-batched-tokens",), "max_num_batched_tokens", "h", {}),
    (("--max-num-partial-prefills",), "max_num_partial_prefills", "i", {}),
    (("--long-prefill-token-threshold",), "long_prefill_token_threshold", "i", {}),
    (("--enable-chunked-prefill",), "enable_chunked_prefill", "b", {}),
    (("--scheduling-policy",), "scheduling_policy", "v", {}),
    (("--disable-cascade-attn",), "disable_cascade_attn", "b", {}),
    # speculative, lora, structured outputs, observability
    (("--speculative-config",), "speculative_config", "v", {}),
    (("--enable-lora",), "enable_lora", "b", {}),
    (("--lora-modules",), "lora_modules", "n", {}),
    (("--max-loras",), "max_loras", "i", {}),
    (("--max-lora-rank",), "max_lora_rank", "i", {}),
    (("--structured-outputs-config",), "structured_outputs_config", "v", {}),
    (("--otlp-traces-endpoint",), "otlp_traces_endpoint", "v", {}),
    (("--enable-sleep-mode",), "enable_sleep_mode", "b", {}),
]


def build_parser(engine: str) -> argparse.ArgumentParser:
    if engine == "sglang":
        parser = argparse.ArgumentParser(prog="launch_server.py", allow_abbrev=True)
        flags = SGLANG_FLAGS
    else:
        parser = argparse.ArgumentParser(prog="vllm serve", allow_abbrev=False, usage="vllm serve [model_tag] [options]",
                                         description="Launch a local OpenAI-compatible API server to serve LLM "
                                                     "completions via HTTP. (envlayers test stand-in)")
        parser.add_argument("model_tag", nargs="?", help="The model tag to serve")
        flags = VLLM_FLAGS
    for names, dest, kind, extra in flags:
        kw = {"dest": dest}
        if "choices" in extra:
            kw["choices"] = extra["choices"]
        if "default" in extra:
            kw["default"] = extra["default"]
        if extra.get("required"):
            kw["required"] = True
        if kind == "b":
            if engine == "vllm":
                kw["action"] = argparse.BooleanOptionalAction
                kw.setdefault("default", None)
            else:
                kw["action"] = "store_true"
        elif kind == "n":
            kw["nargs"] = "+"
        elif kind == "i":
            kw["type"] = int
        elif kind == "f":
            kw["type"] = float
        elif kind == "h":
            kw["type"] = human_int
        parser.add_argument(*names, **kw)
    return parser


# The names vLLM checks after parsing (tool call and reasoning parsers, executor backends), from the table
# scripts/gen-vllm-choices.py writes from the real engine's parser into the package. A copy of tests/standin
# alone (the podman tests' image) has no table beside it: there every parser name is taken.
VLLM_CHOICES_TABLE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__)))),
                                  "src", "envlayers", "data", "vllm-choices.json")
VLLM_EXECUTOR_BACKENDS = ("external_launcher", "mp", "ray", "uni")


def vllm_choices() -> dict:
    try:
        with open(VLLM_CHOICES_TABLE, encoding="utf-8") as f:
            return json.load(f)["choices"]
    except (OSError, ValueError, KeyError):
        return {}


def vllm_refusal(ns: argparse.Namespace, choices: dict | None = None) -> str | None:
    """How the real vLLM ends, after parsing and before it reads the model, on arguments its parser took: the
    last line(s) of its traceback (it exits 1), or None. In its order: ``validate_parsed_serve_args``, the
    serve command's headless check, ``validate_api_server_args`` (API ranks), then the engine config's lookups
    (the reasoning parser's registry; the executor backend's name, or else a dotted path to an Executor
    class, which the stand-in cannot import and takes)."""
    choices = vllm_choices() if choices is None else choices
    if ns.enable_auto_tool_choice and not ns.tool_call_parser:
        return "TypeError: Error: --enable-auto-tool-choice requires --tool-call-parser"
    if ns.headless and ns.api_server_count not in (None, 0):
        return (f"ValueError: --api-server-count={ns.api_server_count} cannot be used with --headless (no API "
                "servers are started in headless mode).")
    tools = choices.get("--tool-call-parser")
    if not ns.headless and ns.enable_auto_tool_choice and tools and ns.tool_call_parser not in tools:
        return f"KeyError: 'invalid tool call parser: {ns.tool_call_parser} (chose from {{ {','.join(tools)} }})'"
    reasoning = choices.get("--reasoning-parser")
    if ns.reasoning_parser and reasoning and ns.reasoning_parser not in reasoning:
        return (f"KeyError: \"Reasoning parser '{ns.reasoning_parser}' not found. Available parsers: "
                f"{', '.join(reasoning)}\"")
    backend = ns.distributed_executor_backend
    if backend and backend not in choices.get("--distributed-executor-backend", VLLM_EXECUTOR_BACKENDS) \
            and "." not in backend:
        return ("pydantic_core._pydantic_core.ValidationError: 1 validation error for VllmConfig\n"
                "  Value error, not enough values to unpack (expected 2, got 1) [type=value_error, "
                "input_value=ArgsKwargs(...), input_type=ArgsKwargs]")
    return None


def vllm_verdict(argv: list[str]) -> str | None:
    """None when the stand-in's ``vllm`` would start on ``argv`` (the words after ``vllm``), else why not: the
    argparse error line (exit 2) or ``vllm_refusal`` (exit 1). Starts nothing."""
    if argv[:1] != ["serve"]:
        return f"vllm: error: the envlayers stand-in implements only 'serve', not {argv[:1]!r}"
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            ns = build_parser("vllm").parse_args(normalize_vllm_args(argv[1:]))
    except SystemExit as exc:
        return None if exc.code in (0, None) else (err.getvalue().strip().splitlines() or ["(no message)"])[-1]
    return vllm_refusal(ns)


def human_int(value: str):
    """vLLM's human-readable integers: 32768, 32k, 1m, 25.6k (decimal k/m), 32K, 1M (binary K/M), -1, auto."""
    text = value.strip()
    if text in ("auto", "-1"):
        return text if text == "auto" else -1
    mult = {"k": 1000, "m": 1000 ** 2, "g": 1000 ** 3, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}.get(text[-1:], 1)
    number = text[:-1] if mult != 1 else text
    try:
        out = float(number) * mult
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid human-readable integer: {value!r}") from None
    if not out.is_integer():
        raise argparse.ArgumentTypeError(f"not an integer: {value!r}")
    return int(out)


def normalize_vllm_args(argv: list[str]) -> list[str]:
    """vLLM's FlexibleArgumentParser accepts ``--snake_case`` for ``--kebab-case``."""
    out = []
    for arg in argv:
        if arg.startswith("--") and len(arg) > 2:
            key, sep, value = arg.partition("=")
            out.append("--" + key[2:].replace("_", "-") + sep + value)
        else:
            out.append(arg)
    return out


# ----------------------------------------------------------------------------------------------
# Knobs
# ----------------------------------------------------------------------------------------------

def _phase(name: str, value: str | None) -> str | None:
    if value is None or value.strip() == "":
        return None
    key = value.strip().lower()
    key = PHASE_ALIASES.get(key, key)
    if key not in PHASES:
        raise KnobError(f"{name}={value!r}: unknown phase; expected one of {', '.join(PHASES)}")
    return key


def _number(name: str, value: str | None, default, kind=float):
    if value is None or value.strip() == "":
        return default
    try:
        out = kind(value)
    except ValueError:
        raise KnobError(f"{name}={value!r}: not a number") from None
    if out < 0:
        raise KnobError(f"{name}={value!r}: must not be negative")
    return out


class StreamPace:
    """How a streamed reply is paced (``env_layers bench`` checks its numbers against these):
    ``STANDIN_TTFT_S`` before the first token, then ``STANDIN_TOKENS_PER_S`` tokens a second, each
    request on its own (a request's pace does not depend on how many others run)."""

    def __init__(self, env):
        self.ttft_s = _number("STANDIN_TTFT_S", env.get("STANDIN_TTFT_S"), 0.0)
        rate = _number("STANDIN_TOKENS_PER_S", env.get("STANDIN_TOKENS_PER_S"), None)
        if rate == 0:
            raise KnobError("STANDIN_TOKENS_PER_S=0: must be positive (unset it for no pacing)")
        self.gap_s = 1.0 / rate if rate else 0.0

    def pad(self, words: list[str], req: dict, limit) -> list[str]:
        """``ignore_eos: true`` with a limit: the real engines generate exactly max_tokens."""
        if req.get("ignore_eos") is True and isinstance(limit, int) and len(words) < limit:
            filler = words or ["token"]
            words = [filler[i % len(filler)] for i in range(limit + 1)]  # cut to the limit: "length"
        return words

    def first_token(self) -> None:
        """Before a streamed reply's first chunk (role, reasoning or content): the time to first token."""
        if self.ttft_s:
            time.sleep(self.ttft_s)

    def paced(self, words: list[str]):
        """Yield (index, word) at the configured pace, the first at once (after ``first_token``)."""
        start = time.monotonic()
        for i, word in enumerate(words):
            if i and self.gap_s:
                delay = start + i * self.gap_s - time.monotonic()  # no drift over a long reply
                if delay > 0:
                    time.sleep(delay)
            yield i, word


class Knobs:
    def __init__(self, env):
        self.load_s = _number("STANDIN_LOAD_SECONDS", env.get("STANDIN_LOAD_SECONDS"), 1.0)
        self.max_running = _number("STANDIN_MAX_RUNNING", env.get("STANDIN_MAX_RUNNING"), None, int)
        if self.max_running == 0:
            raise KnobError("STANDIN_MAX_RUNNING=0: must be positive (unset it for no cap)")
        self.request_s = _number("STANDIN_REQUEST_S", env.get("STANDIN_REQUEST_S"), 0.0)
        self.crash_at = _phase("STANDIN_CRASH_AT", env.get("STANDIN_CRASH_AT"))
        self.hang_at = _phase("STANDIN_HANG_AT", env.get("STANDIN_HANG_AT"))
        self.inject_at = _phase("STANDIN_INJECT_AT", env.get("STANDIN_INJECT_AT"))
        self.exit_code = _number("STANDIN_EXIT_CODE", env.get("STANDIN_EXIT_CODE"), 1, int)
        self.crash_message = env.get("STANDIN_CRASH_MESSAGE") or None
        sig = (env.get("STANDIN_CRASH_SIGNAL") or "").strip().upper()
        self.crash_signal = None
        if sig:
            name = sig if sig.startswith("SIG") else "SIG" + sig
            if sig.isdigit():
                self.crash_signal = int(sig)
            elif hasattr(signal, name):
                self.crash_signal = int(getattr(signal, name))
            else:
                raise KnobError(f"STANDIN_CRASH_SIGNAL={sig!r}: unknown signal")
        self.crash_after_ready_s = _number("STANDIN_CRASH_AFTER_READY_SECONDS",
                                           env.get("STANDIN_CRASH_AFTER_READY_SECONDS"), None)
        self.core_dies_after_ready_s = _number("STANDIN_CORE_DIES_AFTER_READY_SECONDS",
                                               env.get("STANDIN_CORE_DIES_AFTER_READY_SECONDS"), None)
        self.core_death_exit_s = _number("STANDIN_CORE_DEATH_EXIT_SECONDS",
                                         env.get("STANDIN_CORE_DEATH_EXIT_SECONDS"), 4.0)
        ranks = (env.get("STANDIN_RANKS") or "").strip()
        self.ranks = None
        if ranks and ranks.lower() != "all":
            try:
                self.ranks = {int(r) for r in ranks.split(",") if r.strip()}
            except ValueError:
                raise KnobError(f"STANDIN_RANKS={ranks!r}: expected a comma list of ranks") from None
        self.record = env.get("STANDIN_RECORD") or None
        hybrid = env.get("STANDIN_HYBRID")
        self.hybrid = None if hybrid in (None, "") else hybrid.strip().lower() not in ("0", "false", "no")
        self.kv_tokens = _number("STANDIN_KV_TOKENS", env.get("STANDIN_KV_TOKENS"), None, int)
        self.avail_mem_gb = _number("STANDIN_AVAIL_MEM_GB", env.get("STANDIN_AVAIL_MEM_GB"), 120.0)
        self.nccl_network = env.get("STANDIN_NCCL_NETWORK") or None
        nets = env.get("STANDIN_NCCL_NETWORKS")
        self.nccl_networks = None if nets is None else {n.strip().lower() for n in nets.split(",") if n.strip()}
        self.dummy_health = (env.get("STANDIN_SGLANG_DUMMY_HEALTH") or "0").strip().lower() in ("1", "true", "yes")
        self.print_args = (env.get("STANDIN_PRINT_ARGS") or "1").strip().lower() not in ("0", "false", "no")
        self.reply = env.get("STANDIN_REPLY")
        flavour = (env.get("STANDIN_VLLM_LOG") or "0.28").strip().lower()
        if flavour not in VLLM_LOGS:
            raise KnobError(f"STANDIN_VLLM_LOG={flavour!r}: expected one of {', '.join(VLLM_LOGS)}")
        self.vllm_log = flavour
        self.cpu_kv_gib = _number("VLLM_CPU_KVCACHE_SPACE", env.get("VLLM_CPU_KVCACHE_SPACE"), None)
        stream = (env.get("STANDIN_LOG_STREAM") or "").strip().lower()
        if stream not in ("", "stdout", "stderr"):
            raise KnobError(f"STANDIN_LOG_STREAM={stream!r}: expected stdout or stderr")
        self.log_stream = stream or None
        self.pace = StreamPace(env)
        inject = env.get("STANDIN_INJECT") or ""
        if inject.startswith("@"):
            try:
                with open(inject[1:], encoding="utf-8") as fh:
                    inject = fh.read()
            except OSError as exc:
                raise KnobError(f"STANDIN_INJECT: cannot read {inject[1:]}: {exc}") from None
        self.inject_lines = inject.replace("\\n", "\n").splitlines() if inject else []
        if self.inject_at and not self.inject_lines:
            raise KnobError("STANDIN_INJECT_AT is set but STANDIN_INJECT is empty")

    def applies(self, rank: int) -> bool:
        return self.ranks is None or rank in self.ranks


# ----------------------------------------------------------------------------------------------
# Output
# ----------------------------------------------------------------------------------------------

class Log:
    """Line writer with the engine's prefixes; every line is flushed at once."""

    def __init__(self, engine: str, stream_name: str | None):
        self.engine = engine
        default = "stderr" if engine == "sglang" else "stdout"
        self.stream = sys.stderr if (stream_name or default) == "stderr" else sys.stdout
        self.lock = threading.RLock()
        self.pid = os.getpid()
        self.bare_uvicorn = False  # vLLM 0.32: uvicorn's own lines carry no "(APIServer pid=N)" prefix

    def raw(self, text: str, stream=None) -> None:
        out = stream or self.stream
        with self.lock:
            try:
                out.write(text if text.endswith("\n") else text + "\n")
                out.flush()
            except (OSError, ValueError):
                pass

    # SGLang: "[2026-02-26 05:20:21 TP0] message"
    def sg(self, message: str, label: str = "") -> None:
        ts = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
        self.raw(f"[{ts}{label}] {message}")

    # vLLM: "(EngineCore_DP0 pid=165) INFO 03-18 06:55:49 [default_loader.py:308] message"
    def vl(self, proc: str, where: str, message: str, level: str = "INFO", pid: int | None = None,
           stream=None) -> None:
        ts = time.strftime("%m-%d %H:%M:%S", time.localtime())
        self.raw(f"({proc} pid={pid or self.pid}) {level} {ts} [{where}] {message}", stream)

    def access(self, client: str, method: str, path: str, status: int) -> None:
        reason = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
                  405: "Method Not Allowed", 503: "Service Unavailable"}.get(status, "")
        line = f'INFO:     {client} - "{method} {path} HTTP/1.1" {status} {reason}'.rstrip()
        if self.engine == "sglang":
            self.sg(line)
        else:
            self.uvicorn(line)

    def uvicorn(self, line: str, stream=None) -> None:
        """A line of vLLM's uvicorn: prefixed with the API server's process in 0.28, bare in 0.32."""
        self.raw(line if self.bare_uvicorn else f"(APIServer pid={self.pid}) {line}", stream)


# ----------------------------------------------------------------------------------------------
# Configuration derived from the parsed command line
# ----------------------------------------------------------------------------------------------

HYBRID_RE = re.compile(r"qwen3[._-]?[5-9]|qwen3-?next|[-_/]next\b|mamba|nemotron-?h|jamba|falcon-?h|granite-?4",
                       re.IGNORECASE)


def architecture(model: str, hybrid: bool) -> str:
    m = model.lower()
    if "kimi" in m or "deepseek" in m:
        return "DeepseekV3ForCausalLM"
    if "glm" in m:
        return "Glm4MoeForCausalLM"
    if "gpt-oss" in m or "gpt_oss" in m:
        return "GptOssForCausalLM"
    if "qwen" in m:
        return "Qwen3NextForCausalLM" if hybrid else "Qwen3ForCausalLM"
    if "mistral" in m:
        return "MistralForCausalLM"
    return "LlamaForCausalLM"


class Config:
    def __init__(self, engine: str, ns: argparse.Namespace, given: list[str], knobs: Knobs, env):
        self.engine = engine
        self.ns = ns
        self.given = given
        if engine == "sglang":
            self.model = ns.model_path
            self.served = [ns.served_model_name or ns.model_path]
            self.host = ns.host
            self.port = ns.port
            self.tp, self.pp, self.dp = ns.tp_size, ns.pp_size, ns.dp_size
            self.nnodes = ns.nnodes
            self.node_rank = ns.node_rank
            self.serves_api = ns.node_rank == 0
            self.api_keys = [ns.api_key] if ns.api_key else []
            self.max_len = ns.context_length or 32768
            self.tool_parser = ns.tool_call_parser
            self.auto_tool_choice = bool(ns.tool_call_parser)
            self.metrics = bool(ns.enable_metrics)
            self.graphs = not ns.disable_cuda_graph
            explicit_rank = "node_rank" in given
        else:
            self.model = ns.model_tag or ns.model or "Qwen/Qwen3-0.6B"
            self.served = list(ns.served_model_name or [self.model])
            self.host = ns.host
            self.port = ns.port
            self.tp, self.pp, self.dp = ns.tensor_parallel_size, ns.pipeline_parallel_size, ns.data_parallel_size
            self.nnodes = ns.nnodes
            self.node_rank = ns.node_rank or 0
            self.serves_api = not ns.headless
            keys = list(ns.api_key or [])
            if not keys and env.get("VLLM_API_KEY"):
                keys = [env["VLLM_API_KEY"]]
            self.api_keys = keys
            self.max_len = ns.max_model_len if isinstance(ns.max_model_len, int) and ns.max_model_len > 0 else 32768
            self.tool_parser = ns.tool_call_parser
            self.auto_tool_choice = bool(ns.enable_auto_tool_choice)
            self.metrics = True
            self.graphs = not ns.enforce_eager
            explicit_rank = ns.node_rank is not None
        self.reasoning_parser = ns.reasoning_parser
        if explicit_rank:
            self.rank = self.node_rank
        elif engine == "vllm" and ns.data_parallel_start_rank is not None:
            self.rank = ns.data_parallel_start_rank // max(1, ns.data_parallel_size_local or 1)
        else:
            try:
                self.rank = int(env.get("SLURM_PROCID", "0"))
            except ValueError:
                self.rank = 0
        self.hybrid = knobs.hybrid if knobs.hybrid is not None else bool(HYBRID_RE.search(self.model))
        self.arch = architecture(self.model, self.hybrid)
        self.world = max(1, self.tp * self.pp * (self.dp if engine == "vllm" else 1))
        self.local_gpus = max(1, self.world // max(1, self.nnodes))
        self.avail_gb = knobs.avail_mem_gb
        self.weights_gb = round(min(80.0, 3.0 + 120.0 / max(1, self.tp * self.pp)), 2)
        if engine == "sglang":
            frac = ns.mem_fraction_static or 0.85
        else:
            frac = ns.gpu_memory_utilization or 0.9
        self.kv_gb = round(max(1.0, self.avail_gb * frac - self.weights_gb - 4.0), 2)
        self.kv_tokens = knobs.kv_tokens or int(self.kv_gb * 1e9 / 69632)
        self.max_running = getattr(ns, "max_running_requests", None) or getattr(ns, "max_num_seqs", None) or \
            min(4096, max(16, self.kv_tokens // 4096))

    def local_ranks(self):
        """(pp_rank, tp_rank) of each GPU of this node, at most 8."""
        start = (self.node_rank if self.nnodes > 1 else 0) * self.local_gpus
        out = []
        for g in range(start, start + min(self.local_gpus, 8)):
            out.append(((g // max(1, self.tp)) % max(1, self.pp), g % max(1, self.tp)))
        return out

    def nccl_line(self, knobs: "Knobs", env) -> str | None:
        """NCCL's own line, printed by every multi-GPU engine when NCCL_DEBUG=INFO (RCCL says the same)."""
        if (env.get("NCCL_DEBUG") or "").upper() not in ("INFO", "TRACE") or self.world <= 1:
            return None
        name = knobs.nccl_network
        if not name:
            forced = (env.get("NCCL_NET") or "").strip()
            canonical = {"socket": "Socket", "ib": "IB", "aws libfabric": "AWS Libfabric", "ofi": "AWS Libfabric"}
            name = canonical.get(forced.lower(), forced) if forced else "Socket"
        host = socket.gethostname().split(".")[0]
        return f"{host}:{os.getpid()}:{os.getpid() + 61} [0] NCCL INFO Using network {name}"

    def missing_network(self, knobs: "Knobs", env) -> str | None:
        """NCCL_NET when it names a network this machine lacks (STANDIN_NCCL_NETWORKS), else None."""
        forced = (env.get("NCCL_NET") or "").strip()
        if knobs.nccl_networks is None or not forced or self.world <= 1:
            return None
        return None if forced.lower() in knobs.nccl_networks else forced

    def display_host(self) -> str:
        host = self.host if self.host not in (None, "") else "0.0.0.0"
        return f"[{host}]" if ":" in host else host


# ----------------------------------------------------------------------------------------------
# Startup scripts: the lines of each phase, and what happens between them
# ----------------------------------------------------------------------------------------------

class SGLangScript:
    def __init__(self, cfg: Config, log: Log, knobs: Knobs):
        self.cfg, self.log, self.knobs = cfg, log, knobs
        self.t0 = time.time()

    def label(self, pp: int, tp: int) -> str:
        c = self.cfg
        out = ""
        if c.dp > 1:
            out += " DP0"
        if c.pp > 1:
            out += f" PP{pp}"
        if c.tp > 1:
            out += f" TP{tp}"
        return out

    def each(self, message_fn):
        for pp, tp in self.cfg.local_ranks():
            self.log.sg(message_fn(pp, tp), self.label(pp, tp))

    def first(self, message: str):
        pp, tp = self.cfg.local_ranks()[0]
        self.log.sg(message, self.label(pp, tp))

    def begin(self, phase: str) -> None:
        c, log = self.cfg, self.log
        if phase == "start":
            if self.knobs.print_args:
                ns = c.ns
                fields = ["model_path", "tokenizer_path", "host", "port", "served_model_name", "api_key",
                          "tp_size", "pp_size", "dp_size", "nnodes", "node_rank", "dist_init_addr",
                          "mem_fraction_static", "context_length", "attention_backend", "kv_cache_dtype",
                          "reasoning_parser", "tool_call_parser", "enable_metrics", "trust_remote_code"]
                vals = {f: getattr(ns, f) for f in fields}
                if vals["tokenizer_path"] is None:
                    vals["tokenizer_path"] = ns.model_path
                if vals["served_model_name"] is None:
                    vals["served_model_name"] = ns.model_path
                for dest in c.given:
                    if dest not in vals:
                        vals[dest] = getattr(ns, dest)
                body = ", ".join(f"{k}={v!r}" for k, v in vals.items())
                log.sg(f"server_args=ServerArgs({body})")
        elif phase == "init":
            self.first("Init torch distributed begin.")
            line = c.nccl_line(self.knobs, os.environ)
            if line:
                log.raw(line)
        elif phase == "weights":
            self.each(lambda pp, tp: f"Load weight begin. avail mem={c.avail_gb - 3.8:.2f} GB")
        elif phase == "kv":
            if c.hybrid:
                slots = getattr(c.ns, "max_mamba_cache_size", None) or c.ns.max_running_requests or 64
                self.first(f"Mamba Cache is allocated. max_mamba_cache_size: {slots}, conv_state size: "
                           f"{slots * 0.0008:.2f}GB, ssm_state size: {slots * 0.072:.2f}GB")
            self.each(lambda pp, tp: f"KV Cache is allocated. #tokens: {c.kv_tokens}, K size: {c.kv_gb / 2:.2f} GB, "
                                     f"V size: {c.kv_gb / 2:.2f} GB")
            self.each(lambda pp, tp: f"Memory pool end. avail mem={c.avail_gb - c.weights_gb - c.kv_gb - 3.8:.2f} GB")
        elif phase == "graphs":
            if c.graphs:
                free = c.avail_gb - c.weights_gb - c.kv_gb - 4.0
                self.each(lambda pp, tp: f"Capture cuda graph begin. This can take up to several minutes. "
                                         f"avail mem={free:.2f} GB")
                bs = [1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64][: 4 + min(8, c.max_running // 16)]
                self.first(f"Capture cuda graph bs {bs}")
        elif phase == "listen" and c.serves_api:
            log.sg(f"INFO:     Started server process [{log.pid}]")
            log.sg("INFO:     Waiting for application startup.")
            log.sg("INFO:     Application startup complete.")
            log.sg(f"INFO:     Uvicorn running on http://{c.display_host()}:{c.port} (Press CTRL+C to quit)")

    def end(self, phase: str, elapsed: float) -> None:
        c, log = self.cfg, self.log
        if phase == "init":
            self.first(f"Init torch distributed ends. elapsed={elapsed:.2f} s, mem usage=0.38 GB")
        elif phase == "weights":
            self.each(lambda pp, tp: f"Load weight end. elapsed={elapsed:.2f} s, type={c.arch}, "
                                     f"dtype=torch.bfloat16, avail mem={c.avail_gb - 3.8 - c.weights_gb:.2f} GB, "
                                     f"mem usage={c.weights_gb:.2f} GB.")
        elif phase == "graphs":
            free = c.avail_gb - c.weights_gb - c.kv_gb - 4.0
            if c.graphs:
                self.each(lambda pp, tp: f"Capture cuda graph end. Time elapsed: {elapsed:.2f} s. mem usage=0.42 GB. "
                                         f"avail mem={free - 0.42:.2f} GB.")
            self.first(f"max_total_num_tokens={c.kv_tokens}, chunked_prefill_size=8192, max_prefill_tokens=16384, "
                       f"max_running_requests={c.max_running}, context_len={c.max_len}, "
                       f"available_gpu_mem={free - 0.42:.2f} GB")
        elif phase == "listen" and c.serves_api:
            log.access("127.0.0.1:41234", "GET", "/model_info", 200)
            log.sg("Prefill batch, #new-seq: 1, #new-token: 6, #cached-token: 0, token usage: 0.00, "
                   "#running-req: 0, #queue-req: 0")
            log.access("127.0.0.1:41236", "POST", "/generate", 200)

    def ready_line(self) -> None:
        self.log.sg("The server is fired up and ready to roll!")

    def crash(self, phase: str, message: str) -> None:
        c, log = self.cfg, self.log
        frames = {
            "start": [("sglang/srt/server_args.py", 5165, "from_cli_args",
                       "return cls(**{attr: getattr(args, attr) for attr in attrs})")],
            "init": [("sglang/srt/model_executor/model_runner.py", 688, "init_torch_distributed",
                      "initialize_model_parallel(")],
            "weights": [("sglang/srt/model_executor/model_runner.py", 812, "load_model",
                         "self.model = get_model(")],
            "kv": [("sglang/srt/model_executor/model_runner.py", 1530, "init_memory_pool",
                    "self.token_to_kv_pool = MHATokenToKVPool(")],
            "graphs": [("sglang/srt/model_executor/cuda_graph_runner.py", 526, "capture",
                        "_capture_one_stream()")],
            "listen": [("sglang/srt/managers/scheduler.py", 1103, "event_loop_overlap",
                        "batch = self.get_next_batch_to_run()")],
            "ready": [("sglang/srt/managers/scheduler.py", 1103, "event_loop_overlap",
                       "result = self.run_batch(batch)")],
        }[phase]
        pp, tp = c.local_ranks()[0]
        log.sg("Scheduler hit an exception: Traceback (most recent call last):", self.label(pp, tp))
        base = "/sgl-workspace/sglang/python/"
        lines = [f'  File "{base}sglang/srt/managers/scheduler.py", line 3096, in run_scheduler_process',
                 "    scheduler = Scheduler(",
                 f'  File "{base}sglang/srt/managers/tp_worker.py", line 247, in __init__',
                 "    self._init_model_runner()"]
        for path, line, fn, code in frames:
            lines += [f'  File "{base}{path}", line {line}, in {fn}', f"    {code}"]
        lines.append(message)
        for line in lines:
            log.raw(line)
        log.raw("")
        log.sg("Received sigquit from a child process. It usually means the child failed.")


class VLLMScript:
    """vLLM's startup lines. ``STANDIN_VLLM_LOG`` picks whose: 0.28 on GPUs (default), 0.32 on GPUs, or 0.32's
    CPU build, whose lines differ where the real ones do (tests/test_standin_vs_real.py compares them with the
    real engine): 0.32 prints a banner instead of "vLLM API server version", "Starting vLLM server on" instead
    of "Starting vLLM API server 0 on", the KV cache size and the maximum concurrency on one line, uvicorn's
    lines bare, and names a lone engine core ``EngineCore`` and its worker ``Worker``; on CPUs it prints no
    "Model loading took" (the loader's "Loading weights took" ends the weight load), sizes the KV cache from
    VLLM_CPU_KVCACHE_SPACE ("Explicitly set (1.0/7.96) GiB for KV cache"), and captures no graphs."""

    def __init__(self, cfg: Config, log: Log, knobs: Knobs):
        self.cfg, self.log, self.knobs = cfg, log, knobs
        self.core_pid = log.pid + 57
        self.t_init = time.time()
        self.flavour = knobs.vllm_log
        self.version = VLLM_LOGS[self.flavour]
        self.new = self.flavour != "0.28"  # 0.32's formats
        self.cpu = self.flavour == "0.32-cpu"
        log.bare_uvicorn = self.new
        if self.cpu:
            self.cpu_kv_gib = knobs.cpu_kv_gib if knobs.cpu_kv_gib is not None else 4.0
            cfg.kv_tokens = knobs.kv_tokens or int(self.cpu_kv_gib * 2 ** 30 / 512)

    def worker(self, pp: int, tp: int) -> str:
        c = self.cfg
        if c.tp * c.pp == 1:
            return "Worker" if self.new else "EngineCore_DP0"
        if self.new and c.pp > 1 and c.tp == 1:
            return f"Worker_PP{pp}"  # 0.32 names only the dimensions it has
        return f"Worker_PP{pp}_TP{tp}" if c.pp > 1 else f"Worker_TP{tp}"

    def core(self) -> str:
        c = self.cfg
        if not c.serves_api and c.dp > 1 and c.ns.data_parallel_start_rank is not None:
            return f"EngineCore_DP{c.ns.data_parallel_start_rank}"
        return "EngineCore" if self.new and c.dp <= 1 else "EngineCore_DP0"

    def worker_pid(self, i: int) -> int:
        if self.cfg.tp * self.cfg.pp == 1:
            return self.core_pid + 10 if self.new else self.core_pid
        return self.core_pid + 10 + i

    def each(self, where: str, message_fn):
        for i, (pp, tp) in enumerate(self.cfg.local_ranks()):
            self.log.vl(self.worker(pp, tp), where, message_fn(pp, tp), pid=self.worker_pid(i))

    def core_line(self, where: str, message: str, level: str = "INFO", stream=None):
        self.log.vl(self.core(), where, message, level=level, pid=self.core_pid, stream=stream)

    def api(self, where: str, message: str, level: str = "INFO", stream=None):
        self.log.vl("APIServer", where, message, level=level, stream=stream)

    def begin(self, phase: str) -> None:
        c, log, ns = self.cfg, self.log, self.cfg.ns
        if phase == "start":
            if c.serves_api and self.new:
                for line in ("", "       \u2588     \u2588     \u2588\u2584   \u2584\u2588",
                             f" \u2584\u2584 \u2584\u2588 \u2588     \u2588     \u2588 \u2580\u2584\u2580 \u2588  version {self.version}",
                             f"  \u2588\u2584\u2588\u2580 \u2588     \u2588     \u2588     \u2588  model   {c.model}",
                             "   \u2580\u2580  \u2580\u2580\u2580\u2580\u2580 \u2580\u2580\u2580\u2580\u2580 \u2580     \u2580", ""):
                    self.api("api_utils.py:347", line)
            elif c.serves_api:
                self.api("api_server.py:1354", f"vLLM API server version {self.version}")
            elif ns.data_parallel_start_rank is not None and (c.nnodes <= 1 or c.node_rank == 0):
                log.raw(f"INFO {time.strftime('%m-%d %H:%M:%S')} [serve.py:243] Launching "
                        f"{ns.data_parallel_size_local or 1} data parallel engine(s) in headless mode, with head "
                        f"node address tcp://{ns.data_parallel_address or '127.0.0.1'}:"
                        f"{ns.data_parallel_rpc_port or 29550}.")
            else:
                log.raw(f"INFO {time.strftime('%m-%d %H:%M:%S')} [serve.py:225] Launching vLLM "
                        f"(v{self.version}) headless multiproc executor, with head node address "
                        f"{ns.master_addr or '127.0.0.1'}:{ns.master_port or 29501} for torch.distributed "
                        f"process group.")
            if self.knobs.print_args:
                args = {}
                if ns.model_tag:
                    args["model_tag"] = ns.model_tag
                for dest in c.given:
                    if dest != "model_tag":
                        args[dest] = getattr(ns, dest)
                if ns.model_tag and "model" not in args:
                    args["model"] = ns.model_tag
                self.api("api_utils.py:286" if self.new else "utils.py:253", f"non-default args: {args!r}")
            self.api("model.py:733" if self.new else "model.py:514", f"Resolved architecture: {c.arch}")
            self.api("model.py:2152" if self.new else "model.py:1661", f"Using max model len {c.max_len}")
            self.core_line("core.py:133" if self.new else "core.py:93",
                           f"Initializing a V1 LLM engine (v{self.version}) with config: "
                           f"model={c.model!r}, tokenizer={c.model!r}, trust_remote_code={bool(ns.trust_remote_code)}, "
                           f"dtype=torch.bfloat16, max_seq_len={c.max_len}, tensor_parallel_size={c.tp}, "
                           f"pipeline_parallel_size={c.pp}, data_parallel_size={c.dp}, "
                           f"kv_cache_dtype={ns.kv_cache_dtype or 'auto'}, enforce_eager={bool(ns.enforce_eager)}, "
                           f"served_model_name={','.join(c.served)}"
                           + (", device_config=cpu" if self.cpu else ""))
        elif phase == "init":
            addr = ns.master_addr or ns.data_parallel_address or "127.0.0.1"
            port = ns.master_port or 29501
            for i, (pp, tp) in enumerate(c.local_ranks()):
                grank = c.node_rank * c.local_gpus + i if c.nnodes > 1 else i
                log.vl(self.worker(pp, tp), "parallel_state.py:1906" if self.new else "parallel_state.py:1203",
                       f"world_size={c.tp * c.pp} rank={grank} local_rank={i} "
                       f"distributed_init_method=tcp://{addr}:{port} backend={'gloo' if self.cpu else 'nccl'}",
                       pid=self.worker_pid(i))
            line = c.nccl_line(self.knobs, os.environ)
            if line:
                log.raw(line)
        elif phase == "weights":
            where = "cpu_model_runner.py:68" if self.cpu else "gpu_model_runner.py:5040" if self.new else \
                "gpu_model_runner.py:3562"
            self.each(where, lambda pp, tp: f"Starting to load model {c.model}...")
        elif phase == "kv":
            if self.cpu:
                self.each("cpu_worker.py:260", lambda pp, tp: f"Explicitly set ({self.cpu_kv_gib:.1f}/7.96) GiB for KV "
                                                              f"cache on node 0." if self.knobs.cpu_kv_gib is not None
                          else f"Auto set ({self.cpu_kv_gib:.1f}/7.96) GiB for KV cache on node 0, with 4.00 GiB "
                               f"requested memory for the worker. 0.62 GiB memory was consumed by non-kv usages.")
            else:
                self.each("gpu_worker.py:760" if self.new else "gpu_worker.py:375",
                          lambda pp, tp: f"Available KV cache memory: {c.kv_gb:.2f} GiB")
        elif phase == "graphs":
            pass
        elif phase == "listen" and c.serves_api and self.new:
            self.api("entry.py:136", "Supported tasks: ['generate']")
            if c.auto_tool_choice:
                self.api("parser_manager.py:38", '"auto" tool choice has been enabled.')
            self.api("entry.py:140", f"Starting vLLM server on http://{c.display_host()}:{c.port}")
            self.api("launcher.py:186", "Available routes are:")
            for route, methods in (("/health", "GET"), ("/metrics", "GET"), ("/v1/models", "GET"), ("/ping", "GET"),
                                   ("/ping", "POST"), ("/v1/chat/completions", "POST"), ("/v1/completions", "POST")):
                self.api("launcher.py:195", f"Route: {route}, Methods: {methods}")
            log.uvicorn(f"INFO:     Started server process [{log.pid}]")
            log.uvicorn("INFO:     Waiting for application startup.")
        elif phase == "listen" and c.serves_api:
            self.api("api_server.py:1102", "Supported tasks: ['generate']")
            self.api("api_server.py:1428", f"Starting vLLM API server 0 on http://{c.display_host()}:{c.port}")
            self.api("launcher.py:38", "Available routes are:")
            for route, methods in (("/health", "GET"), ("/metrics", "GET"), ("/ping", "GET, POST"),
                                   ("/version", "GET"), ("/v1/models", "GET"),
                                   ("/v1/chat/completions", "POST"), ("/v1/completions", "POST")):
                self.api("launcher.py:46", f"Route: {route}, Methods: {methods}")
            log.uvicorn(f"INFO:     Started server process [{log.pid}]")
            log.uvicorn("INFO:     Waiting for application startup.")

    def end(self, phase: str, elapsed: float) -> None:
        c, log = self.cfg, self.log
        if phase == "weights":
            shards = max(1, int(c.weights_gb * c.tp * c.pp // 5) % 64)
            rate = shards / max(elapsed, 0.01)
            log.raw(f"Loading safetensors checkpoint shards: 100% Completed | {shards}/{shards} "
                    f"[00:{min(59, int(elapsed)):02d}<00:00, {rate:.2f}it/s]", sys.stderr)  # tqdm: stderr
            self.each("default_loader.py:501" if self.new else "default_loader.py:308",
                      lambda pp, tp: f"Loading weights took {elapsed:.2f} seconds")
            if not self.cpu:  # the CPU model runner has no such line
                self.each("gpu_model_runner.py:5150" if self.new else "gpu_model_runner.py:3659",
                          lambda pp, tp: f"Model loading took {c.weights_gb:.4f} GiB {'memory ' if self.new else ''}"
                                         f"and {elapsed + 0.4:.6f} seconds")
        elif phase == "kv" and self.new:
            self.core_line("kv_cache_utils.py:2327", f"{'CPU' if self.cpu else 'GPU'} KV cache size: {c.kv_tokens:,} "
                           f"tokens, Maximum concurrency for {c.max_len:,} tokens per request: "
                           f"{c.kv_tokens / c.max_len:.2f}x")
        elif phase == "kv":
            self.core_line("kv_cache_utils.py:1291", f"GPU KV cache size: {c.kv_tokens:,} tokens")
            self.core_line("kv_cache_utils.py:1296", f"Maximum concurrency for {c.max_len:,} tokens per request: "
                           f"{c.kv_tokens / c.max_len:.2f}x")
        elif phase == "graphs":
            if c.graphs and not self.cpu:
                bar = "\u2588" * 10  # tqdm's bar, as it writes it to a file
                log.raw(f"Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%|{bar}| 51/51 "
                        f"[00:{min(59, int(elapsed / 2)):02d}<00:00, 10.66it/s]", sys.stderr)
                if self.new:  # 0.28 on ROCm captures the piecewise graphs only (tests/data/logs/healthy-vllm)
                    log.raw(f"Capturing CUDA graphs (decode, FULL): 100%|{bar}| 35/35 "
                            f"[00:{min(59, int(elapsed / 2)):02d}<00:00, 13.21it/s]", sys.stderr)
                self.each("gpu_model_runner.py:4587", lambda pp, tp: f"Graph capturing finished in "
                                                                     f"{max(1, round(elapsed))} secs, took 0.42 GiB")
            took = time.time() - self.t_init
            self.core_line("core.py:402" if self.new else "core.py:259",
                           f"init engine (profile, create kv cache, warmup model) took "
                           + (f"{took:.2f} s" if self.new else f"{took:.2f} seconds"))

    def ready_line(self) -> None:
        self.log.uvicorn("INFO:     Application startup complete.")

    def crash(self, phase: str, message: str) -> None:
        c, log = self.cfg, self.log
        err = sys.stderr
        where = {"start": ("vllm/engine/arg_utils.py", 1204, "create_engine_config",
                           "model_config = self.create_model_config()"),
                 "init": ("vllm/distributed/parallel_state.py", 1038, "init_distributed_environment",
                          "torch.distributed.init_process_group("),
                 "weights": ("vllm/model_executor/model_loader/default_loader.py", 305, "load_weights",
                             "loaded_weights = model.load_weights(self.get_all_weights(model_config, model))"),
                 "kv": ("vllm/v1/worker/gpu_worker.py", 375, "determine_available_memory",
                        "self.model_runner.profile_run()"),
                 "graphs": ("vllm/v1/worker/gpu_model_runner.py", 4587, "capture_model",
                            "self._capture_cudagraphs("),
                 "listen": ("vllm/v1/engine/core.py", 259, "_initialize_kv_caches",
                            "self.model_executor.initialize_from_config(kv_cache_configs)"),
                 "ready": ("vllm/v1/engine/core.py", 889, "run_busy_loop",
                           "self._process_engine_step()")}[phase]
        base = "/usr/local/lib/python3.12/dist-packages/"
        tb = ["Traceback (most recent call last):",
              f'  File "{base}vllm/v1/engine/core.py", line 699, in run_engine_core',
              "    engine_core = EngineCoreProc(*args, **kwargs)" if phase != "ready" else "    engine_core.run_busy_loop()",
              f'  File "{base}{where[0]}", line {where[1]}, in {where[2]}',
              f"    {where[3]}",
              message]
        if phase == "ready":
            self.core_line("core.py:710", "EngineCore encountered a fatal error.", level="ERROR")
        else:
            self.core_line("core.py:708", "EngineCore failed to start.", level="ERROR")
        for line in tb:
            self.core_line("core.py:708", line, level="ERROR")
        log.raw(f"Process {self.core()}:", err)
        for line in tb:
            log.raw(line, err)
        if c.serves_api:
            if phase == "ready":
                self.api("async_llm.py:480", "AsyncLLM output_handler failed.", level="ERROR", stream=err)
                log.raw(f"(APIServer pid={log.pid}) vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered "
                        f"an issue. See stack trace (above) for the root cause.", err)
                log.raw(f"(APIServer pid={log.pid}) INFO:     Shutting down", err)
            else:
                log.raw(f"(APIServer pid={log.pid}) Traceback (most recent call last):", err)
                log.raw(f'(APIServer pid={log.pid})   File "{base}vllm/v1/engine/core_client.py", line 96, '
                        f"in make_async_mp_client", err)
                log.raw(f"(APIServer pid={log.pid}) RuntimeError: Engine core initialization failed. See root "
                        f"cause above. Failed core proc(s): {{'{self.core()}': 1}}", err)


# ----------------------------------------------------------------------------------------------
# Parsers and answers: what `env_layers verify` checks (tool calls, reasoning, accuracy)
# ----------------------------------------------------------------------------------------------

# models that think before they answer, as the catalog's are (STANDIN_REASONING overrides the guess)
THINKING_RE = re.compile(r"qwen3|kimi|glm-?[45]|gpt-oss|deepseek-r1|\bqwq\b", re.I)


class GateKnobs:
    """``STANDIN_REASONING=0|1`` (the model thinks; default guessed from its name) and
    ``STANDIN_WRONG_ANSWERS=1`` (answer the accuracy prompts wrongly, as a garbling fabric would)."""

    def __init__(self, env):
        self.reasoning = _flag("STANDIN_REASONING", env.get("STANDIN_REASONING"))
        self.wrong_answers = bool(_flag("STANDIN_WRONG_ANSWERS", env.get("STANDIN_WRONG_ANSWERS")))


def _flag(name: str, value: str | None) -> bool | None:
    if value is None or value.strip() == "":
        return None
    word = value.strip().lower()
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("0", "false", "no", "off"):
        return False
    raise KnobError(f"{name}={value!r}: expected 0 or 1")


_ORDINALS = {"first": 0, "second": 1, "third": 2, "fourth": 3, "fifth": 4}
_FACTS = {
    "chemical symbol for gold": "Au",
    "capital of japan": "Tokyo",
    "days are in a leap year": "366",
    "boiling point of water at sea level in degrees celsius": "100",
}


def solve(prompt: str) -> str | None:
    """The answer to one of the accuracy gate's prompt forms, worked out (not looked up), or None."""
    text = " ".join(prompt.split())
    if m := re.search(r"Compute (-?\d+) ([-+*/]) (-?\d+)\.", text):
        a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
        value = {"+": a + b, "-": a - b, "*": a * b, "/": a // b if b and a % b == 0 else None}[op]
        return None if value is None else str(value)
    if m := re.search(r"Write the text '([^']*)' in upper case", text):
        return m.group(1).upper()
    if m := re.search(r"Join the words ((?:'[^']*'(?:, | and )?)+) with hyphens", text):
        return "-".join(re.findall(r"'([^']*)'", m.group(1)))
    if m := re.search(r"What is the (\w+) word of '([^']*)'", text):
        words, index = m.group(2).split(), _ORDINALS.get(m.group(1).lower())
        return words[index] if index is not None and index < len(words) else None
    if m := re.search(r"Write the words of '([^']*)' in reverse order", text):
        return " ".join(reversed(m.group(1).split()))
    low = text.lower()
    for question, answer in _FACTS.items():
        if question in low:
            return answer
    return None


def garble(answer: str) -> str:
    """A wrong answer of the same kind: a number off by one, a string backwards."""
    if answer.lstrip("-").isdigit():
        return str(int(answer) + 1)
    backwards = answer[::-1]
    return backwards if backwards.lower() != answer.lower() else answer + "x"


def tool_arguments(tool: dict, text: str) -> dict:
    """Arguments for ``tool`` from the request: each required property gets a value of its type
    (a string: the capitalised word after "in"/"for" in the message, as "Paris" in "weather in Paris")."""
    params = tool.get("parameters") or {}
    props = params.get("properties") or {}
    place = re.search(r"\b(?:in|for|of) ([A-Z][\w-]*)", text)
    args = {}
    for name in params.get("required") or []:
        spec = props.get(name) or {}
        kind = spec.get("type")
        if spec.get("enum"):
            args[name] = spec["enum"][0]
        elif kind in ("integer", "number"):
            args[name] = 1
        elif kind == "boolean":
            args[name] = True
        else:
            args[name] = place.group(1) if place else "value"
    return args


def thinks(cfg: "Config", gate: GateKnobs) -> bool:
    return gate.reasoning if gate.reasoning is not None else bool(THINKING_RE.search(cfg.model))


def shape_reply(cfg: "Config", gate: GateKnobs, text: str, last_user: str, tools, tool_choice, chat: bool,
                fixed_reply: bool):
    """The engine's parsers at work: returns ``(text, tool_calls, reasoning, finish)``.

    - tool calls come back structured only with the tool parser (vLLM: ``--enable-auto-tool-choice
      --tool-call-parser``, checked before this; SGLang: ``--tool-call-parser``), else as the model's
      raw ``<tool_call>`` prose in ``content``;
    - a thinking model's reasoning is separate only with ``--reasoning-parser`` (SGLang
      ``reasoning_content``, vLLM ``reasoning``), else inline as ``<think>...</think>`` in ``content``;
    - the accuracy prompts get their worked-out answer, or a wrong one under STANDIN_WRONG_ANSWERS=1.
    """
    answer = None if fixed_reply else solve(last_user)
    if answer is not None:
        text = garble(answer) if gate.wrong_answers else answer
    tool_calls, finish = None, "stop"
    if chat and tools and tool_choice != "none" and isinstance(tools, list) and isinstance(tools[0], dict):
        fn = tools[0].get("function") or {}
        call = {"name": fn.get("name", "tool"), "arguments": tool_arguments(fn, last_user)}
        if cfg.tool_parser:
            tool_calls = [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                           "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])}}]
            text, finish = "", "tool_calls"
        else:
            text = f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
    reasoning = None
    if chat and thinks(cfg, gate):
        thought = f"The user asks: {last_user.strip()[:120]} I will answer briefly."
        if cfg.reasoning_parser:
            reasoning = thought
        else:
            text = f"<think>\n{thought}\n</think>\n\n{text}"
    return text, tool_calls, reasoning, finish


# ----------------------------------------------------------------------------------------------
# HTTP
# ----------------------------------------------------------------------------------------------

@contextlib.contextmanager
def queued(st: "State"):
    """Wait for one of STANDIN_MAX_RUNNING places (counted as waiting, the wait added to the queue-time
    histogram), then hold it STANDIN_REQUEST_S before the request is answered."""
    slots = st.slots
    if slots is not None:
        started = time.monotonic()
        with st.lock:
            st.counters["waiting"] += 1
        slots.acquire()
        with st.lock:
            st.counters["waiting"] -= 1
            st.counters["queue_s"] += time.monotonic() - started
            st.counters["queued"] += 1
    try:
        if st.knobs.request_s:
            time.sleep(st.knobs.request_s)
        yield
    finally:
        if slots is not None:
            slots.release()


@contextlib.contextmanager
def in_flight(st: "State"):
    """Count a completion request as running while it is answered: the engines' in-flight gauges
    (vllm:num_requests_running, sglang:num_running_reqs) that idle release reads next to the finished
    counters (vllm:request_success_total, sglang:num_requests_total)."""
    with st.lock:
        st.counters["in_flight"] += 1
    try:
        yield
    finally:
        with st.lock:
            st.counters["in_flight"] -= 1


class State:
    def __init__(self, cfg: Config, log: Log, knobs: Knobs, dummy: bool = False):
        self.cfg, self.log, self.knobs = cfg, log, knobs
        self.dummy = dummy
        self.ready = dummy  # SGLang: /health says 503 until "fired up"; a dummy server is always healthy
        self.lock = threading.Lock()
        self.counters = {"requests": 0, "prompt_tokens": 0, "generation_tokens": 0, "in_flight": 0, "waiting": 0,
                         "queue_s": 0.0, "queued": 0}
        cap = getattr(knobs, "max_running", None)
        self.slots = threading.BoundedSemaphore(cap) if cap else None
        self.started = int(time.time())
        self.gate = GateKnobs({})  # run() sets the process's own
        self.hung = False  # SIGUSR1: a hung server (install_hang_signal)
        self.stalled = False  # SIGUSR2: an engine that no longer generates behind a live server
        self.core_dead = False  # STANDIN_CORE_DIES_AFTER_READY_SECONDS: completions answer 500 (EngineDeadError)


def _words(text: str) -> list[str]:
    return text.split()


def _content_text(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


def _key_required(engine: str, path: str) -> bool:
    if engine == "vllm":
        return path.startswith("/v1")
    return not (path.startswith("/health") or path.startswith("/metrics"))


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # TCP_NODELAY, as uvicorn sets it for the real engines: without it a keep-alive client (a router)
    # waits out the delayed ACK (~40 ms) between the headers and the body of every answer
    disable_nagle_algorithm = True
    server_version = "uvicorn"
    sys_version = ""
    timeout = 30

    @property
    def st(self) -> State:
        return self.server.state  # type: ignore[attr-defined]

    def log_message(self, format, *args):  # noqa: A002 - silence the default stderr logging
        pass

    # -- helpers --
    def _send(self, status: int, body, content_type: str = "application/json", headers=None) -> None:
        data = body if isinstance(body, bytes) else (json.dumps(body).encode() if not isinstance(body, str)
                                                     else body.encode())
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        self.st.log.access(f"{self.client_address[0]}:{self.client_address[1]}", self.command, self.path, status)

    def _error(self, status: int, message: str, etype: str, param=None) -> None:
        self._send(status, {"error": {"message": message, "type": etype, "param": param, "code": status}})

    def _read_body(self) -> bytes:
        try:
            length = int(self.headers.get("content-length") or 0)
        except ValueError:
            length = 0
        return self.rfile.read(length) if length > 0 else b""

    def _authorized(self) -> bool:
        keys = self.st.cfg.api_keys
        if not keys:
            return True
        header = self.headers.get("authorization") or ""
        token = header[7:] if header.lower().startswith("bearer ") else None
        return token is not None and any(hmac.compare_digest(token.encode(), k.encode()) for k in keys)

    def _route(self, method: str) -> None:
        path = self.path.split("?", 1)[0]
        st = self.st
        if st.hung:
            return _hang_forever()
        if st.dummy:
            if method == "GET" and path in ("/health", "/health_generate", "/ping"):
                return self._send(200, b"", "text/plain")
            return self._send(404, {"detail": "Not Found"})
        # vLLM's key guards /v1/* only; SGLang's guards everything but /health* and /metrics
        if _key_required(st.cfg.engine, path) and not self._authorized():
            return self._send(401, {"error": "Unauthorized"})
        if method in ("GET", "HEAD"):
            if path in ("/health", "/health_generate"):
                if not st.ready:
                    return self._send(503, b"", "text/plain")
                return self._send(200, b"", "text/plain")
            if path == "/ping":
                return self._send(200, b"", "text/plain")
            if path == "/version":
                return self._send(200, {"version": VERSIONS[st.cfg.engine]})
            if path == "/metrics":
                if not st.cfg.metrics:
                    return self._send(404, {"detail": "Not Found"})
                return self._send(200, self._metrics(), "text/plain; version=0.0.4; charset=utf-8")
            if path == "/v1/models":
                return self._send(200, self._models())
            if path.startswith("/v1/models/"):
                name = path[len("/v1/models/"):]
                for m in self._models()["data"]:
                    if m["id"] == name:
                        return self._send(200, m)
                return self._error(404, f"The model `{name}` does not exist.", "NotFoundError", "model")
        elif method == "POST":
            if path in ("/v1/chat/completions", "/v1/completions"):
                with queued(st), in_flight(st):
                    if st.stalled:
                        _hang_forever()  # a stuck engine: running for ever, no token (the process's end ends it)
                    return self._completion(chat=path == "/v1/chat/completions")
            if path in ("/health", "/ping", "/v1/models"):
                return self._send(405, {"detail": "Method Not Allowed"})
        return self._send(404, {"detail": "Not Found"})

    def do_GET(self):
        self._route("GET")

    def do_HEAD(self):
        self._route("HEAD")

    def do_POST(self):
        self._body = self._read_body()  # always drain the body: the connection is kept alive
        self._route("POST")

    # -- endpoints --
    def _models(self) -> dict:
        c = self.st.cfg
        owner = "vllm" if c.engine == "vllm" else "sglang"
        return {"object": "list", "data": [
            {"id": name, "object": "model", "created": self.st.started, "owned_by": owner, "root": c.model,
             "parent": None, "max_model_len": c.max_len} for name in c.served]}

    def _metrics(self) -> str:
        st, c = self.st, self.st.cfg
        name = c.served[0]
        with st.lock:
            n = dict(st.counters)
        if c.engine == "vllm":
            lab = f'{{engine="0",model_name="{name}"}}'
            rows = [
                ("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
                 n["in_flight"]),
                ("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", n["waiting"]),
                ("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", 0.0),
                ("vllm:prefix_cache_queries_total", "counter", "Prefix cache queries, in terms of number of "
                                                               "queried tokens.", n["prompt_tokens"]),
                ("vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached "
                                                            "tokens.", 0),
                ("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", n["prompt_tokens"]),
                ("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.",
                 n["generation_tokens"]),
                ("vllm:request_success_total", "counter", "Count of successfully processed requests.",
                 n["requests"]),
            ]
        else:
            lab = f'{{model_name="{name}"}}'
            rows = [
                ("sglang:num_running_reqs", "gauge", "The number of running requests.", n["in_flight"]),
                ("sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.", n["waiting"]),
                ("sglang:token_usage", "gauge", "The token usage.", 0.0),
                ("sglang:cache_hit_rate", "gauge", "The prefix cache hit rate.", 0.0),
                ("sglang:gen_throughput", "gauge", "The generation throughput (token/s).", 0.0),
                ("sglang:prompt_tokens_total", "counter", "Number of prefill tokens processed.", n["prompt_tokens"]),
                ("sglang:generation_tokens_total", "counter", "Number of generation tokens processed.",
                 n["generation_tokens"]),
                ("sglang:num_requests_total", "counter", "Number of requests processed.", n["requests"]),
            ]
        out = []
        for metric, kind, helptext, value in rows:
            out += [f"# HELP {metric} {helptext}", f"# TYPE {metric} {kind}", f"{metric}{lab} {float(value)}"]
        hist = "vllm:request_queue_time_seconds" if c.engine == "vllm" else "sglang:queue_time_seconds"
        inf = lab[:-1] + ',le="+Inf"}'
        out += [f"# HELP {hist} Histogram of time spent in WAITING phase for request.", f"# TYPE {hist} histogram",
                f"{hist}_bucket{inf} {float(n['queued'])}", f"{hist}_count{lab} {float(n['queued'])}",
                f"{hist}_sum{lab} {float(n['queue_s'])}"]
        return "\n".join(out) + "\n"

    def _completion(self, chat: bool) -> None:
        st, c = self.st, self.st.cfg
        raw = getattr(self, "_body", b"")
        try:
            req = json.loads(raw.decode("utf-8") or "null")
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            return self._error(400, f"JSON decode error: {exc}", "BadRequestError")
        if not isinstance(req, dict):
            return self._error(400, "The request body must be a JSON object.", "BadRequestError")
        if st.core_dead:  # vLLM after its engine core died: every request fails with EngineDeadError
            return self._error(500, "EngineCore encountered an issue. See stack trace (above) for the root cause.",
                               "EngineDeadError")
        model = req.get("model")
        if model is not None and model not in c.served:
            return self._error(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
        model = model or c.served[0]
        if chat:
            messages = req.get("messages")
            if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
                return self._error(400, "'messages' must be a non-empty list of message objects.",
                                   "BadRequestError", "messages")
            prompt_text = " ".join(_content_text(m.get("content")) for m in messages)
            last_user = next((_content_text(m.get("content")) for m in reversed(messages)
                              if m.get("role") == "user"), "")
        else:
            prompt = req.get("prompt")
            if isinstance(prompt, list):
                prompt = " ".join(str(p) for p in prompt)
            if not isinstance(prompt, str):
                return self._error(400, "'prompt' must be a string or a list of strings.", "BadRequestError",
                                   "prompt")
            prompt_text = last_user = prompt
        tools = req.get("tools") if chat else None
        tool_choice = req.get("tool_choice")
        if tools and c.engine == "vllm" and tool_choice in (None, "auto") and \
                not (c.auto_tool_choice and c.tool_parser):
            return self._error(400, '"auto" tool choice requires --enable-auto-tool-choice and '
                                    '--tool-call-parser to be set', "BadRequestError")
        limit = req.get("max_completion_tokens", req.get("max_tokens"))
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
            return self._error(400, "max_tokens must be a positive integer.", "BadRequestError", "max_tokens")
        prompt_tokens = max(1, len(_words(prompt_text)))  # one word, one token
        if prompt_tokens + (limit or 0) > c.max_len:
            if c.engine == "vllm":
                return self._error(400, f"This model's maximum context length is {c.max_len} tokens. However, you "
                                        f"requested {prompt_tokens + (limit or 0)} tokens ({prompt_tokens} in the "
                                        f"messages, {limit or 0} in the completion). Please reduce the length of "
                                        f"the messages or completion.", "BadRequestError")
            return self._error(400, f"The input ({prompt_tokens} tokens) is longer than the model's context length "
                                    f"({c.max_len} tokens).", "BadRequestError")
        text = st.knobs.reply if st.knobs.reply is not None else f"Hello! You said: {last_user.strip()[:500]}"
        text, tool_calls, reasoning, finish = shape_reply(c, st.gate, text, last_user, tools, tool_choice, chat,
                                                          fixed_reply=st.knobs.reply is not None)
        words = _words(text) if tool_calls is None else []
        if tool_calls is None and req.get("stream"):
            words = st.knobs.pace.pad(words, req, limit)
        if limit is not None and len(words) > limit:
            words, finish = words[:limit], "length"
            text = " ".join(words)
        completion_tokens = len(words) if tool_calls is None else 8
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                 "total_tokens": prompt_tokens + completion_tokens}
        with st.lock:
            st.counters["requests"] += 1
            st.counters["prompt_tokens"] += prompt_tokens
            st.counters["generation_tokens"] += completion_tokens
        created = int(time.time())
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        if req.get("stream"):
            return self._stream(chat, rid, created, model, words, finish, tool_calls, reasoning, usage,
                                bool((req.get("stream_options") or {}).get("include_usage")))
        if chat:
            message = {"role": "assistant", "content": text if tool_calls is None else None,
                       "tool_calls": tool_calls or []}
            if c.reasoning_parser:
                message["reasoning_content" if c.engine == "sglang" else "reasoning"] = reasoning
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
            body = {"id": rid, "object": "chat.completion", "created": created, "model": model,
                    "choices": [choice], "usage": usage}
        else:
            body = {"id": rid, "object": "text_completion", "created": created, "model": model,
                    "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
                    "usage": usage}
        self._send(200, body)

    def _stream(self, chat, rid, created, model, words, finish, tool_calls, reasoning, usage, include_usage):
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(payload) -> None:
            data = f"data: {payload}\n\n".encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def event(delta=None, text=None, finish_reason=None, with_usage=None) -> str:
            if chat:
                choice = {"index": 0, "delta": delta or {}, "logprobs": None, "finish_reason": finish_reason}
            else:
                choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
            body = {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice]}
            if with_usage is not None:
                body = {"id": rid, "object": obj, "created": created, "model": model, "choices": [],
                        "usage": with_usage}
            return json.dumps(body)

        try:
            self.st.knobs.pace.first_token()
            if chat:
                chunk(event(delta={"role": "assistant", "content": ""}))
                if reasoning:
                    chunk(event(delta={"reasoning_content" if self.st.cfg.engine == "sglang" else "reasoning":
                                       reasoning}))
                if tool_calls:
                    chunk(event(delta={"tool_calls": [dict(tool_calls[0], index=0)]}))
            for i, word in self.st.knobs.pace.paced(words):
                piece = word if i == 0 else " " + word
                chunk(event(delta={"content": piece}) if chat else event(text=piece))
            chunk(event(delta={}, text="", finish_reason=finish))
            if include_usage:
                chunk(event(with_usage=usage))
            chunk("[DONE]")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass
        self.st.log.access(f"{self.client_address[0]}:{self.client_address[1]}", self.command, self.path, 200)


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, host: str, port: int, state: State):
        bind_host = host if host not in (None, "") else "0.0.0.0"
        if bind_host.startswith("[") and bind_host.endswith("]"):
            bind_host = bind_host[1:-1]
        self.address_family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
        self.state = state
        super().__init__((bind_host, port), Handler, bind_and_activate=False)

    def server_bind(self):
        # skip HTTPServer.server_bind: its getfqdn() can stall for seconds without DNS
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]


# ----------------------------------------------------------------------------------------------
# Process control
# ----------------------------------------------------------------------------------------------

_LOG: Log | None = None
_SERVING = False
_HEADLESS = False


def _exit_now(code: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _on_signal(signum, frame) -> None:
    if _LOG is not None and _LOG.engine == "vllm" and not _SERVING and _HEADLESS:
        _LOG.raw(f"INFO {time.strftime('%m-%d %H:%M:%S')} [serve.py:298] Shutting down.")
    if _LOG is not None and _SERVING:
        prefix = f"(APIServer pid={_LOG.pid}) " if _LOG.engine == "vllm" else ""
        if _LOG.engine == "vllm":
            _LOG.raw(f"{prefix}INFO:     Shutting down")
            _LOG.raw(f"{prefix}INFO:     Waiting for application shutdown.")
            _LOG.raw(f"{prefix}INFO:     Application shutdown complete.")
        else:
            _LOG.sg("INFO:     Shutting down")
    _exit_now(0)


def install_hang_signal(state: "State") -> None:
    """SIGUSR1 turns the server into a hung one (a deadlocked collective, a stuck scheduler): the
    process lives and the socket still accepts connections, but no request (``/health`` and the API
    alike) is ever answered. SIGUSR2 stalls only the engine, as a stopped engine core behind vLLM's live
    API server: ``/health``, ``/metrics`` and ``/v1/models`` answer, every completion is counted running
    and never gets a token. Only SIGTERM/SIGINT end it."""
    def on_usr1(signum, frame) -> None:
        state.hung = True
        state.log.raw("[standin] SIGUSR1: hung, no request is answered from now on\n")

    signal.signal(signal.SIGUSR1, on_usr1)

    def on_usr2(signum, frame) -> None:
        state.stalled = True
        state.log.raw("[standin] SIGUSR2: stalled, /health and /metrics answer, no token is generated from now on\n")

    signal.signal(signal.SIGUSR2, on_usr2)


def _hang_forever() -> None:
    while True:
        time.sleep(3600)


def _sleep(seconds: float) -> None:
    if seconds > 0:
        time.sleep(seconds)


def _forever() -> None:
    # not signal.pause(): the kernel may hand a signal to a server thread, and Python runs its handler
    # only once the main thread wakes; a short sleep bounds that delay (SIGUSR1, SIGTERM)
    while True:
        time.sleep(0.2)


def join_ray(cfg: "Config", env) -> dict:
    """vLLM's Ray executor: join the cluster at RAY_ADDRESS (``ray.init``), as the real engine does
    before it places its workers, and check it is the cluster the job formed: at least tp x pp GPUs
    (the real engine's check) and, with STANDIN_RAY_NODES, exactly that many live nodes. Raises
    RuntimeError with the real engine's kind of message when not."""
    address = env.get("RAY_ADDRESS")
    if not address:
        raise RuntimeError("[standin] --distributed-executor-backend ray without RAY_ADDRESS: vLLM would start a "
                           "private one-node Ray instance instead of joining the job's cluster")
    import ray

    ray.init(address=address, logging_level="WARNING", log_to_driver=False)
    for sig in (signal.SIGTERM, signal.SIGINT):  # ray.init installs its own; SIGTERM still exits 0 at once
        signal.signal(sig, _on_signal)
    nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
    gpus = int(ray.cluster_resources().get("GPU", 0))
    want = env.get("STANDIN_RAY_NODES")
    if want and int(want) != nodes:
        raise RuntimeError(f"[standin] the Ray cluster at {address} has {nodes} live node(s), expected "
                           f"STANDIN_RAY_NODES={want}")
    if gpus < cfg.tp * cfg.pp:
        raise RuntimeError(f"ValueError: The number of required GPUs exceeds the total number of available GPUs "
                           f"in the placement group. (required {cfg.tp * cfg.pp}, the Ray cluster at {address} has "
                           f"{gpus} on {nodes} node(s))")
    return {"address": address, "nodes": nodes, "gpus": gpus}


def _record(path: str, engine: str, entry: list[str], argv: list[str], rank, rejected, env,
            ray_info: dict | None = None) -> None:
    try:
        import resource

        core = list(resource.getrlimit(resource.RLIMIT_CORE))
    except (ImportError, OSError, ValueError):
        core = None
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count()
    keys = sorted(k for k in env if k.startswith(RECORD_ENV_PREFIXES) or k in RECORD_ENV_KEYS)
    data = {"engine": engine, "entry": entry, "argv": argv, "rank": rank, "rejected": rejected,
            "pid": os.getpid(), "hostname": socket.gethostname(), "cwd": os.getcwd(), "time": time.time(),
            "executable": sys.executable, "orig_argv": list(getattr(sys, "orig_argv", sys.argv)),
            "rlimit_core": core, "cpus": cpus,
            "env": {k: env[k] for k in keys}}
    if ray_info is not None:
        data["ray"] = ray_info
    line = json.dumps(data, sort_keys=True) + "\n"
    try:
        with open(path, "a", encoding="utf-8") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                fh.write(line)
                fh.flush()
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)
    except OSError as exc:
        sys.stderr.write(f"standin: cannot write STANDIN_RECORD={path}: {exc}\n")


def _rank_guess(argv: list[str], env) -> int | None:
    for i, arg in enumerate(argv):
        if arg.startswith("--node-rank") or arg.startswith("--node_rank"):
            value = arg.split("=", 1)[1] if "=" in arg else (argv[i + 1] if i + 1 < len(argv) else "")
            try:
                return int(value)
            except ValueError:
                return None
    try:
        return int(env.get("SLURM_PROCID", "0"))
    except ValueError:
        return None


def run(engine: str, argv: list[str], entry: list[str]) -> int:
    """Parse ``argv`` as the real ``engine`` would, then behave like it. Never returns normally
    once the server has started (it exits on a signal, a crash knob or a parse error)."""
    global _LOG, _SERVING, _HEADLESS
    env = dict(os.environ)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _on_signal)
    try:
        knobs = Knobs(env)
    except KnobError as exc:
        sys.stderr.write(f"standin: {exc}\n")
        return 2
    try:
        gate = GateKnobs(env)
    except KnobError as exc:
        sys.stderr.write(f"standin: {exc}\n")
        return 2

    parser = build_parser(engine)
    args = normalize_vllm_args(argv) if engine == "vllm" else list(argv)
    try:
        ns = parser.parse_args(args)
    except SystemExit as exc:
        if knobs.record:
            _record(knobs.record, engine, entry, list(argv), _rank_guess(argv, env), exc.code != 0, env)
        raise
    defaults = parser.parse_args(["--model-path", "x"] if engine == "sglang" else [])
    given = [d for d in vars(ns) if getattr(ns, d) != getattr(defaults, d) or
             (engine == "sglang" and d == "model_path")]
    # a flag given with its default value still counts as given
    for names, dest, _kind, _extra in (SGLANG_FLAGS if engine == "sglang" else VLLM_FLAGS):
        if dest not in given and any(a == n or a.startswith(n + "=") for a in args for n in names):
            given.append(dest)

    refusal = vllm_refusal(ns) if engine == "vllm" else None
    if refusal:
        sys.stderr.write("Traceback (most recent call last):\n"
                         '  File "/usr/local/lib/python3.12/dist-packages/vllm/entrypoints/cli/main.py", line 75, '
                         f"in main\n{refusal}\n")
        if knobs.record:
            _record(knobs.record, engine, entry, list(argv), _rank_guess(argv, env), True, env)
        return 1

    cfg = Config(engine, ns, given, knobs, env)
    log = Log(engine, knobs.log_stream)
    ray_info = None
    if engine == "vllm" and ns.distributed_executor_backend == "ray":
        try:
            ray_info = join_ray(cfg, env)
        except Exception as exc:  # loudly: the job's Ray cluster is not what the command asks for
            sys.stderr.write(f"Traceback (most recent call last):\n  File \"vllm/v1/executor/ray_utils.py\", "
                             f"in initialize_ray_cluster\n{exc}\n")
            if knobs.record:
                _record(knobs.record, engine, entry, list(argv), cfg.rank, False, env,
                        {"error": str(exc)})
            return 1
        log.raw(f"[standin] joined the Ray cluster at {ray_info['address']}: {ray_info['nodes']} live node(s), "
                f"{ray_info['gpus']} GPU(s)")
    if knobs.record:
        _record(knobs.record, engine, entry, list(argv), cfg.rank, False, env, ray_info)
    _LOG = log
    _HEADLESS = not cfg.serves_api
    script = SGLangScript(cfg, log, knobs) if engine == "sglang" else VLLMScript(cfg, log, knobs)
    applies = knobs.applies(cfg.rank)
    state = State(cfg, log, knobs)
    install_hang_signal(state)
    state.gate = gate

    server = None
    if cfg.serves_api and engine == "vllm":
        # vLLM binds its socket before starting the engine and listens only once it is up
        server = Server(cfg.host, cfg.port, state)
        try:
            server.server_bind()
        except OSError as exc:
            log.raw(f"OSError: [Errno {exc.errno}] {exc.strerror}: could not bind "
                    f"{cfg.display_host()}:{cfg.port}", sys.stderr)
            return 1

    def crash(phase: str) -> None:
        if knobs.crash_signal is not None:
            try:
                signal.signal(knobs.crash_signal, signal.SIG_DFL)  # our TERM/INT handlers would exit 0
            except (OSError, ValueError):
                pass  # SIGKILL/SIGSTOP cannot be handled anyway
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            os.kill(os.getpid(), knobs.crash_signal)
            time.sleep(5)
        message = knobs.crash_message or f"RuntimeError: [standin] injected crash at phase '{phase}' (STANDIN_CRASH_AT)"
        script.crash(phase, message)
        _exit_now(knobs.exit_code)

    load = knobs.load_s
    for phase in PHASES:
        t_phase = time.time()
        script.begin(phase)
        if applies and knobs.inject_at == phase:
            for line in knobs.inject_lines:
                log.raw(line)
        if phase == "init" and cfg.missing_network(knobs, env):
            net = cfg.missing_network(knobs, env)
            host = socket.gethostname().split(".")[0]
            log.raw(f"{host}:{os.getpid()}:{os.getpid() + 61} [0] NCCL WARN Error: network {net} not found.")
            script.crash(phase, "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
                                "ProcessGroupNCCL.cpp:1970, internal error - please report this issue to the NCCL "
                                "developers, NCCL version 2.21.5\nncclInternalError: Internal check failed.\n"
                                "Last error:\nFailed to initialize any NET plugin")
            _exit_now(1)
        if applies and knobs.crash_at == phase:
            crash(phase)
        if applies and knobs.hang_at == phase:
            _forever()
        if phase == "ready":
            break
        if phase == "listen":
            if cfg.serves_api:
                if engine == "sglang":
                    server = Server(cfg.host, cfg.port, state)
                    try:
                        server.server_bind()
                    except OSError as exc:
                        log.sg(f"ERROR:    [Errno {exc.errno}] error while attempting to bind on address "
                               f"({cfg.display_host()!r}, {cfg.port}): {(exc.strerror or '').lower()}")
                        _exit_now(1)
                    server.server_activate()
                    threading.Thread(target=server.serve_forever, daemon=True).start()
                    _SERVING = True
                    _sleep(load * PHASE_SHARE[phase])  # warm-up: /health answers 503
                    script.end(phase, time.time() - t_phase)
                    state.ready = True
                    script.ready_line()
                else:
                    _sleep(load * PHASE_SHARE[phase])
                    server.server_activate()
                    threading.Thread(target=server.serve_forever, daemon=True).start()
                    _SERVING = True
                    state.ready = True
                    script.ready_line()
            else:
                _sleep(load * PHASE_SHARE[phase])
                if engine == "sglang" and knobs.dummy_health:
                    dummy = Server(cfg.host, cfg.port, State(cfg, log, knobs, dummy=True))
                    try:
                        dummy.server_bind()
                        dummy.server_activate()
                        threading.Thread(target=dummy.serve_forever, daemon=True).start()
                    except OSError as exc:
                        log.sg(f"dummy health check server could not bind: {exc}")
            continue
        _sleep(load * PHASE_SHARE[phase])
        script.end(phase, time.time() - t_phase)

    if applies and knobs.core_dies_after_ready_s is not None and engine == "vllm":
        _sleep(knobs.core_dies_after_ready_s)
        if server is not None:
            server.state.core_dead = True
        script.api("core_client.py:818", "[shutdown] MPClient: engine core exited unexpectedly; starting cleanup",
                   level="WARNING")
        _sleep(knobs.core_death_exit_s)
        script.api("launcher.py:110", "Shutting down FastAPI HTTP server.")
        _exit_now(knobs.exit_code)
    if applies and knobs.crash_after_ready_s is not None:
        _sleep(knobs.crash_after_ready_s)
        if knobs.crash_signal is None:
            script.crash("ready", knobs.crash_message or
                         "RuntimeError: [standin] injected crash after ready (STANDIN_CRASH_AFTER_READY_SECONDS)")
            _exit_now(knobs.exit_code)
        crash("ready")
    _forever()
    return 0


def main_sglang(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    return run("sglang", argv, ["python3", "-m", "sglang.launch_server"])


VLLM_SUBCOMMANDS = ("chat", "complete", "serve", "bench", "collect-env", "run-batch")


def main_vllm(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    usage = "usage: vllm [-h] [-v] {chat,complete,serve,bench,collect-env,run-batch} ..."
    if not argv or argv[0] in ("-h", "--help"):
        print(usage)
        print("\nvLLM CLI (envlayers test stand-in: only 'serve' is implemented)")
        return 0 if argv else 2
    if argv[0] in ("-v", "--version"):
        print(VERSIONS["vllm"])
        return 0
    if argv[0] != "serve":
        sys.stderr.write(f"{usage}\n")
        if argv[0] in VLLM_SUBCOMMANDS:
            sys.stderr.write(f"vllm: error: the envlayers stand-in implements only 'serve', not {argv[0]!r}\n")
        else:
            choices = ", ".join(repr(c) for c in VLLM_SUBCOMMANDS)
            sys.stderr.write(f"vllm: error: argument subparser: invalid choice: {argv[0]!r} (choose from {choices})\n")
        return 2
    return run("vllm", argv[1:], ["vllm", "serve"])


if __name__ == "__main__":  # python engine.py {vllm|sglang} ARGS...
    if len(sys.argv) < 2 or sys.argv[1] not in ("vllm", "sglang"):
        sys.stderr.write("usage: engine.py {vllm|sglang} ARGS...\n")
        sys.exit(2)
    sys.exit(main_vllm(sys.argv[2:]) if sys.argv[1] == "vllm" else main_sglang(sys.argv[2:]))
