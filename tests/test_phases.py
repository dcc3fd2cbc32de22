"""Startup phases from server logs: one rule per test id."""

from __future__ import annotations

from pathlib import Path

import pytest

from envlayers.phases import PHASE_ORDER, PhaseTracker, detect_engine, parse_phases, parse_phases_text

LOGS = Path(__file__).parent / "data" / "logs"

SG = "[2026-11-30 14:00:13 TP0] "
VL = "(Worker_TP0 pid=40412) INFO 11-30 09:13:31 [gpu_model_runner.py:2653] "
EC = "(EngineCore_DP0 pid=40388) INFO 11-30 09:14:23 [kv_cache_utils.py:1087] "
# vLLM 0.32 on CPUs (the real engine's prefixes: one worker, one engine core, no DP/TP suffix)
W32 = "(Worker pid=22605) INFO 12-03 16:54:20 [default_loader.py:501] "
EC32 = "(EngineCore pid=22342) INFO 12-03 16:54:21 [kv_cache_utils.py:2327] "


# a real vLLM 0.32 CPU startup, captured from the lab (tests/slurm/test_real_vllm_e2e.py): --enforce-eager, so no
# graph capture; (phase, line) as the real log has them
REAL_CPU_LOG = "healthy-vllm-0.32-cpu"
REAL_CPU_PHASES = [("loading", 41), ("weights-loaded", 50), ("kv-cache", 53), ("ready", 105)]

# (lines, expected last phase name, expected details of that phase)
CASES = [
    pytest.param([SG + "Load weight begin. avail mem=106.52 GB"], "loading", {"avail_mem_gb": 106.52},
                 id="sglang-weights-loading"),
    pytest.param([SG + "Load weight begin. avail mem=106.52 GB",
                  SG + "Load weight end. elapsed=147.1 s, type=Qwen3ForCausalLM, dtype=torch.bfloat16, "
                       "avail mem=77.30 GB, mem usage=29.22 GB."],
                 "weights-loaded", {"elapsed_s": 147.1, "mem_usage_gb": 29.22, "avail_mem_gb": 77.3},
                 id="sglang-weights-loaded-elapsed-and-memory"),
    pytest.param([SG + "Load weight end. quant=fp8, fmt=e4m3, avail mem=12.25 GB, mem usage=125.65 GB."],
                 "weights-loaded", {"mem_usage_gb": 125.65, "avail_mem_gb": 12.25},
                 id="sglang-weights-loaded-without-elapsed"),
    pytest.param([SG + "KV Cache is allocated. #tokens: 2243474, K size: 59.91 GB, V size: 59.91 GB"],
                 "kv-cache", {"tokens": 2243474}, id="sglang-kv-cache-token-count"),
    pytest.param([SG + "KV Cache is allocated. dtype: torch.bfloat16, #tokens: 1106304, K size: 25.32 GB"],
                 "kv-cache", {"tokens": 1106304}, id="sglang-kv-cache-with-dtype"),
    pytest.param([SG + "max_total_num_tokens=412160, chunked_prefill_size=8192, max_prefill_tokens=16384"],
                 "kv-cache", {"tokens": 412160}, id="sglang-max-total-num-tokens"),
    pytest.param([SG + "Mamba Cache is allocated. max_mamba_cache_size: 96",
                  SG + "KV Cache is allocated. #tokens: 1048576, K size: 12.00 GB, V size: 12.00 GB"],
                 "kv-cache", {"mamba_cache_size": 96, "tokens": 1048576}, id="sglang-mamba-and-kv-cache"),
    pytest.param([SG + "Capture cuda graph begin. This can take up to several minutes. avail mem=39.48 GB"],
                 "graph-capture", {}, id="sglang-graph-capture-begin"),
    pytest.param([SG + "Capture cuda graph begin. This can take up to several minutes. avail mem=39.48 GB",
                  SG + "Capture cuda graph end. Time elapsed: 5.37 s. mem usage=1.44 GB. avail mem=38.05 GB."],
                 "graph-capture", {"elapsed_s": 5.37, "mem_usage_gb": 1.44}, id="sglang-graph-capture-end"),
    pytest.param([SG + "Load weight begin. avail mem=1 GB", "[2026-11-30 14:03:50] INFO:     Application startup "
                  "complete."], "loading", {"avail_mem_gb": 1.0}, id="sglang-uvicorn-startup-is-not-ready"),
    pytest.param([SG + "Load weight begin. avail mem=1 GB", "[2026-11-30 14:03:50] The server is fired up and "
                  "ready to roll!"], "ready", {}, id="sglang-fired-up"),
    pytest.param([VL + "Starting to load model openai/gpt-oss-120b..."], "loading",
                 {"model": "openai/gpt-oss-120b"}, id="vllm-loading"),
    pytest.param(["Loading safetensors checkpoint shards:   0% Completed | 0/15 [00:00<?, ?it/s]"], "loading", {},
                 id="vllm-loading-shards"),
    pytest.param([VL + "Model loading took 16.9012 GiB and 66.210331 seconds"], "weights-loaded",
                 {"mem_usage_gib": 16.9012, "elapsed_s": 66.210331}, id="vllm-weights-loaded"),
    pytest.param([VL + "Model loading took 12.66 GiB memory and 31.657031 seconds"], "weights-loaded",
                 {"mem_usage_gib": 12.66, "elapsed_s": 31.657031}, id="vllm-weights-loaded-memory-wording"),
    pytest.param([VL + "Available KV cache memory: 61.37 GiB",
                  EC + "GPU KV cache size: 3,574,672 tokens",
                  EC + "Maximum concurrency for 131,072 tokens per request: 48.77x"],
                 "kv-cache", {"kv_cache_gib": 61.37, "tokens": 3574672, "tokens_per_request": 131072,
                              "max_concurrency": 48.77}, id="vllm-kv-cache"),
    pytest.param(["Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%|##| 67/67 [00:09<00:00]",
                  VL + "Graph capturing finished in 12 secs, took 0.62 GiB"],
                 "graph-capture", {"elapsed_s": 12.0, "mem_usage_gib": 0.62}, id="vllm-graph-capture"),
    pytest.param([VL + "Starting to load model m...", "(APIServer pid=1) INFO:     Application startup complete."],
                 "ready", {}, id="vllm-startup-complete"),
    pytest.param([VL + "Starting to load model openai/gpt-oss-120b...", VL + "Loading weights took 62.31 seconds",
                  VL + "Model loading took 16.9012 GiB and 66.210331 seconds"], "weights-loaded",
                 {"weights_elapsed_s": 62.31, "mem_usage_gib": 16.9012, "elapsed_s": 66.210331},
                 id="vllm-loader-line-then-model-runner-line-one-phase"),
    pytest.param([W32 + "Loading weights took 0.01 seconds"], "weights-loaded", {"weights_elapsed_s": 0.01},
                 id="vllm-0.32-cpu-weights-loaded-without-model-loading-took"),
    pytest.param(["(Worker pid=22605) INFO 12-03 16:54:21 [cpu_worker.py:260] Explicitly set (1.0/7.96) GiB for KV "
                  "cache on node 0."], "kv-cache", {"kv_cache_gib": 1.0}, id="vllm-0.32-cpu-kv-cache-space-given"),
    pytest.param(["(Worker pid=1) INFO 12-03 16:54:21 [cpu_worker.py:260] Auto set (3.25/7.96) GiB for KV cache on "
                  "node 0, with 4.00 GiB requested memory for the worker. 0.75 GiB memory was consumed by non-kv "
                  "usages."], "kv-cache", {"kv_cache_gib": 3.25}, id="vllm-0.32-cpu-kv-cache-sized-by-itself"),
    pytest.param([EC32 + "CPU KV cache size: 2,097,152 tokens, Maximum concurrency for 512 tokens per request: "
                         "4096.00x"], "kv-cache",
                 {"tokens": 2097152, "tokens_per_request": 512, "max_concurrency": 4096.0},
                 id="vllm-0.32-cpu-kv-cache-size-and-concurrency-on-one-line"),
    pytest.param([EC32 + "GPU KV cache size: 3,574,672 tokens, Maximum concurrency for 131,072 tokens per request: "
                         "48.77x"], "kv-cache",
                 {"tokens": 3574672, "tokens_per_request": 131072, "max_concurrency": 48.77},
                 id="vllm-0.32-gpu-kv-cache-size-and-concurrency-on-one-line"),
    pytest.param(["\x1b[32m[2026-11-30 14:00:13 TP0] Load weight begin. avail mem=106.52 GB\x1b[0m"], "loading",
                 {"avail_mem_gb": 106.52}, id="ansi-codes-ignored"),
    pytest.param([SG + "Load weight begin. avail mem=106.52 GB", SG + "Load weight end. elapsed=14"], "weights-loaded",
                 {}, id="partial-last-line-marks-the-phase-but-not-a-cut-number"),
    pytest.param(["Loading safetensors checkpoint shards:   0% Completed | 0/2\rLoading safetensors checkpoint "
                  "shards: 100% Completed | 2/2"], "loading", {}, id="carriage-return-progress-bar"),
    pytest.param(["nothing to see", "NCCL INFO Using network AWS Libfabric"], None, None, id="no-phase-yet"),
]


@pytest.mark.parametrize("lines, last, details", CASES)
def test_phase_rule(lines, last, details):
    report = parse_phases(lines)
    if last is None:
        assert report.last is None
        return
    assert report.last.name == last
    assert report.last.details == details


def test_repeated_per_rank_lines_keep_the_first_values():
    report = parse_phases([SG + "Load weight begin. avail mem=106.52 GB",
                           "[2026-11-30 14:00:13 TP1] Load weight begin. avail mem=99.00 GB"])
    assert [(p.name, p.line, p.details) for p in report.phases] == [("loading", 1, {"avail_mem_gb": 106.52})]


@pytest.mark.parametrize("name, engine, expected", [
    pytest.param("healthy-sglang-pp4/server-0.log", "sglang",
                 [("loading", 17), ("weights-loaded", 21), ("kv-cache", 22), ("graph-capture", 25), ("ready", 37)],
                 id="sglang-full-startup-in-order"),
    pytest.param("healthy-vllm/server-0.log", "vllm",
                 [("loading", 12), ("weights-loaded", 16), ("kv-cache", 22), ("graph-capture", 25), ("ready", 31)],
                 id="vllm-full-startup-in-order"),
    pytest.param(f"{REAL_CPU_LOG}/server-0.log", "vllm", REAL_CPU_PHASES, id="vllm-0.32-cpu-real-startup-in-order"),
    pytest.param("sglang-host-oom/server-0.log", "sglang", [("loading", 6)], id="sglang-stopped-in-weight-load"),
])
def test_real_logs(name, engine, expected):
    report = parse_phases((LOGS / name).read_text().splitlines())
    assert report.engine == engine
    assert [(p.name, p.line) for p in report.phases] == expected
    assert [p.name for p in report.phases] == [n for n in PHASE_ORDER if n in {p for p, _ in expected}]


def test_incremental_feed_matches_one_shot_and_reports_new_phases_once():
    text = (LOGS / "healthy-sglang-pp4" / "server-0.log").read_text()
    tracker = PhaseTracker()
    seen = []
    for start in range(0, len(text), 97):  # chunks that cut lines in the middle
        seen += [p.name for p in tracker.feed(text[start:start + 97])]
    tracker.flush()
    assert seen == list(PHASE_ORDER)
    assert tracker.report.to_dict() == parse_phases_text(text).to_dict()


def test_partial_line_waits_for_its_newline():
    tracker = PhaseTracker()
    assert tracker.feed(SG + "Load weight end. elapsed=1") == []
    new = tracker.feed("47.1 s, mem usage=29.22 GB.\n")
    assert [(p.name, p.details) for p in new] == [("weights-loaded", {"elapsed_s": 147.1, "mem_usage_gb": 29.22})]


def test_flush_counts_an_unterminated_last_line():
    tracker = PhaseTracker()
    tracker.feed("[x] The server is fired up and ready to roll!")
    assert tracker.last is None
    assert [p.name for p in tracker.flush()] == ["ready"]


def test_summary_and_dict_for_status_displays():
    report = parse_phases([SG + "KV Cache is allocated. #tokens: 412160, KV size: 26.91 GB"])
    assert report.last.summary() == "KV cache allocated (tokens=412160)"
    assert report.to_dict() == {
        "engine": "sglang", "last": "kv-cache", "ready": False,
        "phases": [{"name": "kv-cache", "label": "KV cache allocated", "line": 1, "engine": "sglang",
                    "details": {"tokens": 412160}}],
    }


@pytest.mark.parametrize("line, engine", [
    pytest.param("[2026-11-30 14:00:01] server_args=ServerArgs(model_path='x')", "sglang", id="sglang-server-args"),
    pytest.param("(APIServer pid=40211) INFO 11-30 09:12:03 [api_server.py:1896] vLLM API server version 0.28.0",
                 "vllm", id="vllm-api-server"),
    pytest.param("NCCL INFO Using network Socket", None, id="neither"),
])
def test_detect_engine(line, engine):
    assert detect_engine(line) == engine


def test_engine_given_explicitly_filters_rules():
    # told it is SGLang, uvicorn's startup line does not mean ready
    report = parse_phases(["INFO:     Application startup complete."], engine="sglang")
    assert report.last is None


def test_unknown_engine_is_refused():
    with pytest.raises(ValueError, match="unknown engine 'ollama'"):
        PhaseTracker("ollama")
