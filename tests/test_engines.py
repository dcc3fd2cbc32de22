"""Engine command builders: the real per-rank command lines for SGLang and vLLM."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from envlayers.engines import (
    EngineError,
    RankCommand,
    build_commands,
    build_rank_command,
    redact,
    shell_line,
)
from envlayers.errors import TopologyError
from envlayers.shell import word_with_refs
from envlayers.topology import plan

MASTER = "${ENVLAYERS_MASTER_ADDR}"
SERVED = "hpcagent-bench-vllm"

# The catalog's launch keys, mirroring experiments/renders/.env.experiment.<model> (copied, so a
# catalog change does not silently rewrite these expectations; test_every_catalog_render_builds
# checks the real renders).
COMMON = {
    "VLLM_SERVED_MODEL": SERVED,
    "SLURM_PARTITION": "mi300",
    "GPUS_PER_NODE": "4",
    "TENSOR_PARALLEL_SIZE": "4",
    "PIPELINE_PARALLEL_SIZE": "1",
    "INFERENCE_NODES": "1",
    "SERVER_HOST": "0.0.0.0",
    "SERVER_PORT": "8000",
    "RDZV_PORT": "29500",
    "CONTAINER_RUNTIME": "ce",
    "NCCL_NET_GDR_LEVEL": "LOC",
}
QWEN38 = {
    **COMMON,
    "INFERENCE_ENGINE": "sglang",
    "CONTAINER_ROLE": "sglang-mi300",
    "INFERENCE_MODEL": "Qwen/Qwen3.8-27B-FP8",
    "MEM_FRACTION_STATIC": "0.80",
    "REASONING_PARSER": "qwen3",
    "TOOL_CALL_PARSER": "qwen25",
}
GLM53 = {
    **COMMON,
    "PIPELINE_PARALLEL_SIZE": "4",
    "INFERENCE_NODES": "4",
    "INFERENCE_ENGINE": "sglang",
    "CONTAINER_ROLE": "sglang-mi300",
    "INFERENCE_MODEL": "zai-org/GLM-5.3",
    "AGENT_READY_TIMEOUT_SECONDS": "10800",
    "SGLANG_ATTENTION_BACKEND": "",
    "MEM_FRACTION_STATIC": "0.85",
    "REASONING_PARSER": "glm45",
    "TOOL_CALL_PARSER": "glm45",
}
KIMI27SGLANG = {
    **COMMON,
    "PIPELINE_PARALLEL_SIZE": "4",
    "INFERENCE_NODES": "4",
    "INFERENCE_ENGINE": "sglang",
    "CONTAINER_ROLE": "sglang-mi300",
    "INFERENCE_MODEL": "moonshotai/Kimi-K2.7-Code",
    "AGENT_READY_TIMEOUT_SECONDS": "7200",
    "MEM_FRACTION_STATIC": "0.85",
    "REASONING_PARSER": "kimi_k2",
    "TOOL_CALL_PARSER": "kimi_k2",
    "SERVER_EXTRA_ARGS": "--trust-remote-code",
}
OSS120B = {
    **COMMON,
    "INFERENCE_ENGINE": "vllm",
    "CONTAINER_ROLE": "vllm-mi300",
    "INFERENCE_MODEL": "openai/gpt-oss-120b",
    "GPU_MEMORY_UTILIZATION": "0.90",
    "REASONING_PARSER": "openai_gptoss",
    "TOOL_CALL_PARSER": "openai",
}
QWEN38_MI200 = {
    **QWEN38,
    "SLURM_PARTITION": "mi200",
    "INFERENCE_ENGINE": "vllm",
    "CONTAINER_ROLE": "vllm-mi200",
    "INFERENCE_MODEL": "Qwen/Qwen3.8-27B",
    "REASONING_PARSER": "qwen3",
    "TOOL_CALL_PARSER": "hermes",
    "SERVER_EXTRA_ARGS": "--dtype bfloat16",
    "GPU_MEMORY_UTILIZATION": "0.90",
}
QWEN38_REPLICAS = {**QWEN38, "INFERENCE_NODES": "2", "INFERENCE_MODE": "replicas"}

SGLANG = ("python3", "-m", "sglang.launch_server")


def command(env, rank=0, master=MASTER) -> RankCommand:
    return build_rank_command(plan(env), env, rank, master)


def argv(env, rank=0, master=MASTER) -> tuple[str, ...]:
    return command(env, rank, master).argv


def words(text: str) -> tuple[str, ...]:
    return tuple(shlex.split(text))


# --------------------------------------------------------------------------- catalog shapes (golden-ish)


GDR = "NCCL_NET_GDR_LEVEL=LOC "
SGLANG_LINE = GDR + "python3 -m sglang.launch_server "
VLLM_LINE = GDR + "vllm serve "


@pytest.mark.parametrize(
    "env, rank, expected",
    [
        pytest.param(
            QWEN38, 0,
            SGLANG_LINE + "--model-path Qwen/Qwen3.8-27B-FP8 --served-model-name hpcagent-bench-vllm "
            "--tp-size 4 --pp-size 1 --host 0.0.0.0 --port 8000 --mem-fraction-static 0.80 "
            "--attention-backend aiter --enable-metrics --reasoning-parser qwen3 --tool-call-parser qwen25",
            id="qwen38-sglang-single",
        ),
        pytest.param(
            GLM53, 0,
            SGLANG_LINE + "--model-path zai-org/GLM-5.3 --served-model-name hpcagent-bench-vllm "
            "--tp-size 4 --pp-size 4 --nnodes 4 --node-rank 0 --dist-init-addr \"${ENVLAYERS_MASTER_ADDR}:29500\" "
            "--host 0.0.0.0 --port 8000 --mem-fraction-static 0.85 --enable-metrics "
            "--reasoning-parser glm45 --tool-call-parser glm45",
            id="glm53-rank0-no-attention-backend",
        ),
        pytest.param(
            GLM53, 1,
            SGLANG_LINE + "--model-path zai-org/GLM-5.3 --served-model-name hpcagent-bench-vllm "
            "--tp-size 4 --pp-size 4 --nnodes 4 --node-rank 1 --dist-init-addr \"${ENVLAYERS_MASTER_ADDR}:29500\" "
            "--host 0.0.0.0 --port 8000 --mem-fraction-static 0.85 --enable-metrics "
            "--reasoning-parser glm45 --tool-call-parser glm45",
            id="glm53-rank1",
        ),
        pytest.param(
            KIMI27SGLANG, 3,
            SGLANG_LINE + "--model-path moonshotai/Kimi-K2.7-Code --served-model-name hpcagent-bench-vllm "
            "--tp-size 4 --pp-size 4 --nnodes 4 --node-rank 3 --dist-init-addr \"${ENVLAYERS_MASTER_ADDR}:29500\" "
            "--host 0.0.0.0 --port 8000 --mem-fraction-static 0.85 --attention-backend aiter "
            "--enable-metrics --reasoning-parser kimi_k2 --tool-call-parser kimi_k2 --trust-remote-code",
            id="kimi27sglang-rank3",
        ),
        pytest.param(
            OSS120B, 0,
            VLLM_LINE + "openai/gpt-oss-120b --served-model-name hpcagent-bench-vllm "
            "--tensor-parallel-size 4 --pipeline-parallel-size 1 --host 0.0.0.0 --port 8000 "
            "--gpu-memory-utilization 0.90 --reasoning-parser openai_gptoss --tool-call-parser openai "
            "--enable-auto-tool-choice",
            id="oss120b-vllm-single",
        ),
        pytest.param(
            QWEN38_MI200, 0,
            VLLM_LINE + "Qwen/Qwen3.8-27B --served-model-name hpcagent-bench-vllm "
            "--tensor-parallel-size 4 --pipeline-parallel-size 1 --host 0.0.0.0 --port 8000 "
            "--gpu-memory-utilization 0.90 --reasoning-parser qwen3 --tool-call-parser hermes "
            "--enable-auto-tool-choice --dtype bfloat16",
            id="qwen38-mi200-vllm-bf16",
        ),
        pytest.param(
            QWEN38_REPLICAS, 1,
            SGLANG_LINE + "--model-path Qwen/Qwen3.8-27B-FP8 --served-model-name hpcagent-bench-vllm "
            "--tp-size 4 --pp-size 1 --host 0.0.0.0 --port 8000 --mem-fraction-static 0.80 "
            "--attention-backend aiter --enable-metrics --reasoning-parser qwen3 --tool-call-parser qwen25",
            id="replicas-rank1-is-an-independent-server",
        ),
    ],
)
def test_catalog_model_command_lines(env, rank, expected):
    cmd = command(env, rank)
    assert shell_line(cmd) == expected
    assert cmd.env == {"NCCL_NET_GDR_LEVEL": "LOC"}
    assert cmd.argv == tuple(shlex.split(expected)[1:])


def test_replicas_build_the_same_command_on_every_node():
    cmds = build_commands(plan(QWEN38_REPLICAS), QWEN38_REPLICAS, MASTER)
    assert len(cmds) == 2
    assert cmds[0] == cmds[1]
    assert cmds[0].argv == argv(QWEN38)


def test_single_and_replicas_ignore_master_addr():
    assert argv(QWEN38, master="") == argv(QWEN38, master="10.0.0.1")
    assert argv(OSS120B, master="") == argv(OSS120B, master="10.0.0.1")


# --------------------------------------------------------------------------- multi-node rendezvous


def test_vllm_pipeline_rank0_serves_and_binds_the_rendezvous():
    env = {**GLM53, "INFERENCE_ENGINE": "vllm"}
    assert argv(env, 0, "10.1.2.3")[:17] == words(
        "vllm serve zai-org/GLM-5.3 --served-model-name hpcagent-bench-vllm "
        "--tensor-parallel-size 4 --pipeline-parallel-size 4 "
        "--nnodes 4 --node-rank 0 --master-addr 10.1.2.3 --master-port 29500"
    )
    assert "--headless" not in argv(env, 0, "10.1.2.3")


def test_vllm_pipeline_ranks_above_zero_are_headless():
    env = {**GLM53, "INFERENCE_ENGINE": "vllm", "RDZV_PORT": "29600"}
    assert argv(env, 2, "10.1.2.3")[9:18] == words(
        "--nnodes 4 --node-rank 2 --master-addr 10.1.2.3 --master-port 29600 --headless"
    )


def test_sglang_rendezvous_uses_rdzv_port():
    env = {**GLM53, "RDZV_PORT": "29600"}
    a = argv(env, 1, "node-a")
    assert a[a.index("--dist-init-addr") + 1] == "node-a:29600"


def test_master_addr_is_kept_verbatim():
    env = {**OSS120B, "INFERENCE_NODES": "2", "PIPELINE_PARALLEL_SIZE": "2"}
    a = argv(env, 1, MASTER)
    assert a[a.index("--master-addr") + 1] == "${ENVLAYERS_MASTER_ADDR}"


def test_multi_node_plan_without_master_addr_is_a_programming_error():
    with pytest.raises(ValueError, match="master_addr"):
        command(GLM53, 1, "")


def test_rank_outside_the_plan_is_a_programming_error():
    with pytest.raises(ValueError, match=r"rank 4 is not in the plan \(ranks 0..3\)"):
        command(GLM53, 4)


# --------------------------------------------------------------------------- absent vs empty


@pytest.mark.parametrize(
    "overrides, present, absent",
    [
        pytest.param({}, ("--attention-backend", "aiter"), (), id="attention-backend-absent-is-aiter"),
        pytest.param({"SGLANG_ATTENTION_BACKEND": ""}, (), ("--attention-backend",),
                     id="attention-backend-empty-is-omitted"),
        pytest.param({"SGLANG_ATTENTION_BACKEND": "triton"}, ("--attention-backend", "triton"), (),
                     id="attention-backend-value"),
        pytest.param({"MEM_FRACTION_STATIC": ""}, (), ("--mem-fraction-static",), id="mem-fraction-empty"),
        pytest.param({"MEM_FRACTION_STATIC": None}, (), ("--mem-fraction-static",), id="mem-fraction-absent"),
        pytest.param({"MAX_MODEL_LEN": "65536"}, ("--context-length", "65536"), ("--max-model-len",),
                     id="max-model-len-is-context-length"),
        pytest.param({"REASONING_PARSER": ""}, (), ("--reasoning-parser",), id="reasoning-parser-empty"),
        pytest.param({"TOOL_CALL_PARSER": None}, (), ("--tool-call-parser",), id="tool-call-parser-absent"),
        pytest.param({"SERVER_HOST": "10.0.0.5"}, ("--host", "10.0.0.5"), (), id="server-host-value"),
        pytest.param({"SERVER_PORT": "9000"}, ("--port", "9000"), (), id="server-port-value"),
        pytest.param({"GPU_MEMORY_UTILIZATION": "0.9"}, (), ("--gpu-memory-utilization",),
                     id="vllm-key-ignored-by-sglang"),
    ],
)
def test_sglang_flag_follows_absent_vs_empty(overrides, present, absent):
    env = {**QWEN38, **{k: v for k, v in overrides.items() if v is not None}}
    for key in [k for k, v in overrides.items() if v is None]:
        env.pop(key, None)
    a = argv(env)
    if present:
        assert a[a.index(present[0]) + 1] == present[1]
    for name in absent:
        assert name not in a


@pytest.mark.parametrize(
    "overrides, present, absent",
    [
        pytest.param({"GPU_MEMORY_UTILIZATION": ""}, (), ("--gpu-memory-utilization",), id="gpu-memory-empty"),
        pytest.param({"MAX_MODEL_LEN": None}, (), ("--max-model-len",), id="max-model-len-absent"),
        pytest.param({"TOOL_CALL_PARSER": ""}, (), ("--tool-call-parser", "--enable-auto-tool-choice"),
                     id="tool-parser-empty-drops-auto-tool-choice"),
        pytest.param({"SGLANG_ATTENTION_BACKEND": "aiter", "MEM_FRACTION_STATIC": "0.8"}, (),
                     ("--attention-backend", "--mem-fraction-static"), id="sglang-keys-ignored-by-vllm"),
    ],
)
def test_vllm_flag_follows_absent_vs_empty(overrides, present, absent):
    env = {**OSS120B, **{k: v for k, v in overrides.items() if v is not None}}
    for key in [k for k, v in overrides.items() if v is None]:
        env.pop(key, None)
    a = argv(env)
    for name in absent:
        assert name not in a


def test_vllm_tool_call_parser_enables_auto_tool_choice():
    a = argv(OSS120B)
    i = a.index("--tool-call-parser")
    assert a[i : i + 3] == ("--tool-call-parser", "openai", "--enable-auto-tool-choice")


def test_sglang_does_not_get_enable_auto_tool_choice():
    assert "--enable-auto-tool-choice" not in argv(QWEN38)


@pytest.mark.parametrize("env", [pytest.param(QWEN38, id="sglang"), pytest.param(OSS120B, id="vllm")])
def test_host_and_port_are_always_explicit(env):
    bare = {k: v for k, v in env.items() if k not in ("SERVER_HOST", "SERVER_PORT")}
    a = argv(bare)
    assert a[a.index("--host") + 1] == "0.0.0.0"
    assert a[a.index("--port") + 1] == "8000"


@pytest.mark.parametrize(
    "value, expected",
    [
        pytest.param(None, {}, id="absent-not-set"),
        pytest.param("", {}, id="empty-not-set"),
        pytest.param("PHB", {"NCCL_NET_GDR_LEVEL": "PHB"}, id="value-on-the-command"),
    ],
)
def test_nccl_net_gdr_level_goes_on_the_server_command(value, expected):
    env = {k: v for k, v in OSS120B.items() if k != "NCCL_NET_GDR_LEVEL"}
    if value is not None:
        env["NCCL_NET_GDR_LEVEL"] = value
    assert command(env).env == expected


# --------------------------------------------------------------------------- required keys and engines


@pytest.mark.parametrize(
    "key, value, message",
    [
        pytest.param("INFERENCE_ENGINE", None, "INFERENCE_ENGINE: is not set; valid engines: sglang, vllm",
                     id="engine-absent"),
        pytest.param("INFERENCE_ENGINE", "", "INFERENCE_ENGINE: is empty; valid engines: sglang, vllm",
                     id="engine-empty"),
        pytest.param("INFERENCE_ENGINE", "ollama", "INFERENCE_ENGINE: unknown engine 'ollama'; "
                     "valid engines: sglang, vllm", id="engine-unknown"),
        pytest.param("INFERENCE_MODEL", None, "INFERENCE_MODEL: is not set; it names the model path or "
                     "Hugging Face id", id="model-absent"),
        pytest.param("INFERENCE_MODEL", "", "INFERENCE_MODEL: is empty; it must name the model path or "
                     "Hugging Face id", id="model-empty"),
        pytest.param("VLLM_SERVED_MODEL", None, "VLLM_SERVED_MODEL: is not set; it names the model name "
                     "clients use", id="served-name-absent"),
        pytest.param("VLLM_SERVED_MODEL", "", "VLLM_SERVED_MODEL: is empty; it must name the model name "
                     "clients use", id="served-name-empty"),
        pytest.param("SERVER_HOST", "", "SERVER_HOST: is empty; it must be the address the server binds; "
                     "hint: set SERVER_HOST=0.0.0.0 to bind every interface, or 127.0.0.1 for the node alone", id="host-empty"),
        pytest.param("SERVER_EXTRA_ARGS", "--x 'unclosed", "SERVER_EXTRA_ARGS: cannot be split like a shell "
                     "would: No closing quotation", id="extra-args-unbalanced-quote"),
    ],
)
@pytest.mark.parametrize("base", [pytest.param(QWEN38, id="sglang"), pytest.param(OSS120B, id="vllm")])
def test_bad_key_is_an_error_naming_it(base, key, value, message):
    env = dict(base)
    if value is None:
        env.pop(key)
    else:
        env[key] = value
    with pytest.raises(EngineError) as err:
        command(env)
    assert str(err.value) == message
    assert err.value.where == key


# --------------------------------------------------------------------------- extra args and API key


def test_extra_args_are_split_like_a_shell_and_appended_verbatim():
    env = {**OSS120B, "SERVER_EXTRA_ARGS": """--hf-overrides '{"rope_scaling": {"factor": 2}}' --enable-prefix-caching"""}
    assert argv(env)[-3:] == ("--hf-overrides", '{"rope_scaling": {"factor": 2}}', "--enable-prefix-caching")


@pytest.mark.parametrize(
    "extra, kept",
    [
        pytest.param("--api-server-count 4 --enable-prefix-caching", ("--enable-prefix-caching",), id="separate"),
        pytest.param("--api-server-count=4 --enable-prefix-caching", ("--enable-prefix-caching",), id="equals"),
        pytest.param("-asc 2 --seed 1", ("--seed", "1"), id="short-alias"),
        pytest.param("--seed 1 --api_server_count 2", ("--seed", "1"), id="underscore-spelling"),
    ],
)
def test_api_server_count_is_removed_on_headless_ranks(extra, kept):
    env = {**GLM53, "INFERENCE_ENGINE": "vllm", "SERVER_EXTRA_ARGS": extra}
    assert argv(env, 0)[-len(shlex.split(extra)):] == tuple(shlex.split(extra))
    assert argv(env, 1)[-len(kept):] == kept
    assert not any("api-server-count" in a or "api_server_count" in a or a == "-asc" for a in argv(env, 1))


def test_api_server_count_is_kept_on_sglang_and_replicas():
    env = {**OSS120B, "INFERENCE_NODES": "2", "INFERENCE_MODE": "replicas", "SERVER_EXTRA_ARGS": "--api-server-count 2"}
    assert argv(env, 1)[-2:] == ("--api-server-count", "2")


@pytest.mark.parametrize("env, key_env, key_flag", [
    pytest.param(QWEN38, None, "--api-key", id="sglang-only-takes-a-flag"),
    pytest.param(OSS120B, "VLLM_API_KEY", None, id="vllm-reads-its-environment"),
])
def test_server_api_key_is_passed_the_way_the_engine_reads_it_and_never_held(env, key_env, key_flag):
    cmd = command({**env, "SERVER_API_KEY": "s3cret"})
    assert (cmd.key_env, cmd.key_flag) == (key_env, key_flag)
    assert "--api-key" not in cmd.argv  # ranks.sh appends SGLang's flag with the key at run time
    assert "s3cret" not in repr(cmd)


@pytest.mark.parametrize("value", [pytest.param(None, id="absent"), pytest.param("", id="empty")])
def test_no_server_api_key_means_no_api_key_flag(value):
    env = dict(QWEN38) if value is None else {**QWEN38, "SERVER_API_KEY": value}
    assert "--api-key" not in argv(env)


@pytest.mark.parametrize(
    "given, masked",
    [
        pytest.param(("x", "--api-key", "s3cret", "--port", "1"), ("x", "--api-key", "***", "--port", "1"),
                     id="separate"),
        pytest.param(("x", "--api-key=s3cret"), ("x", "--api-key=***"), id="equals"),
        pytest.param(("x", "--port", "1"), ("x", "--port", "1"), id="nothing-to-mask"),
        pytest.param(("x", "--api-key", "a", "--api-key", "b"), ("x", "--api-key", "***", "--api-key", "***"),
                     id="twice"),
    ],
)
def test_redact_masks_the_api_key(given, masked):
    assert redact(given) == masked


def test_shell_line_masks_the_key_unless_asked_not_to():
    cmd = command({**QWEN38, "SERVER_API_KEY": "s3cret", "SERVER_EXTRA_ARGS": "--api-key=other"})
    assert "s3cret" not in shell_line(cmd) and "other" not in shell_line(cmd)
    assert shell_line(cmd).endswith("'--api-key=***' --api-key '***'")
    assert "--api-key=other" in shell_line(cmd, redact=False) and "s3cret" not in shell_line(cmd, redact=False)


def test_shell_line_shows_vllms_key_as_a_masked_variable():
    cmd = command({**OSS120B, "SERVER_API_KEY": "s3cret"})
    assert "VLLM_API_KEY='***' vllm serve " in shell_line(cmd)


# --------------------------------------------------------------------------- shell lines


@pytest.mark.parametrize(
    "word, quoted",
    [
        pytest.param("plain", "plain", id="plain"),
        pytest.param("two words", "'two words'", id="space"),
        pytest.param("${ENVLAYERS_MASTER_ADDR}", '"${ENVLAYERS_MASTER_ADDR}"', id="exact-reference"),
        pytest.param("${ENVLAYERS_MASTER_ADDR}:29500", '"${ENVLAYERS_MASTER_ADDR}:29500"', id="reference-and-port"),
        pytest.param('${A} "$x" `y`\\', '"${A} \\"\\$x\\" \\`y\\`\\\\"', id="reference-with-specials"),
        pytest.param("$HOME", "'$HOME'", id="bare-dollar-stays-literal"),
        pytest.param("${1}", "'${1}'", id="not-a-name"),
        pytest.param('{"a": 1}', "'{\"a\": 1}'", id="json"),
    ],
)
def test_quote_keeps_only_name_references_expandable(word, quoted):
    assert word_with_refs(word) == quoted


def test_shell_line_runs_in_bash_with_the_reference_filled_in():
    cmd = RankCommand(argv=("printf", "%s\\n", "${ENVLAYERS_MASTER_ADDR}:29500", "a b", "$HOME", '{"k": 1}'),
                      env={"NCCL_NET_GDR_LEVEL": "LOC"})
    script = f"ENVLAYERS_MASTER_ADDR=10.0.0.7; {shell_line(cmd)}"
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["10.0.0.7:29500", "a b", "$HOME", '{"k": 1}']


# --------------------------------------------------------------------------- the real catalog renders

RENDERS = sorted((Path(__file__).resolve().parents[1] / "experiments" / "renders").glob(".env.*"))


def read_render(path: Path) -> dict[str, str]:
    """A committed ``--format sh`` render: ``export KEY='value'`` lines -> key -> value."""
    env = {}
    for line in path.read_text().splitlines():
        tokens = shlex.split(line, comments=True)
        if tokens[:1] == ["export"] and len(tokens) == 2 and "=" in tokens[1]:
            key, _, value = tokens[1].partition("=")
            env[key] = value
    return env


@pytest.mark.skipif(not RENDERS, reason="no committed catalog renders")
@pytest.mark.parametrize("path", [pytest.param(p, id=p.name.removeprefix(".env.")) for p in RENDERS])
def test_every_catalog_render_builds_or_is_refused_with_a_reason(path):
    env = read_render(path)
    try:
        p = plan(env)
    except TopologyError as err:
        # e.g. replicas:glm53: a 16-GPU model cannot be one replica per 4-GPU node.
        assert err.where and err.hint
        return
    cmds = build_commands(p, env, MASTER)
    assert len(cmds) == p.nodes
    for cmd in cmds:
        line = shell_line(cmd, redact=False)
        assert tuple(shlex.split(line)[len(cmd.env):]) == cmd.argv
        if cmd.argv[:2] == ("ray", "start"):  # a Ray worker rank (ray, gateway shapes) runs no server
            continue
        assert cmd.argv[cmd.argv.index("--port") + 1] == str(p.api_port)


def test_a_rank_command_without_env_has_an_empty_dict_of_its_own():
    from envlayers.engines import RankCommand

    a, b = RankCommand(("vllm", "serve")), RankCommand(argv=("vllm", "serve"))
    assert a == b and a.env == {} and a.env is not b.env
    a.env["X"] = "1"
    assert b.env == {}
    assert a._replace(env={}, key_env=None) == RankCommand(("vllm", "serve"), {})
