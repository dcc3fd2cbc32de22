"""CONTAINER_RUNTIME=podman end to end on the local Slurm cluster: real podman, a stand-in engine image
built offline (podman import), saved to a shared directory and loaded from it by the job, the same
engine command inside `podman run`, published on the node's 127.0.0.1 only (SERVER_HOST=127.0.0.1), with a
per-job key."""

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


def env_layers(run: Run, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "envlayers", *args], cwd=run.dir,
                          env=dict(run.env, PYTHONPATH=str(REPO / "src")), capture_output=True, text=True,
                          timeout=timeout_s)


def netns_of(lab, node: str) -> str:
    out = subprocess.run([str(REPO / "cluster" / "slurm-lab"), "status"], env={**os.environ, **lab.env},
                         capture_output=True, text=True, timeout=30).stdout
    return dict(re.findall(r"^node: name=(\S+) .*netns=(\S+)$", out, re.M))[node]


@pytest.fixture
def podman_env(tmp_path):
    reason = podmantools.ensure_podman()
    if reason:
        pytest.fail(reason) if os.environ.get("ENVLAYERS_REQUIRE_SLURM") == "1" else pytest.skip(reason)
    return podmantools.podman_env(tmp_path / "podman-conf")


def _saved_standin(netns_lab, tmp_path, podman_env, model: str) -> tuple[Run, str, Path]:
    """A run of ``model`` and the stand-in image (with vLLM's entrypoint) saved to a shared folder with
    `env_layers images save` and removed from the host, so the job's nodes load it from there."""
    image = f"localhost/envlayers-standin:t{uuid.uuid4().hex[:8]}"
    podmantools.build_standin_image(tmp_path / "img", image, podman_env)
    shared = tmp_path / "shared-images"
    run = Run(netns_lab, tmp_path, model=model, SERVE_TIME="00:10:00", **podman_env)
    # the lab's nodes are network namespaces whose /sys hides the cgroup mounts runc needs: a test-only
    # shim (tests/podman-shim/podman) mounts them again, privately, before running the real podman
    run.env["PATH"] = f"{REPO / 'tests' / 'podman-shim'}:{run.env['PATH']}"
    try:
        saved = env_layers(run, "images", "save", image, "--to", str(shared))
        assert saved.returncode == 0, saved.stderr
        assert (shared / podmantools_archive(image)).is_file()
    finally:
        podmantools.podman("rmi", "-f", image, env=podman_env, check=False)  # the job loads it from the archive
    return run, image, shared


def test_podman_job_loads_the_image_offline_and_serves_on_the_nodes_loopback(netns_lab, tmp_path, podman_env):
    run, image, shared = _saved_standin(netns_lab, tmp_path, podman_env, "oss120b")
    try:
        (tmp_path / "mine.env").write_text(
            "CONTAINER_RUNTIME=podman\n"
            f"CONTAINER_IMAGE={image}\n"
            f"CONTAINER_IMAGE_DIR={shared}\n"
            "CONTAINER_GPU_DEVICES=none\n"  # the lab has no GPUs; sites get nvidia.com/gpu=all or /dev/kfd,/dev/dri
            "SERVER_API_KEY_FILE=generate\n"
            "SERVER_HOST=127.0.0.1\n")  # published on the node's loopback; the engine binds the container's interface
        dry = run.sbatch(submit=False).stdout
        rank0 = next(line for line in dry.splitlines() if line.startswith("#   rank 0: "))
        assert ("podman run --rm --replace --name \"envlayers-${SLURM_JOB_ID}-0\" --ipc=host --entrypoint= "
                "--publish 127.0.0.1:8000:8000 ") in rank0
        assert " --env VLLM_API_KEY " in rank0 and f" {image} vllm serve openai/gpt-oss-120b " in rank0
        assert " --host 0.0.0.0 " in rank0  # inside the container: what the publish needs
        assert "would refuse" not in dry
        run.submit()
        text = run.wait_for("^" + re.escape(BANNER), timeout_s=120)
        jid = run.job_id
        assert "base URL: http://127.0.0.1:8000/v1" in text
        assert f"reach: on n1 only (SERVER_HOST binds loopback); from elsewhere open a tunnel: env_layers tunnel {run.job_id}" in text
        log = (run.run_dir / "server-0.log").read_text()
        assert f"ENVLAYERS-STAGE: rank 0: loading {image} from {shared}/" in log
        assert json.loads((run.run_dir / "launch.json").read_text())["containers"] == [f"envlayers-{jid}-0"]

        key = (run.run_dir / "api-key").read_text().strip()
        ns = netns_of(netns_lab, "n1")
        node_addr = netns_lab.nodes["n1"]

        def on_node(*argv: str) -> subprocess.CompletedProcess:
            return subprocess.run(["ip", "netns", "exec", ns, *argv], capture_output=True, text=True, timeout=30)

        # the container answers on the node's loopback, with the key; not on the node's address
        models = on_node("curl", "-s", "-m", "5", "-H", f"Authorization: Bearer {key}",
                         "http://127.0.0.1:8000/v1/models")
        assert json.loads(models.stdout)["data"][0]["id"] == "hpcagent-bench-vllm", models.stdout + models.stderr
        no_key = on_node("curl", "-s", "-m", "5", "-o", "/dev/null", "-w", "%{http_code}",
                         "http://127.0.0.1:8000/v1/models")
        assert no_key.stdout == "401"
        outside = subprocess.run(["curl", "-s", "-m", "3", "-o", "/dev/null", "-w", "%{http_code}",
                                  f"http://{node_addr}:8000/v1/models"], capture_output=True, text=True, timeout=10)
        assert outside.stdout == "000"  # nothing listens on the node's fabric address
        listening = on_node("ss", "-Hltn").stdout
        assert "127.0.0.1:8000" in listening and "0.0.0.0:8000" not in listening

        # the container runs under its stable name; the key is on no command line
        # (`podman inspect` by name: `podman ps` cannot join the netns the shim's private mounts hold)
        name = f"envlayers-{jid}-0"
        state = podmantools.podman("inspect", "--format", "{{.State.Status}}", name, env=podman_env).stdout.strip()
        assert state == "running"
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                assert key not in cmdline.read_bytes().decode(errors="replace"), cmdline
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                pass

        released = env_layers(run, "release", jid)
        assert released.returncode == 0, released.stdout + released.stderr
        assert f"2b. containers: done: podman stop {name}" in released.stdout
        run.state()
        gone = podmantools.podman("container", "exists", name, env=podman_env, check=False)
        assert gone.returncode == 1  # stopped with the job and removed (--rm)
        holding = [str(p) for p in tmp_path.rglob("*") if p.is_file() and p.suffix != ".tar"
                   and p != run.run_dir / "api-key" and "rootfs" not in p.parts
                   and key in p.read_text(errors="replace")]
        assert not holding, holding
    finally:
        podmantools.podman("rmi", "-f", image, env=podman_env, check=False)


def test_podman_serves_a_pipeline_across_two_nodes_one_container_each(netns_lab, tmp_path, podman_env):
    # the image carries vLLM's entrypoint (`vllm serve`): the launcher's command runs in its place
    run, image, shared = _saved_standin(netns_lab, tmp_path, podman_env, "glm53")
    try:
        (tmp_path / "mine.env").write_text(
            "CONTAINER_RUNTIME=podman\n"
            f"CONTAINER_IMAGE={image}\n"
            f"CONTAINER_IMAGE_DIR={shared}\n"
            "CONTAINER_GPU_DEVICES=none\n"
            "INFERENCE_NODES=2\nPIPELINE_PARALLEL_SIZE=2\n")  # glm53 scaled from 4 nodes to the lab's 2
        dry = run.sbatch(submit=False).stdout
        assert "would refuse" not in dry, dry
        ranks = [line for line in dry.splitlines() if line.startswith("#   rank ")]
        assert len(ranks) == 2 and all(" --entrypoint= --network=host " in r for r in ranks), ranks
        assert all("--publish" not in r for r in ranks)
        run.submit()
        text = run.wait_for("^" + re.escape(BANNER), timeout_s=180)
        jid = run.job_id
        assert "ENVLAYERS-TOPOLOGY: shape=pipeline nodes=2 gpus_per_node=4 tp=4 pp=2" in text
        names = [f"envlayers-{jid}-0", f"envlayers-{jid}-1"]
        assert json.loads((run.run_dir / "launch.json").read_text())["containers"] == names
        for rank in (0, 1):
            log = (run.run_dir / f"server-{rank}.log").read_text()
            assert f"ENVLAYERS-STAGE: rank {rank} up on n{rank + 1}" in log, log
        key = (run.run_dir / "api-key").read_text().strip()
        n1 = netns_lab.nodes["n1"]
        # the engine binds the node's own interfaces (the node's network): node 0 answers on its address
        got = subprocess.run(["curl", "-s", "-m", "5", "-H", f"Authorization: Bearer {key}",
                              f"http://{n1}:8000/v1/models"], capture_output=True, text=True, timeout=10)
        assert json.loads(got.stdout)["data"][0]["id"] == "hpcagent-bench-vllm", got.stdout + got.stderr
        released = env_layers(run, "release", jid)
        assert released.returncode == 0, released.stdout + released.stderr
        assert f"2b. containers: done: podman stop {names[0]} {names[1]}" in released.stdout
        run.state()
        for name in names:
            assert podmantools.podman("container", "exists", name, env=podman_env, check=False).returncode == 1
    finally:
        podmantools.podman("rmi", "-f", image, env=podman_env, check=False)


def podmantools_archive(image: str) -> str:
    from envlayers.runtimes.podman import archive_name

    return archive_name(image)
