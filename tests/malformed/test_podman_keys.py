"""Bad podman and key input: one clear line (key path + hint), exit 2, nothing submitted or written."""

from __future__ import annotations

import pytest
from malformed_tools import REPO, assert_clean_error, run_cli


@pytest.mark.parametrize("layer, needles", [
    pytest.param("CONTAINER_RUNTIME=podman\nCONTAINER_IMAGE=localhost/x:latest\n",
                 ("mine.env:2: CONTAINER_IMAGE: image 'localhost/x:latest' is tagged 'latest', which moves",), id="latest"),
    pytest.param("CONTAINER_RUNTIME=podman\nCONTAINER_IMAGE=localhost/x\n", ("has no tag",), id="no-tag"),
    pytest.param("CONTAINER_RUNTIME=podman\nCONTAINER_IMAGE=localhost/x@sha256:abc\n", ("malformed digest",),
                 id="short-digest"),
    pytest.param("CONTAINER_RUNTIME=podman\nCONTAINER_IMAGE=localhost/x:1\nCONTAINER_GPU_DEVICES='a b'\n",
                 ("mine.env:3: CONTAINER_GPU_DEVICES: CONTAINER_GPU_DEVICES='a b' is not a list of devices",), id="devices-with-space"),
    pytest.param("CONTAINER_RUNTIME=podman\nCONTAINER_IMAGE=localhost/x:1\nCONTAINER_SHM_SIZE=lots\n",
                 ("mine.env:3: CONTAINER_SHM_SIZE: CONTAINER_SHM_SIZE='lots' is not a size",), id="shm-size"),
    pytest.param("CONTAINER_RUNTIME=rkt\n", ("valid: ce, none, podman, docker, apptainer",), id="unknown-runtime"),
])
def test_bad_podman_layers(tmp_path, layer, needles):
    mine = tmp_path / "mine.env"
    mine.write_text(layer)
    proc = run_cli("serve", "--dry-run", "--model", "oss120b", "--env-file", str(mine), cwd=tmp_path,
                   env={"ENVLAYERS_ROOT": str(REPO)})
    assert_clean_error(proc, *needles)


def test_podman_refuses_a_ray_plan(tmp_path):
    # across nodes podman runs one container per node; Ray would have to cross the container boundary
    mine = tmp_path / "mine.env"
    mine.write_text("CONTAINER_RUNTIME=podman\nCONTAINER_IMAGE=localhost/x:1\n")
    proc = run_cli("serve", "--dry-run", "--model", "llama405bray", "--env-file", str(mine), cwd=tmp_path,
                   env={"ENVLAYERS_ROOT": str(REPO)})
    assert_clean_error(proc, "mine.env:1: CONTAINER_RUNTIME: podman cannot run the ray shape")


@pytest.mark.parametrize("args, needles", [
    pytest.param(("save", "localhost/x:latest", "--to", "out"), ("is tagged 'latest'",), id="save-latest"),
    pytest.param(("save", "nosuchrole", "--to", "out"), ("neither a catalog role nor an image reference",),
                 id="save-unknown-role"),
    pytest.param(("load", "localhost/x:1", "--from", "nowhere"), ("no archive of localhost/x:1 in nowhere",),
                 id="load-missing-archive"),
])
def test_bad_images_arguments(tmp_path, args, needles):
    proc = run_cli("images", *args, cwd=tmp_path, env={"ENVLAYERS_ROOT": str(REPO)})
    assert_clean_error(proc, *needles)
    assert not (tmp_path / "out").exists()
