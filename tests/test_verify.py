"""``env_layers verify`` against real stand-in engine processes on 127.0.0.1: every gate is seen to
pass and to fail for its reason, with the fix it names; plus the pure parts (scoring, data files)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from envlayers.cli import cli
from envlayers.verify import checks as gates
from envlayers.verify.client import Client
from envlayers.verify.data import Prompt, is_correct, load_baselines, load_prompts, strip_think
from envlayers.verify.target import Target, base_url_of
from nettools import free_port
from standintools import OSS120B, QWEN38, SERVED, standins
from timing import LATE_S  # how late a busy machine may run an event

REPO = Path(__file__).resolve().parents[1]
STANDIN = REPO / "tests" / "standin"


@pytest.fixture
def standin(tmp_path):
    with standins(tmp_path) as start:
        yield start


def verify(*args: str) -> tuple[int, dict]:
    result = CliRunner().invoke(cli, ["verify", *args, "--json", "--timeout-s", "20"])
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads(result.stdout)


def by_name(report: dict) -> dict[str, dict]:
    return {c["name"]: c for c in report["checks"]}


# --------------------------------------------------------------------------------- each gate, both ways

SG_ALL = [*QWEN38, "--reasoning-parser", "qwen3", "--tool-call-parser", "qwen25", "--enable-metrics"]
VL_ALL = [*OSS120B, "--reasoning-parser", "openai_gptoss", "--tool-call-parser", "openai", "--enable-auto-tool-choice"]


@pytest.mark.parametrize("kind, args, env, expected", [
    pytest.param("sglang", SG_ALL, {}, {"tools": "pass", "reasoning": "pass", "accuracy": "pass", "metrics": "pass"},
                 id="sglang-catalog-flags-all-pass"),
    pytest.param("vllm", VL_ALL, {}, {"tools": "pass", "reasoning": "pass", "accuracy": "pass", "metrics": "pass"},
                 id="vllm-catalog-flags-all-pass"),
    pytest.param("sglang", [*QWEN38, "--reasoning-parser", "qwen3"], {},
                 {"tools": "fail", "reasoning": "pass", "accuracy": "pass", "metrics": "fail"},
                 id="sglang-only-the-reasoning-parser-no-metrics"),
    pytest.param("sglang", [*QWEN38, "--tool-call-parser", "qwen25", "--enable-metrics"], {},
                 {"tools": "pass", "reasoning": "fail", "accuracy": "pass", "metrics": "pass"},
                 id="sglang-only-the-tool-parser"),
    pytest.param("vllm", [*OSS120B, "--reasoning-parser", "openai_gptoss"], {},
                 {"tools": "fail", "reasoning": "pass", "accuracy": "pass", "metrics": "pass"},
                 id="vllm-no-tool-flags-is-a-400"),
    pytest.param("vllm", [*OSS120B, "--reasoning-parser", "openai_gptoss", "--tool-call-parser", "openai"], {},
                 {"tools": "fail", "reasoning": "pass", "accuracy": "pass", "metrics": "pass"},
                 id="vllm-tool-parser-without-auto-tool-choice"),
    pytest.param("sglang", SG_ALL, {"STANDIN_WRONG_ANSWERS": "1"},
                 {"tools": "pass", "reasoning": "pass", "accuracy": "fail", "metrics": "pass"},
                 id="sglang-wrong-answers"),
    pytest.param("vllm", VL_ALL, {"STANDIN_WRONG_ANSWERS": "1"},
                 {"tools": "pass", "reasoning": "pass", "accuracy": "fail", "metrics": "pass"},
                 id="vllm-wrong-answers"),
    pytest.param("sglang", ["--model-path", "some/plain-model", "--tool-call-parser", "qwen25", "--enable-metrics"],
                 {}, {"tools": "pass", "reasoning": "skip", "accuracy": "pass", "metrics": "pass"},
                 id="not-a-reasoning-model-skips-reasoning"),
])
def test_each_gate_passes_or_fails_for_its_reason(standin, kind, args, env, expected):
    server = standin(kind, args, env)
    code, report = verify(server.url)
    assert {name: c["status"] for name, c in by_name(report).items()} == expected
    assert code == (1 if "fail" in expected.values() else 0)
    assert report["ok"] is (code == 0)


@pytest.mark.parametrize("kind, args, check, words", [
    pytest.param("sglang", [*QWEN38, "--reasoning-parser", "qwen3"], "tools",
                 ["came back as prose in content", "--tool-call-parser qwen25", "TOOL_CALL_PARSER"],
                 id="sglang-tools-names-tool-call-parser"),
    pytest.param("vllm", [*OSS120B, "--reasoning-parser", "openai_gptoss"], "tools",
                 ["refused a request with tools", "--enable-auto-tool-choice --tool-call-parser openai"],
                 id="vllm-tools-names-both-flags"),
    pytest.param("sglang", [*QWEN38, "--tool-call-parser", "qwen25"], "reasoning",
                 ["inline in content", "--reasoning-parser qwen3", "REASONING_PARSER"],
                 id="reasoning-names-reasoning-parser"),
    pytest.param("sglang", [*QWEN38], "metrics", ["HTTP 404", "--enable-metrics", "SGLANG_ENABLE_METRICS"],
                 id="sglang-metrics-names-enable-metrics"),
])
def test_a_failure_names_the_missing_flag(standin, kind, args, check, words):
    server = standin(kind, args)
    _, report = verify(server.url, "--check", check)
    [c] = report["checks"]
    text = " ".join([c["summary"], c["hint"] or "", *c["evidence"]])
    assert c["status"] == "fail" and all(w in text for w in words), text


def test_wrong_answers_fail_accuracy_and_point_at_the_fabric_knob(standin):
    server = standin("sglang", SG_ALL, {"STANDIN_WRONG_ANSWERS": "1"})
    _, report = verify(server.url, "--check", "accuracy")
    [c] = report["checks"]
    assert c["data"]["score"] == 0 and c["data"]["of"] == len(load_prompts())
    assert c["data"]["baseline"] == "qwen38"  # matched through the model /v1/models reports
    assert "NCCL_NET_GDR_LEVEL=LOC" in c["hint"] and "no error in any log" in c["hint"]
    assert "add: expected '843', got \"844\"" in c["evidence"]


def test_text_report_shows_evidence_and_fix_and_exits_1(standin):
    server = standin("sglang", [*QWEN38, "--tool-call-parser", "qwen25"])
    result = CliRunner().invoke(cli, ["verify", server.url, "--timeout-s", "20"])
    assert result.exit_code == 1
    out = result.stdout
    assert "PASS  tools" in out and "FAIL  reasoning" in out and "FAIL  metrics" in out
    assert "      fix: start the server with --reasoning-parser qwen3" in out
    assert out.rstrip().splitlines()[-1] == "verdict: FAILED (2 passed, 2 failed, 0 skipped)"


def test_key_from_file_is_used_and_never_printed(standin, tmp_path):
    secret = "sk-verify-7c1f0e"
    server = standin("sglang", [*SG_ALL, "--api-key", secret])
    keyfile = tmp_path / "key"
    keyfile.write_text(secret + "\n")
    for as_json in (True, False):
        result = CliRunner().invoke(cli, ["verify", server.url, "--api-key-file", str(keyfile), "--timeout-s", "20",
                                          *(["--json"] if as_json else [])])
        assert result.exit_code == 0, result.output
        assert secret not in result.output
    result = CliRunner().invoke(cli, ["verify", server.url])
    assert result.exit_code == 2 and "needs an API key" in result.stderr and "--api-key-file" in result.stderr


@pytest.mark.parametrize("args, message", [
    pytest.param(["--model", "other"], "not 'other'", id="served-name-not-listed"),
    pytest.param(["--api-key-file", "/nonexistent/key"], "--api-key-file /nonexistent/key: the key file does not exist",
                 id="key-file-missing"),
])
def test_could_not_run_is_exit_2_with_one_line(standin, args, message):
    server = standin("vllm", VL_ALL)
    result = CliRunner().invoke(cli, ["verify", server.url, *args])
    assert result.exit_code == 2 and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_nothing_listening_is_exit_2_from_a_real_process():
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    proc = subprocess.run([sys.executable, "-m", "envlayers", "verify", f"http://127.0.0.1:{port}"],
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 2 and "no answer from" in proc.stderr and proc.stdout == ""


def test_a_stalled_server_is_bounded_by_the_timeout():
    with socket.socket() as srv:  # accepts the connection, never answers
        srv.bind(("127.0.0.1", 0))
        srv.listen(8)
        client = Client(f"http://127.0.0.1:{srv.getsockname()[1]}/v1", timeout_s=1.0)
        started = time.monotonic()
        answer = client.post("/chat/completions", {"model": "x"})
        assert answer.status is None and time.monotonic() - started < 1.0 + LATE_S  # silent for ever


def test_catalog_entry_without_a_reasoning_parser_skips_without_a_request():
    client = Client(f"http://127.0.0.1:{free_port()}/v1", timeout_s=1.0)  # nothing listens: a request would fail
    target = Target("t", [client.base_url], served=SERVED, catalog_model="plain", reasoning_parser="")
    check = gates.check_reasoning(client, target)
    assert check.status == "skip" and "names no reasoning parser" in check.summary


def test_metrics_turned_off_by_the_job_is_a_skip():
    client = Client(f"http://127.0.0.1:{free_port()}/v1", timeout_s=1.0)
    target = Target("t", [client.base_url], served=SERVED, engine="sglang", metrics_off="false")
    assert gates.check_metrics(client, target).status == "skip"


# --------------------------------------------------------------------------------- pure parts

P_NUM = Prompt("p", "arithmetic", "?", "843", "number")
P_EXACT = Prompt("p", "string", "?", "SLURM NODE", "exact")
P_WORD = Prompt("p", "factual", "?", "Tokyo", "word")


@pytest.mark.parametrize("prompt, content, ok", [
    pytest.param(P_NUM, "843", True, id="number-bare"),
    pytest.param(P_NUM, "The answer is 843.", True, id="number-in-a-sentence"),
    pytest.param(P_NUM, "<think>487+356 is 843? no, 833</think>\n\n843", True, id="number-after-think"),
    pytest.param(P_NUM, "<think>so it is 843</think>844", False, id="number-think-not-counted"),
    pytest.param(P_NUM, "844", False, id="number-wrong"),
    pytest.param(P_NUM, "", False, id="number-empty"),
    pytest.param(P_EXACT, "SLURM NODE", True, id="exact"),
    pytest.param(P_EXACT, "`SLURM NODE`.", True, id="exact-trimmed"),
    pytest.param(P_EXACT, "slurm node", False, id="exact-is-case-sensitive"),
    pytest.param(P_WORD, "tokyo", True, id="word-ignores-case"),
    pytest.param(P_WORD, "Kyoto", False, id="word-wrong"),
    pytest.param(P_NUM, None, False, id="no-content"),
])
def test_scoring(prompt, content, ok):
    assert is_correct(prompt, content)[0] is ok


@pytest.mark.parametrize("text, expected", [
    pytest.param("<think>a</think>b", "b", id="closed"),
    pytest.param("a</think>\nb", "b", id="only-the-close"),
    pytest.param("<think>never closed", "", id="unclosed"),
    pytest.param("plain", "plain", id="none"),
])
def test_strip_think(text, expected):
    assert strip_think(text) == expected


def test_the_packaged_prompts_are_answered_right_by_the_standins_own_solver():
    """The stand-in works the answers out (it does not read the data file): the file's answers agree."""
    sys.path.insert(0, str(STANDIN))
    try:
        import engine
    finally:
        sys.path.remove(str(STANDIN))
    for p in load_prompts():
        assert engine.solve(p.prompt) == p.answer, p.id
        assert is_correct(p, engine.solve(p.prompt))[0] and not is_correct(p, engine.garble(p.answer))[0], p.id


def test_packaged_baselines_cover_every_catalog_model_and_say_how():
    from envlayers import catalog

    prompts = load_prompts()
    baselines = load_baselines(n_prompts=len(prompts))
    # every model: the setups.yaml entries and the layer files that are models by themselves
    assert set(baselines.models) == set(catalog.load(REPO).models)
    for b in baselines.models.values():
        assert 0 < b.min_correct <= len(prompts) and b.how.strip()
    assert baselines.lookup(None, "openai/gpt-oss-120b").name == "oss120b"
    assert baselines.lookup("qwen38", None).name == "qwen38"
    assert baselines.lookup(None, "someone/else").name == "default"


@pytest.mark.parametrize("spec, base", [
    pytest.param("http://h:8000", "http://h:8000/v1", id="root"),
    pytest.param("http://h:8000/", "http://h:8000/v1", id="root-slash"),
    pytest.param("http://h:8000/v1/", "http://h:8000/v1", id="v1-slash"),
    pytest.param("https://gw.example/llm/v1", "https://gw.example/llm/v1", id="path-v1"),
])
def test_base_url_of(spec, base):
    assert base_url_of(spec) == base


def test_metrics_on_a_port_of_their_own_are_read_there_not_at_the_root():
    # a router (ROUTER=smg) answers inference on its port and Prometheus text on the port above it:
    # endpoint.json's metrics_at names that URL, and the gate reads it instead of the root's /metrics (a 404)
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Metrics(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            body = b"# TYPE smg_router_requests_total counter\nsmg_router_requests_total 3\n"
            code = 200 if self.path == "/metrics" else 404
            self.send_response(code)
            self.send_header("Content-Length", str(len(body) if code == 200 else 0))
            self.end_headers()
            if code == 200:
                self.wfile.write(body)

        def log_message(self, *args):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        client = Client(f"http://127.0.0.1:{free_port()}/v1", timeout_s=2.0)  # the router's own port: nothing there
        url = f"http://127.0.0.1:{srv.server_address[1]}/metrics"
        check = gates.check_metrics(client, Target("t", [client.base_url], served=SERVED, engine="vllm",
                                                   metrics_url=url))
        assert (check.status, check.url) == ("pass", url) and "smg_router_requests_total" in check.evidence[0]
        assert gates.check_metrics(client, Target("t", [client.base_url], served=SERVED, engine="vllm")).status \
            == "fail"
    finally:
        srv.shutdown()
        srv.server_close()
