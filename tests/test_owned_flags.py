"""Flags the plan and the exposure check decide are refused in SERVER_EXTRA_ARGS (engines/owned.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from envlayers import keys
from envlayers.engines.choices import DATA, table
from envlayers.engines.owned import OWNED, refusals, resolve
from envlayers.jobscript import prepare

REPO = Path(__file__).resolve().parents[1]
PY = "/usr/bin/python3"


def options(engine: str) -> list[str]:
    return table(DATA / f"{engine}-choices.json")["options"]


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_every_owned_spelling_is_an_option_of_the_real_parser(engine):
    # the tables are generated from the engines' own parsers (docs/testing.md): a typo here would refuse nothing
    assert sorted(set(OWNED[engine]) - set(options(engine))) == []


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_every_owned_flag_names_launch_keys_that_exist(engine):
    names = {k.name for k in keys.KEYS}
    for flag, setter in OWNED[engine].items():
        named = re.findall(r"\b[A-Z][A-Z0-9_]{2,}\b", setter)
        assert named and set(named) <= names, (flag, setter)


@pytest.mark.parametrize("engine, word, option", [
    pytest.param("vllm", "--host", "--host", id="exact"),
    pytest.param("vllm", "--host=0.0.0.0", "--host", id="with-equals"),
    pytest.param("vllm", "--pipeline_parallel_size", "--pipeline-parallel-size", id="vllm-underscores"),
    pytest.param("vllm", "-pp", "-pp", id="short"),
    pytest.param("sglang", "--tp", "--tp-size", id="sglang-unique-prefix"),
    pytest.param("sglang", "--pp", None, id="sglang-ambiguous-prefix"),  # the engine refuses it itself
    pytest.param("sglang", "--tp_size", None, id="sglang-takes-no-underscores"),
    pytest.param("vllm", "0.0.0.0", None, id="a-value"),
    pytest.param("vllm", "--no-such-flag", None, id="unknown"),
])
def test_resolve_reads_a_flag_as_the_engines_parser_does(engine, word, option):
    assert resolve(word, engine, options(engine)) == option


@pytest.mark.parametrize("engine, extra, refused", [
    pytest.param("vllm", ["--host", "0.0.0.0"], ["--host"], id="host"),
    pytest.param("vllm", ["--enforce-eager", "--port=9000", "--dtype", "float32"], ["--port"], id="port-among-others"),
    pytest.param("vllm", ["-tp", "8", "--tensor_parallel_size", "8"], ["-tp", "--tensor_parallel_size"], id="tp-twice"),
    pytest.param("vllm", ["--api-key", "k"], ["--api-key"], id="api-key"),
    pytest.param("vllm", ["--headless"], ["--headless"], id="headless"),
    pytest.param("vllm", ["-dp", "2"], ["-dp"], id="data-parallel-short"),
    pytest.param("sglang", ["--tp", "2"], ["--tp"], id="sglang-tp-prefix"),
    pytest.param("sglang", ["--dist-init-addr", "n1:5000"], ["--dist-init-addr"], id="sglang-rendezvous"),
    pytest.param("sglang", ["--trust-remote-code", "--hf-overrides", '{"host": 1}'], [], id="nothing-owned"),
    pytest.param("vllm", ["--max-model-len", "512", "--dtype", "bfloat16"], [], id="engine-settings-are-fine"),
])
def test_owned_flags_are_refused_naming_the_key(engine, extra, refused):
    out = refusals(extra, engine, options(engine), "mine.env:3")
    assert [m.split(": ", 1)[1].split(" ", 1)[0] for m in out] == refused
    for m in out:
        assert m.startswith("SERVER_EXTRA_ARGS (mine.env:3): ") and " is decided by " in m and "instead" in m


@pytest.fixture
def edf_dir(tmp_path):
    edf = tmp_path / "edf"
    edf.mkdir()
    for name in ("hpcagent-bench-sglang-mi300-latest-intranode", "hpcagent-bench-sglang-mi300-latest-internode",
                 "hpcagent-bench-vllm-mi300-latest-intranode", "hpcagent-bench-vllm-mi300-latest-internode"):
        (edf / f"{name}.toml").write_text("")
    return {"HOME": str(tmp_path), "PWD": str(tmp_path), "EDF_PATH": str(edf), "CHECK_WEIGHTS": "0"}


@pytest.mark.parametrize("model, layer, needle", [
    # keyless on loopback, then --host 0.0.0.0: a keyless server on every interface, which the exposure check refuses
    pytest.param("qwen38", "SERVER_HOST=127.0.0.1\nSERVER_API_KEY_FILE=\nSERVER_EXTRA_ARGS='--host 0.0.0.0'\n",
                 "SERVER_EXTRA_ARGS ({env}:3): --host is decided by SERVER_HOST", id="host-undoes-the-exposure-check"),
    # two nodes planned as pp=2; vLLM would run pp=1 and leave a node idle
    pytest.param("oss120b", "INFERENCE_NODES=2\nSERVER_EXTRA_ARGS='--pipeline-parallel-size 1'\n",
                 "SERVER_EXTRA_ARGS ({env}:2): --pipeline-parallel-size is decided by PIPELINE_PARALLEL_SIZE",
                 id="pp-undoes-the-plan"),
    pytest.param("glm53", "SERVER_EXTRA_ARGS='--tp-size 8'\n",
                 "SERVER_EXTRA_ARGS ({env}:1): --tp-size is decided by TENSOR_PARALLEL_SIZE", id="sglang-tp"),
])
def test_the_dry_run_refuses_an_override_of_the_plan(tmp_path, edf_dir, model, layer, needle):
    mine = tmp_path / "mine.env"
    mine.write_text(layer)
    job = prepare(REPO, model, env_file=mine, python=PY, environ=edf_dir)
    assert [b for b in job.blockers if b.startswith("SERVER_EXTRA_ARGS")][0].startswith(needle.format(env=mine))
