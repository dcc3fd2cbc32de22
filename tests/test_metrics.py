"""Metrics on every engine: SGLang gets --enable-metrics by default (SGLANG_ENABLE_METRICS turns it off),
the endpoint block shows the metrics URL, and the stand-in serves /metrics only when the real engine would."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from envlayers.cli import cli
from envlayers.errors import KeyValueError
from envlayers.engines import EngineError, build_rank_command
from envlayers.readiness import block
from envlayers.rundir import EndpointRecord
from envlayers.topology import plan
from standintools import OSS120B, QWEN38, standins

BASE = {
    "INFERENCE_ENGINE": "sglang", "INFERENCE_MODEL": "Qwen/Qwen3.8-27B-FP8", "VLLM_SERVED_MODEL": "served",
    "INFERENCE_NODES": "1", "GPUS_PER_NODE": "4", "TENSOR_PARALLEL_SIZE": "4", "PIPELINE_PARALLEL_SIZE": "1",
    "CONTAINER_ROLE": "sglang-mi300",
}


def argv(**overrides) -> tuple[str, ...]:
    env = dict(BASE)
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return build_rank_command(plan(env), env, 0, "m").argv


@pytest.mark.parametrize("value, on", [
    pytest.param(None, True, id="absent-is-on"),
    pytest.param("", False, id="empty-is-off"),
    pytest.param("false", False, id="false-is-off"),
    pytest.param("0", False, id="zero-is-off"),
    pytest.param("true", True, id="true-is-on"),
    pytest.param("1", True, id="one-is-on"),
])
def test_sglang_enable_metrics_follows_its_key(value, on):
    assert ("--enable-metrics" in argv(SGLANG_ENABLE_METRICS=value)) is on


def test_a_value_that_is_not_a_boolean_is_an_error_naming_the_key():
    with pytest.raises(KeyValueError) as err:
        argv(SGLANG_ENABLE_METRICS="maybe")
    assert str(err.value).startswith("SGLANG_ENABLE_METRICS: must be true or false (true/1/yes/on or false/0/no/off, "
                                     "any case), got 'maybe'") and "hint:" in str(err.value)


def test_vllm_never_gets_the_sglang_flag():
    a = argv(INFERENCE_ENGINE="vllm", CONTAINER_ROLE="vllm-mi300", SGLANG_ENABLE_METRICS="true")
    assert "--enable-metrics" not in a  # vLLM serves /metrics always, and rejects the flag


@pytest.mark.parametrize("model", ["qwen38", "kimi27sglang", "glm53"])
def test_the_sglang_catalog_models_render_with_enable_metrics_on_every_rank(model):
    result = CliRunner().invoke(cli, ["plan", "--model", model])
    assert result.exit_code == 0, result.output
    ranks = [line for line in result.stdout.splitlines() if line.startswith("rank ") and "sglang.launch_server" in line]
    assert ranks and all(" --enable-metrics " in line for line in ranks)


@pytest.mark.parametrize("metrics, shown", [
    pytest.param(None, "metrics: http://nid001:8000/metrics", id="engine-default"),
    pytest.param(True, "metrics: http://nid001:8000/metrics", id="on"),
    pytest.param(False, None, id="off"),
])
def test_endpoint_block_shows_the_metrics_url(metrics, shown):
    ep = EndpointRecord("7", "served", "m", "sglang", "single", ["http://nid001:8000/v1"], False, "/r", metrics=metrics)
    lines = block(ep).splitlines()
    assert lines[3] == shown if shown else not any(line.startswith("metrics:") for line in lines)


@pytest.mark.parametrize("kind, args, status", [
    pytest.param("vllm", OSS120B, 200, id="vllm-always"),
    pytest.param("sglang", QWEN38, 404, id="sglang-without-flag"),
    pytest.param("sglang", [*QWEN38, "--enable-metrics"], 200, id="sglang-with-flag"),
])
def test_the_standin_serves_metrics_only_when_the_real_engine_would(tmp_path, kind, args, status):
    import urllib.error
    import urllib.request

    with standins(tmp_path) as start:
        server = start(kind, args)
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as resp:
                got, body = resp.status, resp.read().decode()
        except urllib.error.HTTPError as err:
            got, body = err.code, ""
    assert got == status
    if status == 200:
        assert f"# TYPE {kind}:" in body
