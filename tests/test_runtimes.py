"""CONTAINER_RUNTIME=podman, pure parts and ranks.sh through real bash (podman itself runs in
tests/slurm/test_podman_e2e.py; here a recording stub stands in for it)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from envlayers import engines, topology
from envlayers.errors import EnvLayersError
from envlayers.launch.prepare import Allocation, Node, prepare
from envlayers.access.release import stop_containers
from envlayers.runtimes import podman, runtime_name

SINGLE_VLLM = {"INFERENCE_ENGINE": "vllm", "INFERENCE_MODEL": "Qwen/Qwen3-8B", "VLLM_SERVED_MODEL": "q",
               "CONTAINER_RUNTIME": "podman", "ENVLAYERS_IMAGE": "localhost/img:1", "ENVLAYERS_GPU_DEVICES": ""}


@pytest.mark.parametrize("env, role_gpu, devices", [
    pytest.param({}, "rocm6", ("/dev/kfd", "/dev/dri"), id="amd-role"),
    pytest.param({}, "cuda12", ("nvidia.com/gpu=all",), id="nvidia-role"),
    pytest.param({}, None, ("nvidia.com/gpu=all",), id="no-role"),
    pytest.param({"CONTAINER_GPU_DEVICES": "none"}, "rocm6", (), id="none"),
    pytest.param({"CONTAINER_GPU_DEVICES": "amd.com/gpu=all, /dev/infiniband"}, None,
                 ("amd.com/gpu=all", "/dev/infiniband"), id="explicit"),
])
def test_devices(env, role_gpu, devices):
    s = podman.settings({"CONTAINER_IMAGE": "docker.io/vllm/vllm-openai:v0.11.0", **env}, role_gpu=role_gpu)
    assert s.devices == devices


@pytest.mark.parametrize("env, role_image, image", [
    pytest.param({"CONTAINER_IMAGE": "localhost/a:1"}, "vllm/x:2", "localhost/a:1", id="key-wins"),
    pytest.param({}, "vllm/x:2", "vllm/x:2", id="role-image"),
    pytest.param({}, "vllm/x@sha256:" + "a" * 64, "vllm/x@sha256:" + "a" * 64, id="digest"),
])
def test_image(env, role_image, image):
    assert podman.settings(env, role_image).image == image


@pytest.mark.parametrize("env, role_image, message", [
    pytest.param({"CONTAINER_IMAGE": "vllm/x:latest"}, None, "tagged 'latest'", id="latest"),
    pytest.param({}, "vllm/x:latest", "tagged 'latest'", id="role-latest"),
    pytest.param({}, None, "CONTAINER_IMAGE is not set", id="none"),
])
def test_image_refused(env, role_image, message):
    with pytest.raises(EnvLayersError, match=message):
        podman.settings(env, role_image)


@pytest.mark.parametrize("host, publish", [
    pytest.param(None, "0.0.0.0:8000:8000", id="absent-every-interface"),
    pytest.param("127.0.0.1", "127.0.0.1:8000:8000", id="loopback"),
    pytest.param("::1", "[::1]:8000:8000", id="ipv6-in-brackets"),
    pytest.param("10.1.2.3", "10.1.2.3:8000:8000", id="one-address"),
])
def test_the_node_publishes_where_server_host_says(host, publish):
    env = {} if host is None else {"SERVER_HOST": host}
    argv = podman.run_argv(podman.Settings("localhost/img:1", ()), "77", 0, 8000, [], env)
    assert argv[argv.index("--publish") + 1] == publish


@pytest.mark.parametrize("host", [None, "127.0.0.1", "10.1.2.3"])
def test_under_podman_the_engine_binds_the_containers_own_interface(host):
    from envlayers.engines.command import server_host

    env = {"CONTAINER_RUNTIME": "podman", **({} if host is None else {"SERVER_HOST": host})}
    assert server_host(env) == "0.0.0.0"
    assert server_host({k: v for k, v in env.items() if k != "CONTAINER_RUNTIME"}) == (host or "0.0.0.0")


def test_run_argv_publishes_loopback_mounts_weights_read_only_and_passes_names_only():
    s = podman.Settings("localhost/img:1", ("nvidia.com/gpu=all",))
    env = {"HF_HOME": "/shared/hf", "INFERENCE_MODEL": "/models/q", "CONTAINER_MOUNTS": "/a:rel:/b",
           "SERVER_HOST": "127.0.0.1"}
    argv = podman.run_argv(s, "77", 0, 8000, ["VLLM_API_KEY", "HF_HOME", "HF_HOME"], env)
    assert argv == ["podman", "run", "--rm", "--replace", "--name", "envlayers-77-0", "--ipc=host",
                    "--entrypoint=", "--publish", "127.0.0.1:8000:8000", "--device", "nvidia.com/gpu=all",
                    "-v", "/shared/hf:/shared/hf:ro", "-v", "/models/q:/models/q:ro", "-v", "/a:/a:ro",
                    "-v", "/b:/b:ro", "--env", "HF_HOME", "--env", "VLLM_API_KEY", "localhost/img:1"]
    shm = podman.run_argv(s, "77", 0, 8000, [], {"CONTAINER_SHM_SIZE": "64g"})
    assert "--shm-size=64g" in shm and "--ipc=host" not in shm


def test_a_plan_across_nodes_runs_podman_on_the_nodes_network_and_the_engine_binds_server_host():
    from envlayers.engines.command import server_host

    s = podman.Settings("localhost/img:1", ())
    argv = podman.run_argv(s, "77", 1, 8000, [], {"SERVER_HOST": "127.0.0.1"}, nodes=2)
    assert "--network=host" in argv and "--publish" not in argv and "--entrypoint=" in argv
    env = {"SERVER_HOST": "10.0.0.5", "CONTAINER_RUNTIME": "podman"}
    assert (server_host(env, 1), server_host(env, 2)) == ("0.0.0.0", "10.0.0.5")


def test_passed_names_keep_host_paths_and_the_raw_key_out():
    names = podman.passed_names(["PATH", "HF_HOME", "SERVER_API_KEY", "ENVLAYERS_IMAGE", "HOME"], {"NCCL_X": "1"},
                                "VLLM_API_KEY")
    assert names == ["HF_HOME", "NCCL_X", "VLLM_API_KEY"]


@pytest.mark.parametrize("image, name", [
    pytest.param("localhost/envlayers-standin:1", "localhost_envlayers-standin_1.tar", id="tag"),
    pytest.param("docker.io/vllm/vllm-openai:v0.11.0", "docker.io_vllm_vllm-openai_v0.11.0.tar", id="registry"),
])
def test_archive_name(image, name):
    assert podman.archive_name(image) == name


def test_runtime_name():
    assert runtime_name({}) == "ce" and runtime_name({"CONTAINER_RUNTIME": "podman"}) == "podman"
    assert runtime_name({"CONTAINER_RUNTIME": "docker"}) == "docker"
    with pytest.raises(EnvLayersError, match="valid: ce, none, podman, docker, apptainer, singularity, charliecloud, pyxis"):
        runtime_name({"CONTAINER_RUNTIME": "rkt"})


@pytest.mark.parametrize("host, url, probe", [
    pytest.param("127.0.0.1", "http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1", id="published-on-loopback"),
    pytest.param(None, "http://n1:8000/v1", "http://10.0.0.1:8000/v1", id="published-everywhere"),
])
def test_prepare_probes_where_the_port_is_published_and_names_the_container(tmp_path, host, url, probe):
    keys = {**SINGLE_VLLM, **({"SERVER_HOST": host} if host else {})}
    lp = prepare(keys, Allocation("9", tmp_path, (Node("n1", "10.0.0.1", True),), api_key=True))
    assert [t.url for t in lp.targets] == [url]
    assert [t.probe_url for t in lp.targets] == [probe]
    assert lp.node_local == (host is not None)
    assert "--host 0.0.0.0" in shlex.join(lp.commands[0].argv)
    assert json.loads(lp.files["launch.json"])["containers"] == ["envlayers-9-0"]
    assert "--environment" not in " ".join(lp.srun)
    assert any(line.startswith("ENVLAYERS-STAGE: rank 0 runs in podman: podman run --rm --replace --name "
                               "envlayers-9-0 ") for line in lp.lines)


STUB = """#!/bin/bash
# records each call: argv and whether VLLM_API_KEY reached podman's environment
python3 - "$@" <<'PY'
import json, os, sys
with open(os.environ["STUB_LOG"], "a") as fh:
    fh.write(json.dumps({"argv": sys.argv[1:], "key_env": os.environ.get("VLLM_API_KEY")}) + "\\n")
PY
case "$1 $2" in
  "image exists") exit "${STUB_EXISTS:-1}" ;;
esac
exit 0
"""


@pytest.mark.parametrize("exists, image_dir, loads, code", [
    pytest.param("0", "/shared/img", False, 0, id="present"),
    pytest.param("1", "/shared/img", True, 0, id="loaded-from-archive"),
    pytest.param("1", None, False, 2, id="missing-no-archive"),
])
def test_ranks_sh_loads_then_runs_podman_with_the_key_by_name(tmp_path, exists, image_dir, loads, code):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "podman").write_text(STUB)
    (bin_dir / "podman").chmod(0o755)
    keys = dict(SINGLE_VLLM, **({"CONTAINER_IMAGE_DIR": image_dir} if image_dir else {}))
    lp = prepare(keys, Allocation("9", tmp_path, (Node("n1", "10.0.0.1", True),), api_key=True))
    (tmp_path / "ranks.sh").write_text(lp.files["ranks.sh"])
    key = "k3y-" + os.urandom(6).hex()
    proc = subprocess.run(["bash", str(tmp_path / "ranks.sh")], capture_output=True, text=True, timeout=30,
                          env={"SLURM_PROCID": "0", "PATH": f"{bin_dir}:{os.environ['PATH']}", "SERVER_API_KEY": key,
                               "STUB_LOG": str(tmp_path / "calls.jsonl"), "STUB_EXISTS": exists})
    assert proc.returncode == code, (tmp_path / "server-0.log").read_text()
    calls = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    assert calls[0]["argv"] == ["image", "exists", "localhost/img:1"]
    assert any(c["argv"][:2] == ["load", "-i"] for c in calls) is loads
    if loads:
        assert ["load", "-i", "/shared/img/localhost_img_1.tar"] in [c["argv"] for c in calls]
    runs = [c for c in calls if c["argv"][0] == "run"]
    if code:
        assert not runs and "is not on this node" in (tmp_path / "server-0.log").read_text()
        return
    (run,) = runs
    assert run["key_env"] == key and key not in json.dumps(run["argv"])
    argv = run["argv"]
    assert argv[argv.index("localhost/img:1") + 1:][:2] == ["vllm", "serve"]
    assert "--env" in argv and argv[argv.index("VLLM_API_KEY") - 1] == "--env"


@pytest.mark.parametrize("running, codes, status", [
    pytest.param(False, [], "already", id="job-ended"),
    pytest.param(True, [0], "done", id="stopped"),
    pytest.param(True, [1], "failed", id="stop-failed"),
])
def test_stop_containers(running, codes, status):
    seen = []

    def fake(argv):
        seen.append(argv)
        return SimpleNamespace(returncode=codes[len(seen) - 1], stderr="Error: boom\n")

    got, detail = stop_containers("9", ["envlayers-9-0"], ["n1"], running, run=fake)
    assert got == status
    if running:
        assert seen == [["srun", "--overlap", "--jobid=9", "--nodes=1", "--ntasks=1", "--nodelist=n1", "podman",
                         "stop", "--ignore", "-t", "10", "envlayers-9-0"]]
    assert ("boom" in detail) is (status == "failed")


@pytest.mark.parametrize("endpoint, target", [
    pytest.param({"base_urls": ["http://127.0.0.1:8000/v1"], "nodes": ["n1"]}, ("n1", 8000), id="podman-loopback"),
    pytest.param({"base_urls": ["http://n2:8001/v1"], "nodes": ["n2"]}, ("n2", 8001), id="node-name"),
])
def test_the_tunnel_starts_on_the_node_behind_a_loopback_url(endpoint, target, tmp_path):
    from envlayers.access.job import JobAccess
    from envlayers.access.tunnel import api_target
    from envlayers.job import Job
    from envlayers.rundir import ENDPOINT, JobFiles, write_json

    write_json(tmp_path / ENDPOINT, endpoint)
    acc = JobAccess(Job("9", None, JobFiles("9", None, tmp_path)))
    assert api_target(acc) == target
