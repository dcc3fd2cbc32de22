"""Sites: the site is one layer right above common.env, the catalog moves between sites unchanged, and a
setting for the other vendor's GPUs or a site file that says too little or too much gets a word.

The NVIDIA site runs Apptainer, which cannot be installed here: its rank lines are checked against
Apptainer's own option table (src/envlayers/data/apptainer-options.json, when present) and run through
a recording stand-in of the `apptainer` program in tests/test_apptainer_ranks.py.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from envlayers.cli import cli
from envlayers.errors import EnvLayersError
from envlayers.jobscript import prepare
from envlayers.layers import load_env, stack_sources
from envlayers import catalog, sites

REPO = Path(__file__).resolve().parents[1]
MODELS = sorted(catalog.load(REPO).models)
# what only AMD GPUs understand, as it would show in a job for NVIDIA
AMD_WORDS = ("/dev/kfd", "/dev/dri", "aiter", "--rocm", "rocm", "mi300", "MI300", "HIP_", "HSA_", "MIOPEN_",
             "NCCL_NET_GDR_LEVEL")


def site_blockers(job) -> list[str]:
    """The job's blockers but the weights one: no test here has the models' weights in its HF cache."""
    return [b for b in job.blockers if "CHECK_WEIGHTS=0" not in b]


@pytest.fixture
def nvidia_env(tmp_path):
    """A login node for the NVIDIA site: SCRATCH with the SIF files of both CUDA images, an `apptainer` on PATH."""
    scratch = tmp_path / "scratch"
    (scratch / "sif").mkdir(parents=True)
    for image in ("vllm_vllm-openai_v0.28.0.sif", "lmsysorg_sglang_v0.5.20-cu129.sif"):
        (scratch / "sif" / image).write_bytes(b"SIF")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "apptainer"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    return {"SCRATCH": str(scratch), "PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path),
            "EDF_PATH": str(tmp_path / "edf")}


def test_the_default_site_sits_right_above_common_env():
    labels = [s.label for s in stack_sources(REPO, "experiment:qwen38")]
    assert labels[:3] == ["experiments/layers/common.env", "experiments/sites/mi300a.env",
                          "experiments/layers/model-qwen38.env"]
    text = load_env(REPO, "experiment:qwen38").text()
    assert (text["SLURM_PARTITION"], text["GPUS_PER_NODE"], text["GPU_VENDOR"], text["CONTAINER_ROLE"]) == \
        ("mi300", "4", "amd", "sglang-mi300")


def test_a_model_layer_beats_the_site_and_the_site_beats_common(tmp_path):
    site = tmp_path / "mine.env"
    site.write_text("SLURM_PARTITION=p\nGPUS_PER_NODE=8\nGPU_MEM_GB=80\nGPU_VENDOR=nvidia\nGPU_NAME=h100\n"
                    "CONTAINER_RUNTIME=none\nSERVER_PORT=9000\nINFERENCE_ENGINE=vllm\n")
    env = load_env(REPO, "experiment:qwen38", site=str(site))
    assert env.bindings["SERVER_PORT"].value == ("9000",)  # over common.env
    assert env.bindings["INFERENCE_ENGINE"].value == ("sglang",)  # the model layer wins
    assert str(env.bindings["GPUS_PER_NODE"].origin) == f"{site}:2"


def test_site_errors_name_what_to_fix(tmp_path):
    with pytest.raises(EnvLayersError) as err:
        load_env(REPO, "experiment:qwen38", site="h10")
    assert "unknown site 'h10'" in str(err.value) and "did you mean 'h100'" in str(err.value)
    with pytest.raises(EnvLayersError) as err:
        load_env(REPO, "experiment:qwen38", site=str(tmp_path / "none.env"))
    assert "SITE names a file that does not exist" in str(err.value)
    base = tmp_path / "base.env"
    base.write_text("INFERENCE_ENGINE=vllm\n")
    with pytest.raises(EnvLayersError) as err:
        prepare(REPO, "qwen38", base_env=base, site="h100", environ={"HOME": str(tmp_path)})
    assert "SERVE_BASE_ENV" in str(err.value) and err.value.where == "SITE"


@pytest.mark.parametrize("model", MODELS)
def test_every_catalog_model_on_the_nvidia_site_has_no_amd_setting(model, nvidia_env):
    try:
        job = prepare(REPO, model, site="h100", python="/usr/bin/python3", environ=nvidia_env)
    except EnvLayersError as err:  # refused before submission, with why
        assert model == "qwen38mi200", f"{model}: {err}"  # an MI250X recipe: AMD by design
        return
    if model == "qwen38mi200":
        assert site_blockers(job), "the MI250X layer's AMD settings must be refused on an NVIDIA site"
        return
    text = job.dry_run_text()
    assert not site_blockers(job), job.blockers
    for word in AMD_WORDS:
        assert word not in text, f"{model}: {word!r} in the NVIDIA job"
    assert "--partition=gpu" in job.sbatch_args and "--gpus-per-node=8" in job.sbatch_args
    for line in job.rank_lines:
        assert "apptainer exec --cleanenv --nv " in line, line
        assert ".sif " in line and nvidia_env["SCRATCH"] in line
    assert "on site h100" in text


@pytest.mark.parametrize("model, nodes_mi300a, nodes_h100", [("glm53", 4, 2), ("kimi27sglang", 4, 2),
                                                            ("llama405bray", 2, 1), ("oss20bdp", 2, 1),
                                                            ("qwen38", 1, 1)])
def test_the_site_gpus_decide_the_nodes(model, nodes_mi300a, nodes_h100, nvidia_env, tmp_path):
    amd = prepare(REPO, model, python="/usr/bin/python3", environ={"HOME": str(tmp_path)})
    nvidia = prepare(REPO, model, site="h100", python="/usr/bin/python3", environ=nvidia_env)
    assert (amd.plan.nodes, nvidia.plan.nodes) == (nodes_mi300a, nodes_h100)
    assert f"--nodes={nodes_h100}" in nvidia.sbatch_args
    if nodes_h100 > 1:
        assert any("INFERENCE_NODES absent" in r for r in nvidia.reasons), nvidia.reasons


def test_the_cuda_image_and_no_attention_backend_for_sglang_on_nvidia(nvidia_env):
    job = prepare(REPO, "qwen38", site="h100", python="/usr/bin/python3", environ=nvidia_env)
    assert "lmsysorg_sglang_v0.5.20-cu129.sif" in job.rank_lines[0]
    assert "--attention-backend" not in job.rank_lines[0]
    assert f"export ENVLAYERS_IMAGE={nvidia_env['SCRATCH']}/sif/lmsysorg_sglang_v0.5.20-cu129.sif\n" in job.script
    assert "export ENVLAYERS_GPU_DEVICES=--nv" in job.script


def test_a_missing_sif_or_runtime_is_one_line_before_submission(nvidia_env, tmp_path):
    os.remove(Path(nvidia_env["SCRATCH"]) / "sif" / "vllm_vllm-openai_v0.28.0.sif")
    job = prepare(REPO, "oss120b", site="h100", python="/usr/bin/python3", environ=nvidia_env)
    said = site_blockers(job)
    assert len(said) == 1 and "apptainer pull " in said[0], job.blockers
    assert "docker://vllm/vllm-openai:v0.28.0" in said[0]
    assert said[0].startswith("experiments/sites/h100.env:")
    bare = {**nvidia_env, "PATH": "/usr/bin:/bin"}
    if shutil.which("apptainer", path=bare["PATH"]) is None:
        job = prepare(REPO, "oss120b", site="h100", python="/usr/bin/python3", environ=bare)
        assert any("apptainer (apptainer) is not installed on this login node" in b for b in job.blockers), job.blockers


def test_an_amd_setting_in_a_shared_layer_is_refused_on_nvidia(nvidia_env, tmp_path):
    mine = tmp_path / "mine.env"
    mine.write_text("SGLANG_ATTENTION_BACKEND=aiter\nHSA_NO_SCRATCH_RECLAIM=1\n")
    job = prepare(REPO, "qwen38", site="h100", env_file=mine, python="/usr/bin/python3", environ=nvidia_env)
    said = site_blockers(job)
    assert [b.split(":")[:2] for b in said] == [[str(mine), "1"], [str(mine), "2"]], job.blockers
    assert all("for AMD GPUs" in b and "GPU_VENDOR=nvidia" in b for b in said)
    # the same lines are fine on an AMD site
    amd = prepare(REPO, "qwen38", env_file=mine, python="/usr/bin/python3", environ={"HOME": str(tmp_path)})
    assert not [b for b in amd.blockers if "for AMD GPUs" in b or "for NVIDIA GPUs" in b], amd.blockers


def test_site_file_rules():
    from envlayers.envfile import Assignment, Origin

    def a(key, line):
        return Assignment(key, ("x",), Origin("experiments/sites/s.env", line), f"{key}=x")

    good = [a(k, i) for i, k in enumerate(sites.REQUIRED, 1)]
    assert sites.site_file_problems(good) == []
    said = sites.site_file_problems(good[1:] + [a("INFERENCE_MODEL", 9)])
    assert said[0].startswith("experiments/sites/s.env:9: INFERENCE_MODEL is a model's decision")
    assert "a site states SLURM_PARTITION" in said[1]


def test_check_covers_every_site_and_names_a_broken_site_file(tmp_path):
    root = tmp_path / "repo"
    shutil.copytree(REPO / "experiments", root / "experiments")
    shutil.copytree(REPO / "containers", root / "containers")
    result = CliRunner().invoke(cli, ["--root", str(root), "check"])
    assert result.exit_code == 0, result.output
    assert "32 site x target stack(s) checked" in result.output
    site = root / "experiments" / "sites" / "h100.env"
    site.write_text(site.read_text().replace("GPU_VENDOR=nvidia\n", "") + "INFERENCE_ENGINE=vllm\n")
    result = CliRunner().invoke(cli, ["--root", str(root), "check"])
    assert result.exit_code == 1
    assert "a site states GPU_VENDOR" in result.output
    assert "INFERENCE_ENGINE is a model's decision" in result.output


def test_a_foreign_setting_in_the_catalog_fails_check(tmp_path):
    root = tmp_path / "repo"
    shutil.copytree(REPO / "experiments", root / "experiments")
    shutil.copytree(REPO / "containers", root / "containers")
    layer = root / "experiments" / "layers" / "model-qwen38.env"
    layer.write_text(layer.read_text() + "SGLANG_ATTENTION_BACKEND=aiter\n")
    result = CliRunner().invoke(cli, ["--root", str(root), "check", "--update"])
    assert result.exit_code == 1
    lines = [line for line in result.output.splitlines() if "for AMD GPUs" in line]
    assert lines and lines[0].startswith("experiments/layers/model-qwen38.env:"), result.output


def test_list_shows_the_sites():
    result = CliRunner().invoke(cli, ["--root", str(REPO), "list", "--json"])
    import json

    data = json.loads(result.output)
    assert {s["name"] for s in data["sites"]} == {"mi300a", "h100"}
    assert [s["default"] for s in data["sites"] if s["name"] == "mi300a"] == [True]
    text = CliRunner().invoke(cli, ["--root", str(REPO), "list"]).output
    assert "SITES" in text and "h100" in text


def test_a_site_file_a_stranger_can_write_is_refused(tmp_path):
    folder = tmp_path / "open"
    folder.mkdir()
    folder.chmod(0o777)
    site = folder / "s.env"
    site.write_text("SLURM_PARTITION=p\n")
    site.chmod(0o666)
    with pytest.raises(EnvLayersError) as err:
        load_env(REPO, "experiment:qwen38", site=str(site))
    assert "writable by others" in str(err.value) or "another user" in str(err.value)
    assert stat.S_IMODE(site.stat().st_mode) == 0o666  # refused, not changed


def test_the_run_records_name_the_site_and_the_endpoint_block_says_it(tmp_path):
    from envlayers.readiness import block
    from envlayers.rundir import EndpointRecord, LaunchRecord

    ep = EndpointRecord("7", "served", "m", "vllm", "single", ["http://n1:8000/v1"], True, str(tmp_path), site="h100")
    assert "model id: m (vllm, single)\nsite: h100\n" in block(ep)
    assert EndpointRecord.from_dict(ep.to_dict()).site == "h100"
    assert "site:" not in block(EndpointRecord.from_dict({**ep.to_dict(), "site": None}))
    launch = LaunchRecord("7", target="experiment:qwen38", site="h100", containers=["c"], container_program="docker")
    assert LaunchRecord.from_dict(launch.to_dict()) == launch
    assert "site" not in LaunchRecord("7").to_dict() and "container_program" not in LaunchRecord("7").to_dict()


def test_plan_names_the_site(nvidia_env):
    result = CliRunner().invoke(cli, ["--root", str(REPO), "plan", "--model", "glm53", "--site", "h100"],
                                env=nvidia_env)
    assert result.exit_code == 0, result.output
    assert "\nsite: h100\n" in result.output and "derived: nodes=2 (INFERENCE_NODES absent" in result.output

