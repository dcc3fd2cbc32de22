"""Cache folders relocated by a symbolic link are bound into the container at their real path.

Real links in tmp_path: the EDF that ``install-edfs`` writes and podman's ``-v`` options name the real
folder, so nothing dangles inside the container; a layout without links renders exactly as before.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from envlayers import edf, edfinstall
from envlayers.runtimes import podman
from envlayers.edf.render import resolve_edf, split_mount
from envlayers.runtimes.binds import is_cache_key, real

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def relocated(tmp_path):
    """$SCRATCH/.cache/huggingface -> <elsewhere>/hf (the quota escape), and a scratch that is a link."""
    elsewhere = tmp_path / "capstor" / "hf"
    elsewhere.mkdir(parents=True)
    scratch = tmp_path / "scratch"
    (scratch / ".cache").mkdir(parents=True)
    (scratch / ".cache" / "huggingface").symlink_to(elsewhere)
    return tmp_path, scratch, elsewhere


def test_real_names_the_target_only_when_a_link_lies_on_the_path(relocated):
    tmp_path, scratch, elsewhere = relocated
    assert real(str(scratch / ".cache" / "huggingface")) == str(elsewhere)
    assert real(str(scratch / ".cache" / "huggingface" / "hub" / "not-yet")) == str(elsewhere / "hub" / "not-yet")
    assert real(str(scratch)) is None and real("relative/path") is None and real("/no/such/place") is None


@pytest.mark.parametrize("name, cache", [
    ("HF_HOME", True), ("TRITON_CACHE_DIR", True), ("VLLM_CACHE_ROOT", True), ("MIOPEN_USER_DB_PATH", True),
    ("XDG_CACHE_HOME", True), ("SGLANG_CACHE_DIR", True), ("PATH", False), ("LD_LIBRARY_PATH", False),
    ("HWLOC_COMPONENTS", False),
])
def test_cache_keys(name, cache):
    assert is_cache_key(name) is cache


@pytest.mark.parametrize("spec, want", [
    ("/a", ("/a", "/a", None)), ("/a:/b", ("/a", "/b", None)), ("/a:/b:ro+private", ("/a", "/b", "ro+private")),
    ("${SCRATCH}:${SCRATCH}", ("${SCRATCH}", "${SCRATCH}", None)),
])
def test_split_mount(spec, want):
    assert split_mount(spec) == want


def test_the_edf_binds_the_real_cache_folder_and_points_the_variable_at_it(relocated):
    tmp_path, scratch, elsewhere = relocated
    data = edf.edf_dict("vllm-mi300", "single", REPO, {"SCRATCH": str(scratch)})
    assert data["env"]["HF_HOME"] == str(elsewhere)
    assert f"{elsewhere}:{elsewhere}" in data["mounts"]
    assert data["mounts"][0] == "${SCRATCH}:${SCRATCH}"  # no link on scratch itself: kept for the CE to expand
    assert data["env"]["TRITON_CACHE_DIR"] == "${SCRATCH}/.cache/envlayers/vllm-mi300/triton"  # not a link
    # what install-edfs writes parses back to the same data
    text = edf.render_edf("vllm-mi300", "single", REPO, {"SCRATCH": str(scratch)})
    assert tomllib.loads(text.split("\n\n", 1)[1]) == data


def test_a_bind_source_that_is_a_link_is_bound_from_its_target(tmp_path):
    real_scratch = tmp_path / "capstor" / "u"
    real_scratch.mkdir(parents=True)
    (tmp_path / "scratch").symlink_to(real_scratch)
    data = resolve_edf({"mounts": ["${SCRATCH}:${SCRATCH}", "/nonexistent:/x:ro"],
                        "env": {"HF_HOME": "${SCRATCH}/hf", "PATH": "/usr/bin"}}, {"SCRATCH": str(tmp_path / "scratch")})
    assert data["mounts"] == [f"{real_scratch}:${{SCRATCH}}", "/nonexistent:/x:ro",
                              f"{real_scratch}/hf:{real_scratch}/hf"]
    assert data["env"] == {"HF_HOME": f"{real_scratch}/hf", "PATH": "/usr/bin"}


def test_without_links_or_with_scratch_unset_the_edf_is_as_before(tmp_path):
    plain = edf.render_edf("sglang-mi300", "pipeline", REPO)
    assert edf.render_edf("sglang-mi300", "pipeline", REPO, {"SCRATCH": str(tmp_path)}) == plain
    assert edf.render_edf("sglang-mi300", "pipeline", REPO, {}) == plain


def test_install_edfs_writes_the_resolved_paths(relocated):
    tmp_path, scratch, elsewhere = relocated
    dest = tmp_path / "edfs"
    results = edfinstall.install(REPO, dest, environ={"SCRATCH": str(scratch), "HOME": str(tmp_path)})
    written = tomllib.loads((dest / "hpcagent-bench-sglang-mi300-latest.toml").read_text().split("\n\n", 1)[1])
    assert written["env"]["HF_HOME"] == str(elsewhere) and f"{elsewhere}:{elsewhere}" in written["mounts"]
    assert all(r.status == "written" for r in results)


def test_podman_binds_the_real_folder_at_the_path_the_variable_names(relocated):
    tmp_path, scratch, elsewhere = relocated
    link = str(scratch / ".cache" / "huggingface")
    s = podman.Settings("localhost/img:1", ())
    argv = podman.run_argv(s, "7", 0, 8000, ["HF_HOME"], {"HF_HOME": link, "CONTAINER_MOUNTS": str(scratch)})
    vols = [argv[i + 1] for i, w in enumerate(argv) if w == "-v"]
    assert vols == [f"{elsewhere}:{link}:ro", f"{scratch}:{scratch}:ro"]


def test_edf_show_prints_what_install_edfs_writes(relocated, monkeypatch):
    from click.testing import CliRunner

    from envlayers.cli import cli

    tmp_path, scratch, elsewhere = relocated
    dest = tmp_path / "edfs"
    monkeypatch.setenv("SCRATCH", str(scratch))
    monkeypatch.setenv("HOME", str(tmp_path))
    edfinstall.install(REPO, dest)
    shown = CliRunner().invoke(cli, ["--root", str(REPO), "edf", "show", "sglang-mi300", "--topology", "pipeline"])
    assert shown.exit_code == 0, shown.output
    assert shown.output == (dest / "hpcagent-bench-sglang-mi300-latest.toml").read_text()
    assert f"{elsewhere}:{elsewhere}" in shown.output
