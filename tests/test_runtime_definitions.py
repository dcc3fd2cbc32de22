"""The option tables of Apptainer and Pyxis (read from their source by scripts/gen-runtime-options.py) and
the checks the rendered command lines go through: each check can fail."""

from __future__ import annotations

import re

import pytest

from envlayers.runtimes import definitions as defs

EXEC_SWITCHES = ("--nv", "--rocm", "--nvccli", "--cleanenv", "--contain", "--containall", "--writable-tmpfs",
                 "--no-home", "--ipc", "--pid", "--net")
EXEC_VALUED = ("--bind", "--env", "--env-file", "--pwd", "--home", "--no-mount")
PYXIS_OPTIONS = {"--container-image": True, "--container-mounts": True, "--container-workdir": True,
                 "--container-name": True, "--container-save": True, "--container-env": True,
                 "--container-mount-home": False, "--no-container-mount-home": False,
                 "--container-remap-root": False, "--container-writable": False, "--container-readonly": False,
                 "--container-entrypoint": False, "--no-container-entrypoint": False}


@pytest.mark.parametrize("name, repo", [("apptainer", "apptainer/apptainer"), ("pyxis", "NVIDIA/pyxis")])
def test_each_table_names_the_source_it_was_read_from(name, repo):
    source = defs.table(name)["source"]
    assert source["repo"] == repo and re.fullmatch(r"[0-9a-f]{40}", source["commit"]), source
    assert re.fullmatch(r"v\d+\.\d+\.\d+", source["tag"]) and source["describe"].startswith(source["tag"]), source


def test_apptainer_table_holds_the_exec_flags_envlayers_uses_and_their_kinds():
    options = defs.table("apptainer")["options"]
    for flag in EXEC_SWITCHES:
        assert options[flag]["takes_value"] is False and options[flag]["kind"] == "bool", flag
    for flag in EXEC_VALUED:
        assert options[flag]["takes_value"] is True, flag
    shorts = {"--bind": "-B", "--cleanenv": "-e", "--contain": "-c", "--containall": "-C", "--home": "-H"}
    assert {flag: options[flag]["short"] for flag in shorts} == shorts
    assert options["--bind"]["kind"] == "stringArray" and options["--env"]["kind"] == "stringToString"
    assert "APPTAINER_CLEANENV" in options["--cleanenv"]["env"] and "APPTAINER_BIND" in options["--bind"]["env"]
    # defined in apptainer.go, registered for exec in action_flags.go: read from the whole package
    assert options["--authfile"]["at"].startswith("cmd/internal/cli/apptainer.go:")
    assert all(re.fullmatch(r"cmd/internal/cli/\w+\.go:\d+", o["at"]) for o in options.values())


def test_the_env_prefix_and_where_apptainer_defines_it():
    data = defs.table("apptainer")
    assert defs.env_prefix() == "APPTAINERENV_" and defs.env_prefix("singularity") == "SINGULARITYENV_"
    assert re.fullmatch(r"internal/pkg/util/env/env\.go:\d+", data["env_prefix"]["at"])
    assert data["flag_env_prefix"]["value"] == "APPTAINER_"


@pytest.mark.parametrize("argv, problems", [
    (["apptainer", "exec", "--nv", "--cleanenv", "--bind", "/a:/a:ro", "/x/img.sif", "vllm", "serve", "m"], 0),
    (["apptainer", "exec", "-e", "-B", "/a:/a", "--rocm", "/x/img.sif", "true"], 0),
    (["singularity", "exec", "-eC", "-B/a:/a", "--pwd=/w", "--nv=true", "--", "/x/img.sif", "true"], 0),
    (["apptainer", "exec", "--env", "A=1,B=2", "--env-file", "/e", "--no-mount", "home,tmp", "/x.sif", "t"], 0),
    (["apptainer", "exec", "--gpus", "/x/img.sif", "true"], 1),  # docker's spelling, not Apptainer's
    (["apptainer", "exec", "-eG", "/x/img.sif", "true"], 1),
    (["apptainer", "exec", "--cleanenv", "--bind"], 1),  # the bind's value is missing (and so the image)
    (["apptainer", "exec", "--nv", "--bind", "/x/img.sif"], 1),  # the image taken as the bind's value
    (["apptainer", "exec", "--pwd", "--nv", "/x/img.sif", "true"], 1),  # pflag takes --nv as the directory
    (["apptainer", "exec", "--nv=yes", "/x/img.sif", "true"], 1),
    (["apptainer", "exec", "--pids-limit=many", "/x/img.sif", "true"], 1),
    (["apptainer", "exec", "--env", "HF_HOME", "/x/img.sif", "true"], 1),  # not NAME=VALUE
    (["apptainer", "exec", "--nohttps", "/x/img.sif", "true"], 1),  # deprecated
    (["apptainer", "run", "/x/img.sif"], 1),
])
def test_apptainer_problems(argv, problems):
    assert len(defs.apptainer_problems(argv)) == problems, defs.apptainer_problems(argv)


def test_apptainer_problems_name_the_word_at_fault():
    assert defs.apptainer_problems(["apptainer", "exec", "--gpus", "/x.sif"]) == [
        "--gpus: apptainer exec has no such option"]
    assert defs.apptainer_problems(["apptainer", "exec", "--nv=yes", "/x.sif"]) == [
        "--nv=yes: --nv is a switch and takes no value"]


def test_pyxis_table_holds_its_options_and_whether_each_takes_a_value():
    options = defs.table("pyxis")["options"]
    assert {name: options[name]["takes_value"] for name in PYXIS_OPTIONS} == PYXIS_OPTIONS
    assert all(o["usage"].startswith("[pyxis] ") and re.fullmatch(r"args\.c:\d+", o["at"]) for o in options.values())
    assert options["--no-container-entrypoint"]["env"] == ["PYXIS_CONTAINER_ENTRYPOINT"]


@pytest.mark.parametrize("argv, problems", [
    (["srun", "--nodes=2", "--container-image=/x.sqsh", "--container-mounts=/a:/a:ro", "--container-env=A,B",
      "--no-container-entrypoint", "bash", "r.sh"], 0),
    (["srun", "--container-image", "/x.sqsh", "--container-writable", "true"], 0),
    (["srun", "--container-imag=/x.sqsh", "true"], 1),
    (["srun", "--no-container-entrypoint=1", "true"], 1),
    (["srun", "--container-image", "--nodes=1", "true"], 1),
    (["srun", "--container-image=/x.sqsh", "--container-entrypoint", "--no-container-entrypoint", "true"], 1),
])
def test_pyxis_problems(argv, problems):
    assert len(defs.pyxis_problems(argv)) == problems, defs.pyxis_problems(argv)
