"""What the login node renders for the runtimes beside the Container Engine and podman: charliecloud
(run for real in tests/slurm/test_charliecloud_e2e.py) and Pyxis (checked here against Pyxis's own option
table, since it cannot be installed where the suite runs). The dry run is the job: the options printed
are the ones the launcher builds in the job."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from envlayers.errors import EnvLayersError
from envlayers.jobscript import prepare
from envlayers.runtimes import charliecloud, pyxis

REPO = Path(__file__).resolve().parents[1]
PY = "/usr/bin/python3"


def _site(tmp_path: Path, runtime: str, extra: str = "") -> Path:
    site = tmp_path / "site.env"
    site.write_text("SLURM_PARTITION=gpu\nGPUS_PER_NODE=8\nGPU_MEM_GB=80\nGPU_VENDOR=nvidia\nGPU_NAME=h100\n"
                    f"CONTAINER_RUNTIME={runtime}\nCHECK_WEIGHTS=0\n" + extra)
    return site


def _env(tmp_path: Path) -> dict[str, str]:
    return {"HOME": str(tmp_path), "SCRATCH": str(tmp_path / "scratch"), "PATH": os.environ["PATH"]}


def test_pyxis_runs_the_ranks_step_in_the_container_with_every_option_pyxis_has(tmp_path):
    (tmp_path / "scratch" / "sqsh").mkdir(parents=True)
    (tmp_path / "scratch" / "sqsh" / "vllm_vllm-openai_v0.28.0.sqsh").write_bytes(b"hsqs")
    site = _site(tmp_path, "pyxis", "CONTAINER_IMAGE_DIR=${SCRATCH}/sqsh\nHF_HOME=/shared/hf\n")
    job = prepare(REPO, "oss120b", site=str(site), python=PY, environ=_env(tmp_path))
    sqsh = f"{tmp_path}/scratch/sqsh/vllm_vllm-openai_v0.28.0.sqsh"
    assert job.container[:2] == [f"--container-image={sqsh}", "--container-mounts=${RUN_DIR}:${RUN_DIR},/shared/hf:/shared/hf:ro"]
    assert job.container[-1] == "--no-container-entrypoint"
    env_names = job.container[2].removeprefix("--container-env=").split(",")
    assert "VLLM_API_KEY" in env_names and "HF_HOME" in env_names and "SERVER_API_KEY" not in env_names
    # not wrapped: the rank runs the engine as under the Container Engine
    assert job.rank_lines[0].startswith("VLLM_API_KEY='***' vllm serve openai/gpt-oss-120b ")
    text = job.dry_run_text()
    assert " --no-container-entrypoint bash \"${RUN_DIR}/ranks.sh\"" in text
    assert f"export ENVLAYERS_IMAGE={sqsh}\n" in job.script
    if not pyxis.plugin_enabled():  # this host's Slurm has no Pyxis: one line before submission
        assert any("does not load Pyxis" in b for b in job.blockers), job.blockers
    defs = pytest.importorskip("envlayers.runtimes.definitions")
    from envlayers.jobscript import srun_dry_line

    argv = srun_dry_line(job.plan.nodes, job.edf, job.container).split()
    assert defs.pyxis_problems(argv) == []


def test_pyxis_without_an_image_folder_imports_the_pinned_image_and_says_what_it_costs(tmp_path):
    job = prepare(REPO, "qwen38", site=str(_site(tmp_path, "pyxis")), python=PY, environ=_env(tmp_path))
    assert job.container[0] == "--container-image=lmsysorg/sglang:v0.5.20-cu129"
    assert any("imports lmsysorg/sglang:v0.5.20-cu129 from the registry on every node" in w for w in job.warnings)


def test_pyxis_import_command_for_a_missing_squashfs(tmp_path):
    site = _site(tmp_path, "pyxis", "CONTAINER_IMAGE_DIR=${SCRATCH}/sqsh\n")
    job = prepare(REPO, "qwen38", site=str(site), python=PY, environ=_env(tmp_path))
    said = [b for b in job.blockers if "is not there" in b]
    assert len(said) == 1 and "`enroot import -o " in said[0] and "docker://lmsysorg/sglang:v0.5.20-cu129`" in said[0]


def test_charliecloud_names_what_the_image_directory_lacks_for_its_binds(tmp_path):
    image = tmp_path / "scratch" / "ch" / "vllm_vllm-openai_v0.28.0"
    (image / "etc").mkdir(parents=True)
    for name in ("passwd", "group", "hosts"):
        (image / "etc" / name).touch()
    site = _site(tmp_path, "charliecloud", "CONTAINER_IMAGE_DIR=${SCRATCH}/ch\nHF_HOME=/shared/hf\n")
    job = prepare(REPO, "oss120b", site=str(site), python=PY, environ=_env(tmp_path))
    said = [b for b in job.blockers if "ch-run binds" in b]
    assert len(said) == 1 and "/shared/hf, /etc/resolv.conf" in said[0], job.blockers
    (image / "shared" / "hf").mkdir(parents=True)
    (image / "etc" / "resolv.conf").touch()
    job = prepare(REPO, "oss120b", site=str(site), python=PY, environ=_env(tmp_path))
    assert not [b for b in job.blockers if "ch-run" in b or "is not there" in b], job.blockers
    line = job.rank_lines[0]
    assert (f"ch-run --unset-env=LD_LIBRARY_PATH --unset-env=LD_PRELOAD --unset-env=PYTHONPATH "
            f"--unset-env=PYTHONHOME --unset-env=PYTHONUSERBASE --set-env --bind=/shared/hf:/shared/hf {image} -- "
            "vllm serve openai/gpt-oss-120b ") in line
    assert "VLLM_API_KEY='***'" in line  # by the environment, which ch-run passes on


def test_charliecloud_convert_command_for_a_missing_image(tmp_path):
    site = _site(tmp_path, "charliecloud", "CONTAINER_IMAGE_DIR=${SCRATCH}/ch\n")
    job = prepare(REPO, "qwen38", site=str(site), python=PY, environ=_env(tmp_path))
    said = [b for b in job.blockers if "is not there" in b]
    assert len(said) == 1 and "`ch-convert -i podman lmsysorg/sglang:v0.5.20-cu129 " in said[0]


@pytest.mark.parametrize("runtime", ["apptainer", "charliecloud", "pyxis", "podman"])
def test_ray_shapes_are_refused_for_every_container_runtime_but_the_engines_own(tmp_path, runtime):
    site = tmp_path / "amd.env"
    site.write_text(f"SLURM_PARTITION=p\nGPUS_PER_NODE=4\nGPU_MEM_GB=128\nGPU_VENDOR=amd\nGPU_NAME=mi300\n"
                    f"CONTAINER_RUNTIME={runtime}\nCONTAINER_IMAGE_DIR=/x\nCHECK_WEIGHTS=0\n")
    with pytest.raises(EnvLayersError) as err:
        prepare(REPO, "llama405bray", site=str(site), python=PY, environ=_env(tmp_path))
    assert "cannot run the ray shape" in str(err.value) and err.value.where.startswith(str(site))


def test_a_role_without_an_edf_is_refused_under_the_container_engine(tmp_path):
    site = _site(tmp_path, "ce")
    with pytest.raises(EnvLayersError) as err:
        prepare(REPO, "qwen38", site=str(site), python=PY, environ=_env(tmp_path))
    assert "role sglang-h100 has no EDF" in str(err.value)


def test_image_names_on_shared_storage():
    assert charliecloud.image_name("vllm/vllm-openai:v0.28.0") == "vllm_vllm-openai_v0.28.0"
    assert pyxis.sqsh_name("vllm/vllm-openai:v0.28.0") == "vllm_vllm-openai_v0.28.0.sqsh"


def test_images_list_names_each_image_the_sites_jobs_run_and_the_step_that_makes_it(tmp_path):
    import json

    from click.testing import CliRunner

    from envlayers.cli import cli

    env = {"SCRATCH": str(tmp_path), "ENVLAYERS_ROOT": str(REPO)}
    result = CliRunner().invoke(cli, ["images", "list", "--site", "h100", "--json"], env=env)
    rows = {r["role"]: r for r in json.loads(result.output)}
    assert result.exit_code == 1  # missing ones
    vllm = rows["vllm-h100"]
    assert (vllm["runtime"], vllm["at"], vllm["there"]) == ("apptainer", f"{tmp_path}/sif/vllm_vllm-openai_v0.28.0.sif", False)
    assert vllm["make"] == f"apptainer pull {tmp_path}/sif/vllm_vllm-openai_v0.28.0.sif docker://vllm/vllm-openai:v0.28.0"
    for row in rows.values():
        Path(row["at"]).parent.mkdir(parents=True, exist_ok=True)
        Path(row["at"]).write_bytes(b"SIF")
    result = CliRunner().invoke(cli, ["images", "list", "--site", "h100"], env=env)
    assert result.exit_code == 0 and "[there]" in result.output and "MISSING" not in result.output
    default = CliRunner().invoke(cli, ["images", "list"], env=env)  # the Container Engine site: its SquashFS files
    assert "sglang-mi300 (ce)" in default.output and "registry.sbatch pull sglang-mi300" in default.output


@pytest.mark.parametrize("runtime, at, make", [
    ("podman", "/img/vllm_vllm-openai_v0.28.0.tar", "env_layers images save vllm/vllm-openai:v0.28.0 --to /img"),
    ("docker", "/img/vllm_vllm-openai_v0.28.0.tar", "env_layers images save vllm/vllm-openai:v0.28.0 --to /img"),
    ("singularity", "/img/vllm_vllm-openai_v0.28.0.sif",
     "singularity pull /img/vllm_vllm-openai_v0.28.0.sif docker://vllm/vllm-openai:v0.28.0"),
    ("charliecloud", "/img/vllm_vllm-openai_v0.28.0",
     "podman pull vllm/vllm-openai:v0.28.0 && ch-convert -i podman vllm/vllm-openai:v0.28.0 /img/vllm_vllm-openai_v0.28.0"),
    ("pyxis", "/img/vllm_vllm-openai_v0.28.0.sqsh",
     "enroot import -o /img/vllm_vllm-openai_v0.28.0.sqsh docker://vllm/vllm-openai:v0.28.0"),
])
def test_where_each_runtime_looks_for_an_image_and_the_step_that_puts_it_there(runtime, at, make):
    from envlayers.runtimes import image_step

    env = {"CONTAINER_IMAGE_DIR": "/img", "GPU_VENDOR": "nvidia", "CONTAINER_IMAGE": "ignored/x:1"}
    assert image_step(runtime, env, "vllm/vllm-openai:v0.28.0") == (at, make)
