"""The option tables of Apptainer and Pyxis (read from their source by scripts/gen-runtime-options.py) and
the checks the rendered command lines go through: each check can fail."""

from __future__ import annotations

import re

import pytest

from envlayers.runtimes import definitions as defs


@pytest.mark.parametrize("name", ["apptainer", "pyxis"])
def test_each_table_names_the_source_it_was_read_from(name):
    source = defs.table(name)["source"]
    assert re.fullmatch(r"[0-9a-f]{40}", source["commit"]) and source["repo"] in ("apptainer/apptainer", "NVIDIA/pyxis")


def test_apptainer_table_holds_the_exec_flags_envlayers_uses_and_their_kinds():
    options = defs.table("apptainer")["options"]
    for flag in ("--nv", "--rocm", "--cleanenv", "--contain", "--containall", "--writable-tmpfs", "--no-home"):
        assert options[flag]["takes_value"] is False, flag
    for flag in ("--bind", "--env", "--env-file", "--pwd", "--home", "--no-mount"):
        assert options[flag]["takes_value"] is True, flag
    assert options["--bind"]["short"] == "-B" and options["--cleanenv"]["short"] == "-e"
    assert defs.env_prefix() == "APPTAINERENV_" and defs.env_prefix("singularity") == "SINGULARITYENV_"


@pytest.mark.parametrize("argv, problems", [
    (["apptainer", "exec", "--nv", "--cleanenv", "--bind", "/a:/a:ro", "/x/img.sif", "vllm", "serve", "m"], 0),
    (["apptainer", "exec", "-e", "-B", "/a:/a", "--rocm", "/x/img.sif", "true"], 0),
    (["apptainer", "exec", "--gpus", "/x/img.sif", "true"], 1),  # docker's spelling, not Apptainer's
    (["apptainer", "exec", "--cleanenv", "--bind"], 2),  # the bind's value is missing, and so is the image
    (["apptainer", "exec", "--nv=yes", "/x/img.sif", "true"], 1),
    (["apptainer", "run", "/x/img.sif"], 1),
])
def test_apptainer_problems(argv, problems):
    assert len(defs.apptainer_problems(argv)) == problems, defs.apptainer_problems(argv)


def test_pyxis_table_and_problems():
    options = defs.table("pyxis")["options"]
    assert options["--container-image"]["takes_value"] and options["--container-mounts"]["takes_value"]
    assert not options["--no-container-entrypoint"]["takes_value"]
    good = ["srun", "--nodes=2", "--container-image=/x.sqsh", "--container-mounts=/a:/a:ro",
            "--container-env=A,B", "--no-container-entrypoint", "bash", "r.sh"]
    assert defs.pyxis_problems(good) == []
    assert len(defs.pyxis_problems(["srun", "--container-imag=/x.sqsh", "true"])) == 1
    assert len(defs.pyxis_problems(["srun", "--no-container-entrypoint=1", "true"])) == 1
    assert len(defs.pyxis_problems(["srun", "--container-image", "--nodes=1", "true"])) == 1
