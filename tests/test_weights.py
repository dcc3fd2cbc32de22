"""The weights check before submission: a hub id must be in the Hugging Face cache the job reads.

Real folders in tmp_path, laid out as the hub client writes them (blobs, and snapshot files that link
to them); the check reads nothing else.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from envlayers.errors import EnvLayersError
from envlayers.jobscript import prepare
from envlayers.weights import hub_id, snapshot_with_weights
from hubcache import fake_snapshot

REPO = Path(__file__).resolve().parents[1]
PY = "/usr/bin/python3"
QWEN = "Qwen/Qwen3.8-27B-FP8"


def job(tmp_path, layer: str, model: str = "qwen38", **environ: str):
    mine = tmp_path / "mine.env"
    mine.write_text("CONTAINER_RUNTIME=none\nALLOW_PUBLIC_UNAUTHENTICATED=1\n" + layer)
    return prepare(REPO, model, env_file=mine, python=PY,
                   environ={"HOME": str(tmp_path), "PWD": str(tmp_path), **environ})


@pytest.mark.parametrize("model, want", [
    ("Qwen/Qwen3.8-27B-FP8", True), ("openai/gpt-oss-20b", True), ("zai-org/GLM-5.3", True),
    ("/models/qwen", False), ("./org/name", False), ("gpt2", False), ("org/name/extra", False),
    ("${SCRATCH}/m", False), ("", False),
])
def test_what_counts_as_a_hub_id(model, want, tmp_path):
    assert (hub_id(model, tmp_path) == model) is want


def test_a_folder_of_that_name_here_is_a_local_model(tmp_path):
    (tmp_path / "org" / "name").mkdir(parents=True)
    assert hub_id("org/name", tmp_path) is None


@pytest.mark.parametrize("files, found", [
    pytest.param(("model-00001-of-00002.safetensors",), True, id="safetensors"),
    pytest.param(("pytorch_model.bin",), True, id="bin"),
    pytest.param(("model.safetensors.index.json",), True, id="index-json"),
    pytest.param(("config.json", "tokenizer.json"), False, id="config-only"),
    pytest.param((), False, id="empty-snapshot"),
])
def test_a_snapshot_needs_a_weight_file(tmp_path, files, found):
    fake_snapshot(tmp_path / "hub", QWEN, files)
    assert (snapshot_with_weights(tmp_path / "hub", QWEN) is not None) is found


def test_a_link_whose_blob_is_missing_does_not_count(tmp_path):
    snap = fake_snapshot(tmp_path / "hub", QWEN)
    for blob in (snap.parents[1] / "blobs").iterdir():
        blob.unlink()  # an interrupted download
    assert snapshot_with_weights(tmp_path / "hub", QWEN) is None


def test_missing_weights_refuse_the_submission_with_the_download_command(tmp_path):
    hf = tmp_path / "hf"
    j = job(tmp_path, f"HF_HOME={hf}\n")
    (blocker,) = j.blockers
    assert blocker == (
        f"INFERENCE_MODEL (experiments/layers/model-qwen38.env:6): the weights of {QWEN} are not in the cache the "
        f"job reads, HF_HOME={hf} ({tmp_path / 'mine.env'}:3): no weight file (*.safetensors, *.bin, *.index.json) "
        f"under {hf}/hub/models--Qwen--Qwen3.8-27B-FP8/snapshots/; a download inside the job would keep every "
        f"allocated GPU idle. Download them first: `HF_HOME={hf} hf download {QWEN}` (older clients: "
        f"`HF_HOME={hf} huggingface-cli download {QWEN}`), or set CHECK_WEIGHTS=0 when they come another way")
    assert f"# would refuse to submit: INFERENCE_MODEL (" in j.dry_run_text()
    fake_snapshot(hf / "hub", QWEN)
    assert job(tmp_path, f"HF_HOME={hf}\n").blockers == []


def test_hf_hub_cache_replaces_hf_home_hub(tmp_path):
    cache = tmp_path / "hubcache"
    fake_snapshot(tmp_path / "hf" / "hub", QWEN)  # where HF_HOME alone would look: not what the job reads
    j = job(tmp_path, f"HF_HOME={tmp_path / 'hf'}\nHF_HUB_CACHE={cache}\n")
    assert len(j.blockers) == 1 and f"`HF_HUB_CACHE={cache} hf download {QWEN}`" in j.blockers[0]
    fake_snapshot(cache, QWEN)
    assert job(tmp_path, f"HF_HOME={tmp_path / 'hf'}\nHF_HUB_CACHE={cache}\n").blockers == []


@pytest.mark.parametrize("value", ["0", "false", "off", "No"])
def test_check_weights_off_skips_the_check(tmp_path, value):
    j = job(tmp_path, f"HF_HOME={tmp_path / 'hf'}\nCHECK_WEIGHTS={value}\n")
    assert j.blockers == [] and not any("weights" in w for w in j.warnings)


@pytest.mark.parametrize("value", ["", "1", "true"])
def test_check_weights_empty_or_on_checks(tmp_path, value):
    assert len(job(tmp_path, f"HF_HOME={tmp_path / 'hf'}\nCHECK_WEIGHTS={value}\n").blockers) == 1


def test_check_weights_other_values_are_an_error_naming_the_key(tmp_path):
    with pytest.raises(EnvLayersError) as err:
        job(tmp_path, "CHECK_WEIGHTS=maybe\n")
    assert str(err.value).startswith(f"{tmp_path / 'mine.env'}:3: CHECK_WEIGHTS: must be true or false "
                                     "(true/1/yes/on or false/0/no/off, any case), got 'maybe'; hint: 0 skips")


def test_no_hf_home_is_a_warning_not_a_refusal(tmp_path):
    j = job(tmp_path, "")
    assert j.blockers == []
    assert [w for w in j.warnings if "weights" in w] == [
        f"HF_HOME is not set in the layers: the weights of {QWEN} cannot be checked before submission (the job "
        "reads its environment's HF_HOME, else ~/.cache/huggingface); set HF_HOME in a layer, or CHECK_WEIGHTS=0 "
        "when the weights come another way"]


def test_a_reference_the_login_node_cannot_expand_is_a_warning(tmp_path):
    j = job(tmp_path, "HF_HOME=${MY_JOB_SCRATCH}/hf\n")
    assert j.blockers == []
    assert f"HF_HOME ({tmp_path / 'mine.env'}:3) reads ${{MY_JOB_SCRATCH}}, which this shell does not set: the " \
           f"weights of {QWEN} cannot be checked before submission; export MY_JOB_SCRATCH here, or CHECK_WEIGHTS=0 " \
           "when the weights come another way" in j.warnings
    # as the warning says: with the variable it names exported, the weights are checked (here: not there)
    assert len(job(tmp_path, "HF_HOME=${MY_JOB_SCRATCH}/hf\n", MY_JOB_SCRATCH=str(tmp_path)).blockers) == 1


def test_a_local_model_path_is_not_checked(tmp_path):
    j = job(tmp_path, f"HF_HOME={tmp_path / 'hf'}\nINFERENCE_MODEL={tmp_path / 'weights'}\n")
    assert j.blockers == [] and not any("weights of" in w for w in j.warnings)


def test_the_container_engine_reads_the_edfs_hf_home(tmp_path):
    # CE: the EDF's [env] wins over the job's environment, so a layer's HF_HOME is not what the server reads
    from envlayers.edfinstall import install

    edf = tmp_path / "edf"
    mine = tmp_path / "mine.env"
    mine.write_text(f"ALLOW_PUBLIC_UNAUTHENTICATED=1\nHF_HOME={tmp_path / 'layer-hf'}\n")
    fake_snapshot(tmp_path / "layer-hf" / "hub", QWEN)
    environ = {"HOME": str(tmp_path), "PWD": str(tmp_path), "EDF_PATH": str(edf), "SCRATCH": str(tmp_path / "s")}
    install(REPO, edf, environ=environ)  # the EDFs and the image the dry run checks are there
    image = tmp_path / "s" / "ce-images" / "sglang-rocm_v0.5.20-rocm724-mi30x-20260919.sqsh"
    image.parent.mkdir(parents=True)
    image.write_bytes(b"hsqs")
    j = prepare(REPO, "qwen38", env_file=mine, python=PY, environ=environ)
    (blocker,) = j.blockers
    assert f"HF_HOME={tmp_path}/s/.cache/huggingface (containers/edfs/sglang-mi300.yaml:54)" in blocker
    fake_snapshot(tmp_path / "s" / ".cache" / "huggingface" / "hub", QWEN)
    assert prepare(REPO, "qwen38", env_file=mine, python=PY, environ=environ).blockers == []
    unset = prepare(REPO, "qwen38", env_file=mine, python=PY, environ={k: v for k, v in environ.items() if k != "SCRATCH"})
    # the EDF's value reads $SCRATCH: the warning names that variable, not HF_HOME, as the one to export
    assert unset.blockers == [] and any(w.startswith("HF_HOME (containers/edfs/sglang-mi300.yaml:54) reads ${SCRATCH}, "
                                                     "which this shell does not set") and "export SCRATCH here" in w
                                        for w in unset.warnings)


def test_serve_refuses_in_one_line_before_sbatch(tmp_path):
    mine = tmp_path / "mine.env"
    mine.write_text(f"CONTAINER_RUNTIME=none\nALLOW_PUBLIC_UNAUTHENTICATED=1\nHF_HOME={tmp_path / 'hf'}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_"))}
    env.update(PYTHONPATH=str(REPO / "src"), HOME=str(tmp_path), PATH="/usr/bin:/bin")  # no sbatch on PATH
    proc = subprocess.run([sys.executable, "-m", "envlayers", "serve", "--model", "qwen38", "--env-file", str(mine)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert f"`HF_HOME={tmp_path / 'hf'} hf download {QWEN}`" in proc.stderr


def test_a_cache_that_cannot_be_read_is_a_warning_naming_the_setting(tmp_path):
    # root reads any mode, so the unreadable folder here is a symbolic-link loop (ELOOP), an OSError all the same
    hf = tmp_path / "hf"
    repo = hf / "hub" / "models--Qwen--Qwen3.8-27B-FP8"
    repo.mkdir(parents=True)
    (repo / "snapshots").symlink_to(repo / "snapshots")
    j = job(tmp_path, f"HF_HOME={hf}\n")
    assert j.blockers == []
    (warning,) = [w for w in j.warnings if "weights" in w]
    assert warning.startswith(f"INFERENCE_MODEL (experiments/layers/model-qwen38.env:6): cannot look for the weights "
                              f"of {QWEN} in HF_HOME={hf} ({tmp_path / 'mine.env'}:3): ")
    assert warning.endswith("fix the permissions, or set CHECK_WEIGHTS=0 when the job reads them another way")
