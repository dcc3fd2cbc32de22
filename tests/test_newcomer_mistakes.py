"""A corpus of what a newcomer gets wrong, each answered before submission in one line: an error (nothing
submitted), a refusal the dry run shows, or a warning, with the file:line to fix where a layer said it.

Each case is a layer (the newcomer's SERVE_ENV_FILE), the submitting shell's variables and the site, and the
one line expected: its kind and words it must hold. Add a case for every class of mistake found later.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from envlayers.errors import EnvLayersError
from envlayers.jobscript import prepare

REPO = Path(__file__).resolve().parents[1]
MINE = "{mine}"  # the layer's path, as the line names it

# (id, model, layer, shell, site, kind, words): kind E = error, B = refusal in the dry run, W = warning
CASES = [
    ("typo-tp", "qwen38", "TENSOR_PARALEL_SIZE=2\n", {}, None, "W", [f"{MINE}:1: TENSOR_PARALEL_SIZE is no launch key", "did you mean TENSOR_PARALLEL_SIZE?"]),
    ("typo-mem-fraction", "qwen38", "MEM_FRACTION_STATC=0.7\n", {}, None, "W", [f"{MINE}:1: MEM_FRACTION_STATC", "did you mean MEM_FRACTION_STATIC?"]),
    ("lowercase-key", "qwen38", "server_port=9000\n", {}, None, "W", [f"{MINE}:1: server_port is no launch key", "did you mean SERVER_PORT?"]),
    ("typo-in-a-passed-on-prefix", "qwen38", "VLLM_SERVED_MODLE=x\n", {}, None, "W", [f"{MINE}:1: VLLM_SERVED_MODLE", "did you mean VLLM_SERVED_MODEL?"]),
    ("typo-nccl", "qwen38", "NCCL_NET_GDR_LEVL=LOC\n", {}, None, "W", ["did you mean NCCL_NET_GDR_LEVEL?"]),
    ("shell-launch-key-no-layer-sets", "qwen38", "", {"IDLE_STOP_AFTER_S": "1800"}, None, "W", ["IDLE_STOP_AFTER_S from the submitting shell does not reach the job", "SERVE_ENV_FILE"]),
    ("shell-launch-key-a-layer-sets", "qwen38", "", {"TENSOR_PARALLEL_SIZE": "2"}, None, "W", ["TENSOR_PARALLEL_SIZE from the submitting shell is ignored: experiments/sites/mi300a.env:"]),
    ("shell-sbatch-partition", "qwen38", "", {"SBATCH_PARTITION": "debug"}, None, "W", ["SBATCH_PARTITION from the submitting shell is overridden by the job's --partition=mi300", "SLURM_PARTITION"]),
    ("shell-sbatch-time", "qwen38", "", {"SBATCH_TIMELIMIT": "1:00:00"}, None, "W", ["SBATCH_TIMELIMIT from the submitting shell is overridden", "SERVE_TIME"]),
    ("extra-args-host", "qwen38", "SERVER_EXTRA_ARGS='--host 0.0.0.0'\n", {}, None, "B", [f"SERVER_EXTRA_ARGS ({MINE}:1): --host is decided by SERVER_HOST"]),
    ("extra-args-port", "qwen38", "SERVER_EXTRA_ARGS='--port 9001'\n", {}, None, "B", ["--port is decided by SERVER_PORT"]),
    ("extra-args-sglang-tp", "qwen38", "SERVER_EXTRA_ARGS='--tp-size 2'\n", {}, None, "B", ["--tp-size is decided by TENSOR_PARALLEL_SIZE"]),
    ("extra-args-vllm-pp", "oss120b", "SERVER_EXTRA_ARGS='--pipeline-parallel-size 1'\n", {}, None, "B", ["--pipeline-parallel-size is decided by PIPELINE_PARALLEL_SIZE"]),
    ("extra-args-served-name", "oss120b", "SERVER_EXTRA_ARGS='--served-model-name x'\n", {}, None, "B", ["--served-model-name is decided by VLLM_SERVED_MODEL"]),
    ("extra-args-api-key", "oss120b", "SERVER_EXTRA_ARGS='--api-key abc'\n", {}, None, "B", ["--api-key is decided by SERVER_API_KEY_FILE"]),
    ("extra-args-unknown-flag", "oss120b", "SERVER_EXTRA_ARGS='--no-such-flag'\n", {}, None, "W", ["vLLM 0.28.0+cpu's argument parser has no --no-such-flag", f"({MINE}:1)"]),
    ("sglang-parser-name-on-vllm", "oss120b", "TOOL_CALL_PARSER=qwen25\n", {}, None, "B", [f"TOOL_CALL_PARSER ({MINE}:1): vLLM refuses --tool-call-parser 'qwen25' (vLLM 0.28.0+cpu takes:"]),
    ("unknown-reasoning-parser", "qwen38", "REASONING_PARSER=nope\n", {}, None, "B", [f"REASONING_PARSER ({MINE}:1): SGLang refuses --reasoning-parser 'nope' (SGLang 0.5.20 takes:"]),
    ("unknown-attention-backend", "qwen38", "SGLANG_ATTENTION_BACKEND=nope\n", {}, None, "B", ["SGLang refuses --attention-backend 'nope'"]),
    ("engine-switched-without-image", "qwen38", "INFERENCE_ENGINE=vllm\n", {}, None, "B", [f"INFERENCE_ENGINE=vllm ({MINE}:1), but CONTAINER_ROLE=sglang-mi300", "set CONTAINER_ROLE=vllm-mi300"]),
    ("unknown-engine", "qwen38", "INFERENCE_ENGINE=tgi\n", {}, None, "E", [f"{MINE}:1: INFERENCE_ENGINE: unknown engine 'tgi'"]),
    ("unknown-runtime", "qwen38", "CONTAINER_RUNTIME=rkt\n", {}, None, "E", [f"{MINE}:1: CONTAINER_RUNTIME: unknown container runtime 'rkt'"]),
    ("empty-runtime", "qwen38", "CONTAINER_RUNTIME=\n", {}, None, "E", [f"{MINE}:1: CONTAINER_RUNTIME: is empty; it must be one of ce, none, podman,", "hint: set CONTAINER_RUNTIME=ce (its value when no layer assigns it), or one of none, podman,"]),
    ("unknown-role", "qwen38", "CONTAINER_ROLE=sglang-mi999\n", {}, None, "E", [f"{MINE}:1: CONTAINER_ROLE: unknown EDF role 'sglang-mi999'", "did you mean sglang-mi300?"]),
    ("nodes-empty", "qwen38", "INFERENCE_NODES=\n", {}, None, "E", [f"{MINE}:1: INFERENCE_NODES: is empty"]),
    ("nodes-a-word", "qwen38", "INFERENCE_NODES=two\n", {}, None, "E", [f"{MINE}:1: INFERENCE_NODES: must be a positive integer, got 'two'"]),
    ("idle-gpus-per-replica", "oss120b", "INFERENCE_NODES=2\nINFERENCE_MODE=replicas\nTENSOR_PARALLEL_SIZE=2\n", {}, None, "E", [f"TENSOR_PARALLEL_SIZE ({MINE}:3)", "idle"]),
    ("uneven-instances", "oss20bdp", "INFERENCE_NODES=2\nNUMBER_OF_INSTANCES=3\n", {}, None, "E", [f"NUMBER_OF_INSTANCES ({MINE}:2), INFERENCE_NODES ({MINE}:1)", "does not divide evenly"]),
    ("missing-gpus", "qwen38", "INFERENCE_NODES=1\nTENSOR_PARALLEL_SIZE=8\n", {}, None, "E", [f"TENSOR_PARALLEL_SIZE ({MINE}:2)", "missing"]),
    ("single-mode-on-two-nodes", "qwen38", "INFERENCE_MODE=single\nINFERENCE_NODES=2\n", {}, None, "E", [f"INFERENCE_MODE ({MINE}:1), INFERENCE_NODES ({MINE}:2)", "sit idle"]),
    ("unknown-mode", "qwen38", "INFERENCE_MODE=cluster\n", {}, None, "E", [f"{MINE}:1: INFERENCE_MODE: unknown mode 'cluster'"]),
    ("port-out-of-range", "qwen38", "SERVER_PORT=70000\n", {}, None, "E", [f"{MINE}:1: SERVER_PORT: must be a TCP port (1-65535), got '70000'"]),
    ("keyless-on-every-interface", "qwen38", "SERVER_API_KEY_FILE=\n", {}, None, "B", ["binds every interface (SERVER_HOST=0.0.0.0) and takes no API key", f"emptied at {MINE}:1"]),
    ("api-key-in-a-layer", "qwen38", "SERVER_API_KEY=abc\n", {}, None, "E", [f"{MINE}:1: SERVER_API_KEY in a layer would be written into the render"]),
    ("token-in-a-layer", "qwen38", "HF_TOKEN=hf_abcdefghijklmnop\n", {}, None, "E", [f"{MINE}:1: HF_TOKEN looks like a credential"]),
    ("pythonpath-in-a-layer", "qwen38", "PYTHONPATH=/tmp/x\n", {}, None, "E", [f"{MINE}:1: 'PYTHONPATH' is refused in a layer"]),
    ("launcher-variable-in-a-layer", "qwen38", "ENVLAYERS_CHAIN_LEFT=5\n", {}, None, "E", [f"{MINE}:1: 'ENVLAYERS_CHAIN_LEFT' is refused in a layer"]),
    ("serve-time-as-minutes", "qwen38", "", {"SERVE_TIME": "4:00"}, None, "W", ["SERVE_TIME=4:00 is 4 min", "04:00:00"]),
    ("serve-time-in-words", "qwen38", "", {"SERVE_TIME": "4 hours"}, None, "E", ["SERVE_TIME: time limit '4 hours' is not a Slurm time"]),
    ("boolean-as-maybe", "qwen38", "CHECK_WEIGHTS=maybe\n", {}, None, "E", [f"{MINE}:1: CHECK_WEIGHTS: must be true or false"]),
    ("partition-with-a-space", "qwen38", "SLURM_PARTITION='a b'\n", {}, None, "E", [f"{MINE}:1: SLURM_PARTITION: 'a b' is not a partition name"]),
    ("rocm-variable-on-nvidia", "qwen38", "HSA_NO_SCRATCH_RECLAIM=1\n", {}, "h100", "B", [f"{MINE}:1: HSA_NO_SCRATCH_RECLAIM=1 is for AMD GPUs"]),
    ("aiter-on-nvidia", "qwen38", "SGLANG_ATTENTION_BACKEND=aiter\n", {}, "h100", "B", [f"{MINE}:1: SGLANG_ATTENTION_BACKEND=aiter is for AMD GPUs"]),
    ("site-misspelt", "qwen38", "", {}, "h10", "E", ["SITE: unknown site 'h10'", "did you mean 'h100'?"]),
    ("vendor-not-amd-or-nvidia", "qwen38", "GPU_VENDOR=intel\n", {}, None, "E", [f"{MINE}:1: GPU_VENDOR: must be amd or nvidia, got 'intel'"]),
    ("apptainer-without-an-image-folder", "qwen38", "CONTAINER_RUNTIME=apptainer\nGPU_VENDOR=nvidia\n", {}, None, "E", [f"{MINE}:1: CONTAINER_RUNTIME: CONTAINER_IMAGE_DIR is not set: apptainer runs a SIF file"]),
    ("image-tagged-latest", "qwen38", "CONTAINER_RUNTIME=podman\nCONTAINER_IMAGE=vllm/vllm-openai:latest\n", {}, None, "E", [f"{MINE}:2: CONTAINER_IMAGE: image 'vllm/vllm-openai:latest' is tagged 'latest'"]),
    ("ray-shape-in-podman", "llama405bray", "CONTAINER_RUNTIME=podman\nCONTAINER_IMAGE=x/y:1\n", {}, None, "E", [f"{MINE}:1: CONTAINER_RUNTIME: podman cannot run the ray shape"]),
    ("loopback-with-a-second-node", "oss120b", "SERVER_HOST=127.0.0.1\nINFERENCE_MODE=replicas\nINFERENCE_NODES=2\n", {}, None, "B", [f"{MINE}:1: the server binds loopback only (SERVER_HOST=127.0.0.1)"]),
    ("site-without-gpu-name", "qwen38", "", {}, "{site}", "E", ["experiments/layers/model-qwen38.env:5", "CONTAINER_ROLE reads $GPU_NAME, which no layer sets", "set GPU_NAME there"]),
    ("gpu-memory-as-a-word", "qwen38", "GPU_MEM_GB=lots\n", {}, None, "E", [f"{MINE}:1: GPU_MEM_GB: must be a positive number of GiB, got 'lots'"]),
]


def test_the_corpus_is_large_enough_and_names_each_case_once():
    assert len(CASES) >= 40 and len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_a_newcomer_mistake_gets_its_one_line(tmp_path, case):
    _, model, layer, shell, site, kind, words = case
    mine = tmp_path / "mine.env"
    mine.write_text(layer)
    if site == "{site}":  # a site file of the newcomer's own, as the case's name says
        site = str(tmp_path / "site.env")
        Path(site).write_text("SLURM_PARTITION=p\nGPUS_PER_NODE=8\nGPU_MEM_GB=80\nGPU_VENDOR=nvidia\nCONTAINER_RUNTIME=ce\n")
    environ = {"HOME": str(tmp_path), "PWD": str(tmp_path), "PATH": os.environ["PATH"], "CHECK_WEIGHTS": "0",
               "EDF_PATH": str(tmp_path / "edf"), **shell}
    time = shell.get("SERVE_TIME", "04:00:00")
    words = [w.replace(MINE, str(mine)) for w in words]
    try:
        job = prepare(REPO, model, env_file=mine, python="/usr/bin/python3", environ=environ, site=site, time=time)
    except EnvLayersError as err:
        said = str(err)
        assert kind == "E", f"an error where a {kind} was expected: {said}"
        assert "\n" not in said and all(w in said for w in words), said
        return
    lines = {"B": job.blockers, "W": job.warnings}.get(kind)
    assert lines is not None, f"no error; blockers {job.blockers}, warnings {job.warnings}"
    found = [line for line in lines if all(w in line for w in words)]
    assert len(found) == 1, (kind, words, job.blockers, job.warnings)
    assert "\n" not in found[0]
