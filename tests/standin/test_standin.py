"""The test-only stand-in engine, exercised as the launcher will use it: real processes started
through the real entry points (``vllm serve``, ``python3 -m sglang.launch_server``), real HTTP on
127.0.0.1 with a free port."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from nettools import free_port
from timing import LATE_S  # how late a busy machine may run an event

STANDIN = Path(__file__).resolve().parent
VLLM = STANDIN / "bin" / "vllm"
PYPATH = STANDIN / "pypath"
LOAD = "0.2"

SGLANG_ORDER = [
    "server_args=ServerArgs(",
    "Load weight begin. avail mem=",
    "Load weight end. elapsed=",
    "KV Cache is allocated. #tokens: ",
    "Capture cuda graph begin.",
    "Capture cuda graph end.",
    "max_total_num_tokens=",
    "Uvicorn running on http://127.0.0.1:",
    "The server is fired up and ready to roll!",
]
VLLM_ORDER = [
    "vLLM API server version",
    "non-default args:",
    "Starting to load model",
    "Loading safetensors checkpoint shards",
    "Loading weights took",
    "Model loading took",
    "Available KV cache memory:",
    "GPU KV cache size:",
    "Capturing CUDA graphs",
    "Graph capturing finished",
    "Starting vLLM API server 0 on http://127.0.0.1:",
    "Application startup complete.",
]


class Engine:
    """One stand-in process; stdout and stderr go to one file, as a launcher's server-<rank>.log."""

    def __init__(self, tmp_path: Path, kind: str, args: list[str], env: dict | None = None, port: int | None = None):
        self.port = port or free_port()
        self.log = tmp_path / f"{kind}-{self.port}-{time.monotonic_ns()}.log"
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("STANDIN_")}
        full_env.update({"STANDIN_LOAD_SECONDS": LOAD, "PYTHONPATH": str(PYPATH)})
        full_env.update(env or {})
        if kind == "vllm":
            cmd = [str(VLLM), "serve", *args]
        else:
            cmd = [sys.executable, "-m", "sglang.launch_server", *args]
        self.fh = open(self.log, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.fh, stderr=subprocess.STDOUT, env=full_env, cwd=tmp_path)

    def text(self) -> str:
        return self.log.read_text()

    def wait_for(self, needle: str, timeout: float = 10.0 + LATE_S) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.text()
            if needle in text:
                return text
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        raise AssertionError(f"{needle!r} not seen (rc={self.proc.poll()}); log:\n{self.text()}")

    def wait_exit(self, timeout: float = 10.0 + LATE_S) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=5)
        self.fh.close()


@pytest.fixture
def engines(tmp_path):
    started: list[Engine] = []

    def start(kind: str, args: list[str], env: dict | None = None, port: int | None = None) -> Engine:
        e = Engine(tmp_path, kind, args, env, port)
        started.append(e)
        return e

    yield start
    for e in started:
        e.stop()


def http(port: int, path: str, body=None, key: str | None = None, raw: bytes | None = None, timeout=5.0):
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method="POST" if data else "GET")
    req.add_header("Content-Type", "application/json")
    if key is not None:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            payload = resp.read()
            return resp.status, payload
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def refused(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        try:
            s.connect(("127.0.0.1", port))
        except ConnectionRefusedError:
            return True
        return False


def assert_in_order(text: str, needles: list[str]) -> None:
    pos = 0
    for needle in needles:
        found = text.find(needle, pos)
        assert found >= 0, f"{needle!r} missing or out of order after offset {pos}; log:\n{text}"
        pos = found + len(needle)


def sglang_args(port: int, *extra: str) -> list[str]:
    return ["--model-path", "Qwen/Qwen3.8-27B-FP8", "--served-model-name", "hpcagent-bench-vllm", "--tp-size", "4",
            "--pp-size", "1", "--host", "127.0.0.1", "--port", str(port), "--mem-fraction-static", "0.8",
            "--attention-backend", "aiter", *extra]


def vllm_args(port: int, *extra: str) -> list[str]:
    return ["openai/gpt-oss-120b", "--served-model-name", "hpcagent-bench-vllm", "--tensor-parallel-size", "4",
            "--pipeline-parallel-size", "1", "--host", "127.0.0.1", "--port", str(port), *extra]


def chat(port: int, model: str = "hpcagent-bench-vllm", key: str | None = None):
    return http(port, "/v1/chat/completions", {"model": model, "max_tokens": 128,
                                               "messages": [{"role": "user", "content": "Say hi."}]}, key=key)


# --- startup lines and serving -----------------------------------------------------------------

def test_sglang_prints_real_startup_lines_in_order_then_serves(engines):
    port = free_port()
    e = engines("sglang", sglang_args(port, "--enable-metrics"), port=port)
    text = e.wait_for("The server is fired up")
    assert_in_order(text, SGLANG_ORDER)
    assert "Mamba Cache is allocated. max_mamba_cache_size:" in text  # Qwen3.8 is a hybrid model
    assert "[" in text.split("Load weight begin")[0].splitlines()[-1]  # "[date time TP0] " prefix
    status, body = chat(port)
    assert status == 200
    reply = json.loads(body)
    assert reply["object"] == "chat.completion" and reply["model"] == "hpcagent-bench-vllm"
    # Qwen3.8 thinks; without --reasoning-parser its thinking stays inline in the content
    content = reply["choices"][0]["message"]["content"]
    assert content.startswith("<think>\n") and content.endswith("</think>\n\nHello! You said: Say hi.")
    assert reply["usage"]["total_tokens"] == reply["usage"]["prompt_tokens"] + reply["usage"]["completion_tokens"]
    status, body = http(port, "/v1/models")
    assert status == 200 and [m["id"] for m in json.loads(body)["data"]] == ["hpcagent-bench-vllm"]
    status, body = http(port, "/metrics")
    assert status == 200 and b"sglang:prompt_tokens_total" in body


def test_vllm_prints_real_startup_lines_in_order_then_serves(engines):
    port = free_port()
    e = engines("vllm", vllm_args(port), port=port)
    text = e.wait_for("Application startup complete.")
    assert_in_order(text, VLLM_ORDER)
    assert "(APIServer pid=" in text and "(Worker_TP3 pid=" in text
    status, body = chat(port)
    assert status == 200 and json.loads(body)["model"] == "hpcagent-bench-vllm"
    status, body = http(port, "/v1/completions", {"model": "hpcagent-bench-vllm", "prompt": "one two", "max_tokens": 2})
    reply = json.loads(body)
    assert status == 200 and reply["object"] == "text_completion"
    assert reply["choices"][0]["finish_reason"] == "length" and reply["usage"]["completion_tokens"] == 2


def test_sglang_metrics_need_enable_metrics_like_the_real_engine(engines):
    port = free_port()
    e = engines("sglang", sglang_args(port), port=port)
    e.wait_for("fired up")
    assert http(port, "/metrics")[0] == 404


def test_streaming_chat_sends_sse_chunks_and_done(engines):
    port = free_port()
    e = engines("vllm", vllm_args(port), env={"STANDIN_REASONING": "0"}, port=port)  # no inline <think>
    e.wait_for("Application startup complete.")
    status, body = http(port, "/v1/chat/completions", {"model": "hpcagent-bench-vllm", "stream": True,
                                                       "messages": [{"role": "user", "content": "a b"}]})
    events = [line[6:] for line in body.decode().splitlines() if line.startswith("data: ")]
    assert status == 200 and events[-1] == "[DONE]"
    text = "".join(json.loads(ev)["choices"][0]["delta"].get("content", "") for ev in events[:-1])
    assert text == "Hello! You said: a b"


def test_port_refuses_connections_until_loaded_then_answers(engines):
    port = free_port()
    e = engines("vllm", vllm_args(port), env={"STANDIN_LOAD_SECONDS": "2"}, port=port)
    e.wait_for("Starting to load model")
    was_refused = refused(port)
    text_after = e.text()
    # the port listens only after this line is written, so a refusal before it is the behaviour under test
    assert was_refused or "Starting vLLM API server" in text_after
    assert was_refused, "port accepted a connection while the model was still loading"
    e.wait_for("Application startup complete.")
    assert http(port, "/v1/models")[0] == 200
    assert http(port, "/health")[0] == 200


# --- API key, errors -------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_api_key_is_enforced_like_the_real_engine(engines, kind):
    port = free_port()
    args = (vllm_args if kind == "vllm" else sglang_args)(port, "--api-key", "s3cret")
    if kind == "sglang":
        args.append("--enable-metrics")
    e = engines(kind, args, port=port)
    e.wait_for("Application startup complete." if kind == "vllm" else "fired up")
    assert http(port, "/v1/models")[0] == 401
    assert http(port, "/v1/models", key="wrong")[0] == 401
    assert chat(port)[0] == 401
    assert http(port, "/v1/models", key="s3cret")[0] == 200
    assert chat(port, key="s3cret")[0] == 200
    assert http(port, "/health")[0] == 200
    assert http(port, "/metrics")[0] == 200
    # outside /v1 the engines differ: vLLM leaves it open, SGLang guards all but /health* and /metrics
    assert http(port, "/version")[0] == (200 if kind == "vllm" else 401)


def test_wrong_model_is_404_and_bad_json_is_400_with_openai_error_bodies(engines):
    port = free_port()
    e = engines("vllm", vllm_args(port, "--max-model-len", "64"), port=port)
    e.wait_for("Application startup complete.")
    status, body = chat(port, model="Qwen/Qwen3.8-27B-FP8")
    assert status == 404
    err = json.loads(body)["error"]
    assert err["type"] == "NotFoundError" and "Qwen/Qwen3.8-27B-FP8" in err["message"] and err["code"] == 404
    status, body = http(port, "/v1/chat/completions", raw=b"{not json")
    assert status == 400 and json.loads(body)["error"]["code"] == 400
    status, _ = http(port, "/v1/chat/completions", {"model": "hpcagent-bench-vllm"})
    assert status == 400  # no messages
    status, body = http(port, "/v1/completions", {"prompt": "w " * 60, "max_tokens": 10})
    assert status == 400 and b"maximum context length is 64 tokens" in body  # --max-model-len 64, a word a token
    # the server survives the errors: a valid request right after still works
    assert http(port, "/v1/chat/completions", {"model": "hpcagent-bench-vllm", "max_tokens": 8,
                                               "messages": [{"role": "user", "content": "hi"}]})[0] == 200


def test_keep_alive_connection_survives_rejected_posts(engines):
    import http.client

    port = free_port()
    e = engines("sglang", sglang_args(port, "--api-key", "k"), env={"STANDIN_REASONING": "0"}, port=port)
    e.wait_for("fired up")
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    body = json.dumps({"messages": [{"role": "user", "content": "x"}]})
    conn.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 401 and json.loads(resp.read()) == {"error": "Unauthorized"}
    conn.request("POST", "/v1/chat/completions", body=body, headers={"Authorization": "Bearer k"})
    resp = conn.getresponse()
    assert resp.status == 200 and json.loads(resp.read())["choices"][0]["message"]["content"] == "Hello! You said: x"
    conn.close()


def test_vllm_auto_tool_choice_without_parser_is_a_400_like_the_real_engine(engines):
    port = free_port()
    e = engines("vllm", vllm_args(port), port=port)
    e.wait_for("Application startup complete.")
    tools = [{"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}]
    status, body = http(port, "/v1/chat/completions", {"model": "hpcagent-bench-vllm", "tools": tools,
                                                       "messages": [{"role": "user", "content": "list"}]})
    assert status == 400 and b"--enable-auto-tool-choice" in body


# --- command-line rejection ------------------------------------------------------------------------

@pytest.mark.parametrize("kind,args,expected", [
    pytest.param("vllm", ["m", "--enable-metrics"], "unrecognized arguments: --enable-metrics", id="vllm-sglang-flag"),
    pytest.param("vllm", ["m", "--context-length", "8"], "unrecognized arguments: --context-length",
                 id="vllm-context-length"),
    pytest.param("sglang", ["--model-path", "m", "--bogus-flag"], "unrecognized arguments: --bogus-flag",
                 id="sglang-unknown"),
    pytest.param("sglang", ["--model-path", "m", "--pp", "4"], "ambiguous option: --pp", id="sglang-pp-not-pp-size"),
    pytest.param("sglang", ["--model-path", "m", "--gpu-memory-utilization", "0.9"],
                 "unrecognized arguments: --gpu-memory-utilization", id="sglang-vllm-flag"),
    pytest.param("sglang", ["--tp-size", "4"], "the following arguments are required: --model-path",
                 id="sglang-no-model"),
    pytest.param("sglang", ["--model-path", "m", "--attention-backend", "ROCM_AITER_FA"], "invalid choice",
                 id="sglang-vllm-backend-name"),
])
def test_unknown_or_wrong_flag_exits_2_with_an_argparse_error(engines, kind, args, expected):
    e = engines(kind, args)
    assert e.wait_exit() == 2
    assert expected in e.text()
    assert ("vllm serve: error:" if kind == "vllm" else "launch_server.py: error:") in e.text()


def test_vllm_cli_rejects_other_subcommands(tmp_path):
    res = subprocess.run([str(VLLM), "chat"], capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 2 and "only 'serve'" in res.stderr
    res = subprocess.run([str(VLLM), "sere", "m"], capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 2 and "invalid choice: 'sere'" in res.stderr


def test_vllm_headless_rejects_api_server_count(engines):
    e = engines("vllm", ["m", "--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1", "--headless",
                         "--api-server-count", "2"])
    assert e.wait_exit() != 0
    assert "--api-server-count" in e.text()


# --- failure knobs ------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_crash_at_weights_exits_with_the_configured_code_and_a_traceback(engines, kind):
    port = free_port()
    args = (vllm_args if kind == "vllm" else sglang_args)(port)
    e = engines(kind, args, env={"STANDIN_CRASH_AT": "weights", "STANDIN_EXIT_CODE": "7"}, port=port)
    assert e.wait_exit() == 7
    text = e.text()
    assert "Traceback (most recent call last):" in text
    assert "injected crash at phase 'weights'" in text
    if kind == "sglang":
        assert "Load weight begin" in text and "Load weight end" not in text
        assert "Scheduler hit an exception" in text
    else:
        assert "Starting to load model" in text and "Loading weights took" not in text
        assert "EngineCore failed to start." in text and "Engine core initialization failed" in text


def test_crash_signal_dies_by_signal_without_traceback(engines):
    port = free_port()
    e = engines("sglang", sglang_args(port), env={"STANDIN_CRASH_AT": "weights", "STANDIN_CRASH_SIGNAL": "KILL"},
                port=port)
    assert e.wait_exit() == -signal.SIGKILL
    text = e.text()
    assert text.rstrip().endswith("avail mem=116.20 GB") and "Traceback" not in text


def test_hang_never_listens_and_still_stops_on_sigterm(engines):
    port = free_port()
    e = engines("vllm", vllm_args(port), env={"STANDIN_HANG_AT": "kv"}, port=port)
    e.wait_for("Available KV cache memory")
    time.sleep(0.5)
    assert e.proc.poll() is None
    assert refused(port)
    assert "GPU KV cache size" not in e.text()
    t0 = time.monotonic()
    e.proc.send_signal(signal.SIGTERM)
    assert e.wait_exit(timeout=LATE_S) == 0  # it hangs at kv for ever: only the SIGTERM ends it


def test_crash_after_ready_serves_then_dies_with_the_code(engines):
    port = free_port()
    e = engines("sglang", sglang_args(port), env={"STANDIN_CRASH_AFTER_READY_SECONDS": "0.4",
                                                  "STANDIN_EXIT_CODE": "3"}, port=port)
    e.wait_for("fired up")
    assert chat(port)[0] == 200
    assert e.wait_exit() == 3
    assert "Scheduler hit an exception" in e.text()


def test_a_dead_engine_core_is_reported_at_once_answers_500_and_exits_later_like_vllm(engines):
    from envlayers.engines.logsigns import core_died

    port = free_port()
    e = engines("vllm", vllm_args(port), env={"STANDIN_CORE_DIES_AFTER_READY_SECONDS": "0.3",
                                              "STANDIN_CORE_DEATH_EXIT_SECONDS": "1", "STANDIN_EXIT_CODE": "4",
                                              "STANDIN_VLLM_LOG": "0.32-cpu"}, port=port)
    e.wait_for("Application startup complete.")
    assert chat(port)[0] == 200
    text = e.wait_for("MPClient: engine core exited unexpectedly")
    said = next(line for line in text.splitlines() if "MPClient" in line)
    assert core_died("vllm", said)  # the launcher's own matcher takes the stand-in's line
    assert said.startswith("(APIServer pid=") and "[shutdown] MPClient: engine core exited unexpectedly; " \
        "starting cleanup" in said
    status, body = chat(port)
    assert status == 500 and json.loads(body)["error"]["type"] == "EngineDeadError"
    assert e.proc.poll() is None  # the server lingers after the line, as vLLM's does
    assert e.wait_exit() == 4


def test_inject_adds_lines_at_the_phase(engines):
    port = free_port()
    e = engines("sglang", sglang_args(port), env={"STANDIN_INJECT_AT": "init",
                                                  "STANDIN_INJECT": "NCCL WARN one\\nNCCL WARN two"}, port=port)
    text = e.wait_for("fired up")
    assert_in_order(text, ["Init torch distributed begin.", "NCCL WARN one", "NCCL WARN two", "Load weight begin"])


def test_forced_nccl_net_without_that_network_fails_at_init(engines):
    port = free_port()
    env = {"NCCL_NET": "AWS Libfabric", "STANDIN_NCCL_NETWORKS": "Socket"}
    e = engines("sglang", sglang_args(port), env=env, port=port)
    assert e.wait_exit() == 1
    assert_in_order(e.text(), ["Init torch distributed begin.", "NCCL WARN Error: network AWS Libfabric not found.",
                               "Failed to initialize any NET plugin"])
    assert "Load weight begin" not in e.text()
    single_gpu = sglang_args(port)
    single_gpu[single_gpu.index("--tp-size") + 1] = "1"
    ok = engines("sglang", single_gpu, env=env, port=port)
    ok.wait_for("fired up")  # one GPU: no NCCL communicator, nothing to fail


def test_nccl_debug_prints_the_network_in_use(engines):
    port = free_port()
    e = engines("vllm", vllm_args(port), env={"NCCL_DEBUG": "INFO", "NCCL_NET": "aws libfabric"}, port=port)
    text = e.wait_for("Application startup complete.")
    assert "NCCL INFO Using network AWS Libfabric" in text


def test_bad_knob_is_a_loud_error(engines):
    e = engines("vllm", ["m"], env={"STANDIN_CRASH_AT": "weigths"})
    assert e.wait_exit() == 2
    assert "STANDIN_CRASH_AT" in e.text() and "unknown phase" in e.text()


# --- multi-node -------------------------------------------------------------------------------

def test_sglang_rank_above_zero_never_binds_and_ranks_filter_the_knobs(engines):
    port = free_port()
    args = sglang_args(port, "--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "127.0.0.1:29500")
    args[args.index("--pp-size") + 1] = "2"  # the pipeline shape: one stage per node, tp inside it
    e = engines("sglang", args, env={"STANDIN_CRASH_AT": "weights", "STANDIN_RANKS": "0"}, port=port)
    text = e.wait_for("max_total_num_tokens=")
    time.sleep(0.3)
    assert e.proc.poll() is None, "rank 1 must stay alive after its startup lines"
    assert refused(port)
    assert "[standin]" not in text and "Uvicorn running" not in text and "fired up" not in e.text()
    assert "PP1 TP3] Load weight end" in text and "PP0 TP" not in text


def test_vllm_headless_never_binds_and_exits_zero_on_sigterm(engines):
    port = free_port()
    args = vllm_args(port, "--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1", "--master-port",
                     "29501", "--headless")
    e = engines("vllm", args, port=port)
    e.wait_for("init engine (profile, create kv cache, warmup model) took")
    time.sleep(0.3)
    assert e.proc.poll() is None and refused(port)
    assert "Starting vLLM API server" not in e.text()
    t0 = time.monotonic()
    e.proc.send_signal(signal.SIGTERM)
    assert e.wait_exit(timeout=LATE_S) == 0  # headless, it waits for ever: only the SIGTERM ends it


def test_sigterm_exits_zero_fast_while_serving(engines):
    port = free_port()
    e = engines("sglang", sglang_args(port), port=port)
    e.wait_for("fired up")
    t0 = time.monotonic()
    e.proc.send_signal(signal.SIGTERM)
    assert e.wait_exit(timeout=LATE_S) == 0  # serving, it runs for ever: only the SIGTERM ends it
    assert refused(port)


# --- record and entry points ----------------------------------------------------------------------

def test_record_captures_argv_and_environment(engines, tmp_path):
    port = free_port()
    record = tmp_path / "record.jsonl"
    args = vllm_args(port, "--api-key", "k")
    e = engines("vllm", args, env={"STANDIN_RECORD": str(record), "NCCL_NET_GDR_LEVEL": "LOC", "SLURM_PROCID": "0"},
                port=port)
    e.wait_for("Application startup complete.")
    bad = engines("vllm", ["m", "--no-such-flag"], env={"STANDIN_RECORD": str(record)})
    assert bad.wait_exit() == 2
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    assert len(lines) == 2
    first, second = lines
    assert first["engine"] == "vllm" and first["entry"] == ["vllm", "serve"] and first["argv"] == args
    assert first["env"]["NCCL_NET_GDR_LEVEL"] == "LOC" and first["rank"] == 0 and first["rejected"] is False
    assert first["rlimit_core"] is not None and first["cpus"] >= 1
    assert first["orig_argv"][-len(args):] == args
    assert second["argv"] == ["m", "--no-such-flag"] and second["rejected"] is True


def test_activate_sh_puts_both_entry_points_first_from_any_directory(tmp_path):
    script = (f". {STANDIN / 'activate.sh'}; . {STANDIN / 'activate.sh'}; cd /; "
              "command -v vllm; vllm --version; "
              "python3 -m sglang.launch_server --model-path m --bogus; echo rc=$?; "
              "echo \"$PATH\" | tr ':' '\\n' | grep -c standin/bin")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path)
    lines = res.stdout.split()
    assert lines[0] == str(VLLM.resolve())
    assert lines[1] == "0.28.0"
    assert "rc=2" in res.stdout and "launch_server.py: error: unrecognized arguments: --bogus" in res.stderr
    assert lines[-1] == "1"  # sourcing twice does not add it twice


# --- the catalog's command lines, as the launcher renders them (SUBMIT=0 dry run, Dec 2026) ----------

CATALOG = {
    "qwen38": ("sglang", "--model-path Qwen/Qwen3.8-27B-FP8 --served-model-name hpcagent-bench-vllm --tp-size 4 "
                         "--pp-size 1 --host 127.0.0.1 --port {port} --mem-fraction-static 0.80 --attention-backend "
                         "aiter --enable-metrics --reasoning-parser qwen3 --tool-call-parser qwen25"),
    "kimi27sglang-rank0": ("sglang", "--model-path moonshotai/Kimi-K2.7-Code --served-model-name hpcagent-bench-vllm "
                                     "--tp-size 4 --pp-size 4 --nnodes 4 --node-rank 0 --dist-init-addr 127.0.0.1:29500 "
                                     "--host 127.0.0.1 --port {port} --mem-fraction-static 0.85 --attention-backend "
                                     "aiter --enable-metrics --reasoning-parser kimi_k2 --tool-call-parser kimi_k2 --trust-remote-code"),
    "glm53-rank3": ("sglang", "--model-path zai-org/GLM-5.3 --served-model-name hpcagent-bench-vllm --tp-size 4 "
                              "--pp-size 4 --nnodes 4 --node-rank 3 --dist-init-addr 127.0.0.1:29500 --host 127.0.0.1 "
                              "--port {port} --mem-fraction-static 0.85 --enable-metrics --reasoning-parser glm45 --tool-call-parser glm45"),
    "oss120b": ("vllm", "openai/gpt-oss-120b --served-model-name hpcagent-bench-vllm --tensor-parallel-size 4 "
                        "--pipeline-parallel-size 1 --host 127.0.0.1 --port {port} --gpu-memory-utilization 0.90 "
                        "--reasoning-parser openai_gptoss --tool-call-parser openai --enable-auto-tool-choice"),
    "vllm-pipeline-rank1": ("vllm", "openai/gpt-oss-120b --served-model-name hpcagent-bench-vllm --tensor-parallel-size 4 "
                                    "--pipeline-parallel-size 2 --nnodes 2 --node-rank 1 --master-addr 127.0.0.1 "
                                    "--master-port 29500 --headless --host 127.0.0.1 --port {port}"),
}


@pytest.mark.parametrize("name", list(CATALOG))
def test_catalog_command_lines_are_accepted_and_only_rank_0_serves(engines, name):
    kind, template = CATALOG[name]
    port = free_port()
    e = engines(kind, template.format(port=port).split(), port=port)
    serves = "rank" not in name or name.endswith("rank0")
    if serves:
        e.wait_for("fired up" if kind == "sglang" else "Application startup complete.")
        status, body = chat(port)
        assert status == 200 and json.loads(body)["model"] == "hpcagent-bench-vllm"
    else:
        e.wait_for("max_total_num_tokens=" if kind == "sglang" else "init engine (profile")
        time.sleep(0.2)
        assert e.proc.poll() is None and refused(port)


def test_vllm_on_the_ray_executor_without_a_cluster_address_fails_loudly(engines, tmp_path):
    # without RAY_ADDRESS the real vLLM would start a private one-node Ray instead of the job's cluster
    record = tmp_path / "rec.jsonl"
    e = engines("vllm", vllm_args(free_port(), "--distributed-executor-backend", "ray"),
                env={"RAY_ADDRESS": "", "STANDIN_RECORD": str(record)})
    assert e.wait_exit() == 1
    assert "without RAY_ADDRESS: vLLM would start a private one-node Ray instance" in e.text()
    assert "Starting vLLM API server" not in e.text()
    assert "RAY_ADDRESS" in json.loads(record.read_text())["ray"]["error"]


def test_max_running_queues_requests_and_the_metrics_show_the_wait(engines):
    import threading

    port = free_port()
    e = engines("vllm", vllm_args(port), env={"STANDIN_MAX_RUNNING": "1", "STANDIN_REQUEST_S": "0.6"}, port=port)
    e.wait_for("Application startup complete.")
    body = {"model": "hpcagent-bench-vllm", "prompt": "one", "max_tokens": 1}
    answers: list[int] = []
    clients = [threading.Thread(target=lambda: answers.append(http(port, "/v1/completions", body)[0]))
               for _ in range(3)]
    for c in clients:
        c.start()
    deadline = time.monotonic() + 5
    waiting = 0.0
    while time.monotonic() < deadline and waiting < 1:
        text = http(port, "/metrics")[1].decode()
        waiting = float(next(line.rsplit(None, 1)[1] for line in text.splitlines()
                             if line.startswith("vllm:num_requests_waiting")))
    assert waiting >= 1, "requests above STANDIN_MAX_RUNNING wait"
    for c in clients:
        c.join(10)
    assert answers == [200, 200, 200]
    text = http(port, "/metrics")[1].decode()
    values = {line.split("{")[0]: float(line.rsplit(None, 1)[1]) for line in text.splitlines()
              if line and not line.startswith("#")}
    assert values["vllm:request_queue_time_seconds_count"] == 3
    assert values["vllm:request_queue_time_seconds_sum"] >= 0.6 + 1.2 - 0.3  # the 2nd waited ~0.6 s, the 3rd ~1.2 s
    assert values["vllm:num_requests_waiting"] == 0
