"""CONTAINER_RUNTIME=docker end to end on the local Slurm cluster: Debian's docker.io, one real Docker daemon
per lab node (as every real node runs its own), the stand-in engine image built offline with podman, saved
to shared storage with `env_layers images save` and loaded by each node's daemon in the job; one node and a
pipeline across two, with a per-job key.

The image carries vLLM's entrypoint (`vllm serve`): `--entrypoint=` clears it, so the launcher's command runs
as given. The daemons run without a bridge or iptables (`--bridge=none --iptables=false`, as HPC nodes often
do): the containers use the node's network.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from labruns import BANNER, REPO, Run

sys.path.insert(0, str(REPO / "tests"))
import podmantools  # noqa: E402

pytestmark = pytest.mark.slurm
SHIM = REPO / "tests" / "docker-shim"


def _netns(lab) -> dict[str, str]:
    out = subprocess.run([str(REPO / "cluster" / "slurm-lab"), "status"], env={**os.environ, **lab.env},
                         capture_output=True, text=True, timeout=30).stdout
    return dict(re.findall(r"^node: name=(\S+) .*netns=(\S+)$", out, re.M))


def docker(sock: Path, *args: str, timeout_s: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["/usr/bin/docker", *args], env={**os.environ, "DOCKER_HOST": f"unix://{sock}"},
                          capture_output=True, text=True, timeout=timeout_s)
    if check and proc.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args)} exited {proc.returncode}: {proc.stderr[-800:]}")
    return proc


@pytest.fixture
def daemons(netns_lab):
    """One dockerd per lab node, in the node's network namespace; their sockets in one folder (the shim
    picks the node's by the namespace it runs in). Stopped by PID, their containers removed first."""
    reason = podmantools.ensure_podman() or podmantools.ensure_debian(("dockerd", "docker"), ("docker.io",))
    if reason:
        pytest.fail(reason) if os.environ.get("ENVLAYERS_REQUIRE_SLURM") == "1" else pytest.skip(reason)
    # short paths: containerd's sockets live under the exec root, and a unix socket path has 108 bytes
    base = Path(f"/tmp/edk-{uuid.uuid4().hex[:6]}")
    base.mkdir(mode=0o700)
    started: dict[str, tuple[subprocess.Popen, Path]] = {}
    try:
        for node, ns in sorted(_netns(netns_lab).items()):
            sock = base / f"{ns}.sock"
            log = open(base / f"{ns}.log", "w")
            proc = subprocess.Popen(
                ["ip", "netns", "exec", ns, str(SHIM / "in-node"), "dockerd", "--data-root", str(base / f"d-{node}"),
                 "--exec-root", str(base / f"x-{node}"), "--host", f"unix://{sock}",
                 "--pidfile", str(base / f"{node}.pid"), "--iptables=false", "--ip6tables=false", "--bridge=none",
                 "--storage-driver=vfs"], stdout=log, stderr=subprocess.STDOUT)
            started[node] = (proc, sock)
        for node, (proc, sock) in started.items():  # each daemon answers, or the test cannot mean anything
            deadline = time.monotonic() + 120
            while docker(sock, "version", check=False, timeout_s=30).returncode != 0:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"dockerd for {node} did not start: {(base / (_netns(netns_lab)[node] + '.log')).read_text()[-1500:]}")
                time.sleep(0.5)
        yield base, {node: sock for node, (_, sock) in started.items()}
    finally:
        for node, (proc, sock) in started.items():
            left = docker(sock, "ps", "-aq", check=False, timeout_s=30).stdout.split()
            if left:
                docker(sock, "rm", "-f", *left, check=False)
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def shared_image(tmp_path_factory):
    """The stand-in image (vLLM's entrypoint) saved to a shared folder, as `env_layers images save` writes it."""
    work = tmp_path_factory.mktemp("docker-img")
    env = podmantools.podman_env(work / "podman-conf")
    ref = f"localhost/envlayers-standin:d{uuid.uuid4().hex[:8]}"
    podmantools.build_standin_image(work / "img", ref, env)
    shared = work / "images"
    try:
        saved = subprocess.run([sys.executable, "-m", "envlayers", "images", "save", ref, "--to", str(shared)],
                               env={**os.environ, **env, "PYTHONPATH": str(REPO / "src")}, capture_output=True,
                               text=True, timeout=600)
        assert saved.returncode == 0, saved.stdout + saved.stderr
    finally:
        podmantools.podman("rmi", "-f", ref, env=env, check=False)
    return ref, shared


def _run(netns_lab, tmp_path, daemons, shared_image, model: str, extra: str = "") -> Run:
    base, _ = daemons
    ref, shared = shared_image
    run = Run(netns_lab, tmp_path, model=model, SERVE_TIME="00:10:00", ENVLAYERS_TEST_DOCKER_SOCKS=str(base))
    run.env["PATH"] = f"{SHIM}:{run.env['PATH']}"
    (tmp_path / "mine.env").write_text(f"CONTAINER_RUNTIME=docker\nCONTAINER_IMAGE={ref}\nCONTAINER_IMAGE_DIR={shared}\n"
                                       "CONTAINER_GPU_DEVICES=none\n" + extra)
    return run


def _models(url: str, key: str) -> str:
    got = subprocess.run(["curl", "-s", "-m", "5", "-H", f"Authorization: Bearer {key}", f"{url}/v1/models"],
                         capture_output=True, text=True, timeout=10)
    return json.loads(got.stdout)["data"][0]["id"] if got.stdout.startswith("{") else got.stdout + got.stderr


def test_docker_serves_one_node_and_release_stops_its_container(netns_lab, tmp_path, daemons, shared_image):
    run = _run(netns_lab, tmp_path, daemons, shared_image, "oss120b")
    dry = run.sbatch(submit=False).stdout
    assert "would refuse" not in dry, dry
    rank0 = next(line for line in dry.splitlines() if line.startswith("#   rank 0: "))
    assert ('docker run --rm --name "envlayers-${SLURM_JOB_ID}-0" --network=host --ipc=host --entrypoint= '
            in rank0) and " --env VLLM_API_KEY " in rank0, rank0
    run.submit()
    text = run.wait_for("^" + re.escape(BANNER), timeout_s=240)
    jid = run.job_id
    log = (run.run_dir / "server-0.log").read_text()
    assert "ENVLAYERS-STAGE: rank 0: loading " in log  # the node's daemon loaded the image from the archive
    key = (run.run_dir / "api-key").read_text().strip()
    assert _models(f"http://{netns_lab.nodes['n1']}:8000", key) == "hpcagent-bench-vllm"
    name = f"envlayers-{jid}-0"
    launch = json.loads((run.run_dir / "launch.json").read_text())
    assert launch["containers"] == [name] and launch["container_program"] == "docker"
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):  # the key on no command line
        try:
            assert key not in cmdline.read_bytes().decode(errors="replace"), cmdline
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            pass
    released = subprocess.run([sys.executable, "-m", "envlayers", "release", jid], cwd=run.dir,
                              env=dict(run.env, PYTHONPATH=str(REPO / "src")), capture_output=True, text=True,
                              timeout=180)
    assert released.returncode == 0, released.stdout + released.stderr
    assert f"2b. containers: done: docker stop {name}" in released.stdout
    run.state()
    _, socks = daemons
    assert docker(socks["n1"], "ps", "-aq", "--filter", f"name={name}").stdout.strip() == ""


def test_docker_serves_a_pipeline_across_two_nodes_one_daemon_each(netns_lab, tmp_path, daemons, shared_image):
    run = _run(netns_lab, tmp_path, daemons, shared_image, "glm53", "INFERENCE_NODES=2\nPIPELINE_PARALLEL_SIZE=2\n")
    assert "would refuse" not in run.sbatch(submit=False).stdout
    run.submit()
    text = run.wait_for("^" + re.escape(BANNER), timeout_s=240)
    assert "ENVLAYERS-TOPOLOGY: shape=pipeline nodes=2 gpus_per_node=4 tp=4 pp=2" in text
    for rank in (0, 1):
        assert f"ENVLAYERS-STAGE: rank {rank} up on n{rank + 1}" in (run.run_dir / f"server-{rank}.log").read_text()
    key = (run.run_dir / "api-key").read_text().strip()
    assert _models(f"http://{netns_lab.nodes['n1']}:8000", key) == "hpcagent-bench-vllm"
    _, socks = daemons
    for rank, node in enumerate(("n1", "n2")):  # each rank's container on its own node's daemon
        names = docker(socks[node], "ps", "--format", "{{.Names}}").stdout.split()
        assert names == [f"envlayers-{run.job_id}-{rank}"], (node, names)
    netns_lab.cancel(run.job_id)
    assert run.state() == "CANCELLED"
