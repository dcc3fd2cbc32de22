"""The engines' own choices on the login node (engines/choices.py): a value vLLM or SGLang would refuse
for a flag with fixed choices is a blocker naming its layer line, before any allocation is spent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from envlayers.engines.choices import TABLE, check, flag_values, messages, table

REPO = Path(__file__).resolve().parents[1]
DATA = {"engine": "vllm", "version": "9.9.9", "choices": {"--tool-call-parser": ["hermes", "openai"],
                                        "--reasoning-parser": ["qwen3"],
                                        "--distributed-executor-backend": ["mp", "ray"]},
        "options": ["--tool-call-parser", "--reasoning-parser", "--distributed-executor-backend", "--port",
                    "--enforce-eager", "--served-model-name"]}


def test_flag_values_reads_both_spellings_and_bare_flags():
    assert flag_values(["vllm", "serve", "m", "--port", "1", "--tool-call-parser=hermes", "--enforce-eager"]) == [
        ("--port", "1"), ("--tool-call-parser", "hermes"), ("--enforce-eager", None)]


@pytest.mark.parametrize("argv, refused", [
    pytest.param(["--tool-call-parser", "hermes", "--reasoning-parser", "qwen3"], [], id="valid"),
    pytest.param(["--tool-call-parser", "qwen25"], [("--tool-call-parser", "qwen25", ["hermes", "openai"])],
                 id="sglangs-name"),
    pytest.param(["--distributed-executor-backend=nope"], [("--distributed-executor-backend", "nope", ["mp", "ray"])],
                 id="equals-form"),
    pytest.param(["--distributed-executor-backend", "my.pkg.Executor"], [], id="an-executor-class-path"),
])
def test_check_refuses_what_vllms_parser_would(argv, refused):
    assert check(argv, DATA)[0] == refused


def test_a_refusal_names_the_layer_line_and_the_valid_names():
    blockers, warnings = messages(["vllm", "serve", "m", "--tool-call-parser", "qwen25", "--enable-auto-tool-choice"],
                                  [], {"TOOL_CALL_PARSER": "experiments/layers/model-qwen38.env:9"}, DATA)
    assert blockers == ["TOOL_CALL_PARSER (experiments/layers/model-qwen38.env:9): vLLM refuses --tool-call-parser "
                        "'qwen25' (vLLM 9.9.9 takes: hermes, openai); the engine would refuse it as it starts, "
                        "after the allocation was granted"]
    assert warnings == []


def test_an_extra_flag_the_parser_lacks_is_a_warning_naming_server_extra_args():
    blockers, warnings = messages(["vllm", "serve", "m", "--no-such-flag"], ["--no-such-flag"],
                                  {"SERVER_EXTRA_ARGS": "mine.env:2"}, DATA)
    assert blockers == [] and warnings == [
        "vLLM 9.9.9's argument parser has no --no-such-flag (SERVER_EXTRA_ARGS (mine.env:2)); check the flag "
        "against the image's vLLM"]


def test_the_committed_table_names_its_engine_version_and_the_flags_with_choices():
    data = table()
    assert data["engine"] == "vllm" and data["version"].startswith("0.")
    assert {"--tool-call-parser", "--reasoning-parser", "--distributed-executor-backend"} <= set(data["choices"])
    assert "qwen25" not in data["choices"]["--tool-call-parser"] and "hermes" in data["choices"]["--tool-call-parser"]
    assert json.loads(TABLE.read_text()) == data


def dry_run(tmp_path: Path, layer: str, model: str = "qwen38") -> dict:
    (tmp_path / "mine.env").write_text(layer)
    env = {**os.environ, "SERVE_ENV_FILE": str(tmp_path / "mine.env"), "MODEL": model}
    env.pop("ENVLAYERS_ROOT", None)
    proc = subprocess.run([sys.executable, "-m", "envlayers", "--root", str(REPO), "serve", "--dry-run", "--json",
                           "--model", model, "--env-file", str(tmp_path / "mine.env")],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_sglangs_tool_call_parser_given_to_vllm_is_refused_before_submission(tmp_path):
    # qwen38 is an SGLang model whose layer sets TOOL_CALL_PARSER=qwen25: switched to vLLM (and its image) it
    # keeps it; the vLLM image pins 0.28.0, so the 0.28.0 table judges it
    data = dry_run(tmp_path, "INFERENCE_ENGINE=vllm\nCONTAINER_ROLE=vllm-mi300\n")
    refusal = [b for b in data["blockers"] if "--tool-call-parser 'qwen25'" in b]
    assert len(refusal) == 1 and refusal[0].startswith("TOOL_CALL_PARSER (experiments/layers/model-qwen38.env:")
    assert "hermes" in refusal[0] and "vLLM 0.28.0+cpu takes" in refusal[0]


def test_an_engine_switched_without_its_image_is_refused(tmp_path):
    data = dry_run(tmp_path, "INFERENCE_ENGINE=vllm\n")
    (said,) = [b for b in data["blockers"] if "CONTAINER_ROLE=sglang-mi300" in b]
    assert said.startswith("INFERENCE_ENGINE=vllm (") and said.endswith("set CONTAINER_ROLE=vllm-mi300 with it")


def test_every_vllm_catalog_line_passes_the_check(tmp_path):
    for model in ("oss120b", "oss20bdp", "llama405bray", "llama405bgateway", "qwen38mi200"):
        data = dry_run(tmp_path, "", model)
        assert not [b for b in data["blockers"] if "vLLM refuses" in b], (model, data["blockers"])


def test_the_committed_sglang_table_names_its_version_and_the_attention_backends():
    data = table(TABLE.parent / "sglang-choices.json")
    assert data["engine"] == "sglang" and data["version"].startswith("0.")
    assert "triton" in data["choices"]["--attention-backend"] and "qwen25" in data["choices"]["--tool-call-parser"]


def test_an_attention_backend_sglang_lacks_is_refused_naming_the_layer_line(tmp_path):
    data = dry_run(tmp_path, "SGLANG_ATTENTION_BACKEND=fast\n", "qwen38")
    refusal = [b for b in data["blockers"] if "--attention-backend 'fast'" in b]
    assert len(refusal) == 1 and refusal[0].startswith(f"SGLANG_ATTENTION_BACKEND ({tmp_path / 'mine.env'}:1): "
                                                       "SGLang refuses --attention-backend 'fast' (SGLang 0.")


def test_every_sglang_catalog_line_passes_the_check(tmp_path):
    for model in ("glm53", "kimi27sglang", "qwen38"):
        data = dry_run(tmp_path, "", model)
        assert not [b for b in data["blockers"] if "refuses" in b], (model, data["blockers"])


def test_the_table_of_the_release_the_image_pins_is_used_and_another_release_only_warns(tmp_path):
    from envlayers.engines.choices import for_image

    assert for_image("sglang", "lmsysorg/sglang-rocm:v0.5.20-rocm724-mi30x-20260919").name == "sglang-choices-0.5.20.json"
    assert for_image("sglang", "lmsysorg/sglang:v0.4.0-cu124").name == "sglang-choices.json"  # no table: the newest
    assert for_image("vllm", None).name == "vllm-choices.json"
    argv = ["vllm", "serve", "m", "--tool-call-parser", "qwen25", "--enable-auto-tool-choice"]
    where = {"TOOL_CALL_PARSER": "mine.env:1"}
    blockers, warnings = messages(argv, [], where, DATA, image="vllm/vllm-openai:v9.9.9")
    assert len(blockers) == 1 and warnings == []  # the image's release is the table's: refused
    blockers, warnings = messages(argv, [], where, DATA, image="vllm/vllm-openai:v0.27.0")
    assert blockers == [] and warnings == [
        "TOOL_CALL_PARSER (mine.env:1): vLLM refuses --tool-call-parser 'qwen25' (vLLM 9.9.9 takes: hermes, openai); "
        "the image runs vLLM 0.27.0 (vllm/vllm-openai:v0.27.0), whose list may differ: check it there"]
    _, warnings = messages(["vllm", "serve", "m", "--no-such"], ["--no-such"], {"SERVER_EXTRA_ARGS": "x:2"}, DATA,
                           image="vllm/vllm-openai:v0.27.0")
    assert warnings == ["vLLM 9.9.9's argument parser has no --no-such (SERVER_EXTRA_ARGS (x:2)); check the flag "
                        "against the image's vLLM, vLLM 0.27.0 (vllm/vllm-openai:v0.27.0)"]
