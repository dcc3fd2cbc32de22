"""CONTAINER_RUNTIME=charliecloud end to end on the local Slurm cluster: Debian's charliecloud (ch-run, run
unprivileged), the stand-in engine image built offline with podman and converted to a directory on shared
storage with ch-convert, as an operator would from the pinned image; one node and a pipeline across two,
each with a per-job key.

The image carries vLLM's entrypoint (`vllm serve`), which ch-run never runs: the launcher's command runs as
given. Before submission the login node names what the image lacks for ch-run's binds (the files ch-run
binds from the host), and the test adds them the way the message says.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from labruns import BANNER, REPO, Run

sys.path.insert(0, str(REPO / "tests"))
import podmantools  # noqa: E402

pytestmark = pytest.mark.slurm
PINNED = "localhost/envlayers-standin:ch1"  # the pinned reference the image directory is named after


@pytest.fixture(scope="module")
def ch_image(tmp_path_factory):
    """The stand-in image as a directory on shared storage: built with podman, converted with ch-convert."""
    for reason in (podmantools.ensure_podman(), podmantools.ensure_debian(("ch-run", "ch-convert"), ("charliecloud",))):
        if reason:
            pytest.fail(reason) if os.environ.get("ENVLAYERS_REQUIRE_SLURM") == "1" else pytest.skip(reason)
    work = tmp_path_factory.mktemp("ch")
    env = podmantools.podman_env(work / "podman-conf")
    ref = f"localhost/envlayers-standin:t{uuid.uuid4().hex[:8]}"
    podmantools.build_standin_image(work / "img", ref, env)
    shared = work / "images"
    shared.mkdir()
    from envlayers.runtimes.charliecloud import image_name

    target = shared / image_name(PINNED)
    try:
        proc = subprocess.run(["ch-convert", "-i", "podman", ref, str(target)], env={**os.environ, **env},
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-800:] + proc.stderr[-800:]
    finally:
        podmantools.podman("rmi", "-f", ref, env=env, check=False)
    yield shared, target


def _layer(shared: Path, extra: str = "") -> str:
    return ("CONTAINER_RUNTIME=charliecloud\n"
            f"CONTAINER_IMAGE={PINNED}\n"
            f"CONTAINER_IMAGE_DIR={shared}\n" + extra)


def _dry(run: Run) -> str:
    proc = run.sbatch(submit=False)
    return proc.stdout


def test_charliecloud_serves_one_node_with_the_key_by_name(netns_lab, tmp_path, ch_image):
    shared, image = ch_image
    run = Run(netns_lab, tmp_path, model="oss120b", SERVE_TIME="00:10:00")
    (tmp_path / "mine.env").write_text(_layer(shared))
    dry = _dry(run)
    # ch-convert's directory has no /etc/passwd or /etc/group, which ch-run binds from the host: named first
    refused = [line for line in dry.splitlines() if line.startswith("# would refuse to submit:")]
    assert len(refused) == 1 and "/etc/passwd" in refused[0] and "/etc/group" in refused[0], refused
    for name in ("passwd", "group"):
        (image / "etc" / name).touch()
    dry = _dry(run)
    assert "would refuse" not in dry, dry
    rank0 = next(line for line in dry.splitlines() if line.startswith("#   rank 0: "))
    assert f"ch-run --unset-env=LD_LIBRARY_PATH" in rank0 and f" --set-env {image} -- vllm serve " in rank0
    run.submit()
    text = run.wait_for("^" + re.escape(BANNER), timeout_s=180)
    assert f"rank 0 runs in charliecloud: ch-run " in text
    key = (run.run_dir / "api-key").read_text().strip()
    n1 = netns_lab.nodes["n1"]
    got = subprocess.run(["curl", "-s", "-m", "5", "-H", f"Authorization: Bearer {key}",
                          f"http://{n1}:8000/v1/models"], capture_output=True, text=True, timeout=10)
    assert json.loads(got.stdout)["data"][0]["id"] == "hpcagent-bench-vllm", got.stdout + got.stderr
    no_key = subprocess.run(["curl", "-s", "-m", "5", "-o", "/dev/null", "-w", "%{http_code}",
                             f"http://{n1}:8000/v1/models"], capture_output=True, text=True, timeout=10)
    assert no_key.stdout == "401"
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):  # the key on no command line
        try:
            assert key not in cmdline.read_bytes().decode(errors="replace"), cmdline
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            pass
    netns_lab.cancel(run.job_id)
    assert run.state() == "CANCELLED"
    run.assert_nothing_left()


def test_charliecloud_serves_a_pipeline_across_two_nodes(netns_lab, tmp_path, ch_image):
    shared, image = ch_image
    for name in ("passwd", "group"):
        (image / "etc" / name).touch()
    run = Run(netns_lab, tmp_path, model="glm53", SERVE_TIME="00:10:00")
    (tmp_path / "mine.env").write_text(_layer(shared, "INFERENCE_NODES=2\nPIPELINE_PARALLEL_SIZE=2\n"))
    assert "would refuse" not in _dry(run)
    run.submit()
    text = run.wait_for("^" + re.escape(BANNER), timeout_s=180)
    assert "ENVLAYERS-TOPOLOGY: shape=pipeline nodes=2 gpus_per_node=4 tp=4 pp=2" in text
    for rank in (0, 1):
        log = (run.run_dir / f"server-{rank}.log").read_text()
        assert f"ENVLAYERS-STAGE: rank {rank} up on n{rank + 1}" in log, log
    key = (run.run_dir / "api-key").read_text().strip()
    got = subprocess.run(["curl", "-s", "-m", "5", "-H", f"Authorization: Bearer {key}",
                          f"http://{netns_lab.nodes['n1']}:8000/v1/models"], capture_output=True, text=True,
                         timeout=10)
    assert json.loads(got.stdout)["data"][0]["id"] == "hpcagent-bench-vllm", got.stdout + got.stderr
    netns_lab.cancel(run.job_id)
    assert run.state() == "CANCELLED"
    run.assert_nothing_left()
