"""The ray and gateway shapes before and around Ray: the Ray launch keys, the `ray start` argv per node, the
ranks.sh arms through real bash, the node helper's argument parsing and its guard (real processes, killed
by PID), and the gateway's command rewriting. Ray itself runs in tests/slurm/test_ray_e2e.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envlayers import engines, topology
from envlayers.errors import EnvLayersError
from envlayers.gateway_app import flag_value, with_host_port
from envlayers.engines import ray
from envlayers.launch import raycluster, raynode
from envlayers.launch.prepare import LaunchFailure, prepare
from launchtools import GATEWAY, RAY, RAY_BASE as BASE, RAY_NODES as NODES, ray_alloc as alloc

PORTS_28000 = ["--dashboard-agent-listen-port=28000", "--node-manager-port=28002", "--object-manager-port=28003",
               "--metrics-export-port=28004", "--dashboard-agent-grpc-port=28005", "--runtime-env-agent-port=28006",
               "--min-worker-port=28100", "--max-worker-port=28999"]


# --------------------------------------------------------------------------- keys and argv


@pytest.mark.parametrize("keys, flags", [
    pytest.param({}, ["--num-gpus=4", *PORTS_28000], id="absent-defaults"),
    pytest.param({"RAY_PORT_BASE": ""}, ["--num-gpus=4"], id="empty-port-base-rays-own-ports"),
    pytest.param({"RAY_PORT_BASE": "40000", "RAY_NUM_CPUS": "1"},
                 ["--num-gpus=4", "--num-cpus=1", "--dashboard-agent-listen-port=40000", "--node-manager-port=40002",
                  "--object-manager-port=40003", "--metrics-export-port=40004", "--dashboard-agent-grpc-port=40005",
                  "--runtime-env-agent-port=40006", "--min-worker-port=40100", "--max-worker-port=40999"],
                 id="values"),
    pytest.param({"RAY_NUM_CPUS": "", "RAY_PORT_BASE": ""}, ["--num-gpus=4"], id="empty-cpus-ray-counts"),
])
def test_worker_flags_by_the_absent_empty_rule(keys, flags):
    env = {**RAY, **keys}
    worker = engines.build_commands(topology.plan(env), env, "n1")[1]
    assert list(worker.argv) == ["ray", "start", "--address=n1:29500", *flags, "--block"]


@pytest.mark.parametrize("keys, message", [
    pytest.param({"RAY_PORT_BASE": "80"}, "RAY_PORT_BASE: must be a port from 1024 to 64536 (the Ray ports take 1000 "
                 "from it), got '80'", id="port-base-low"),
    pytest.param({"RAY_PORT_BASE": "65000"}, "RAY_PORT_BASE: must be a port from 1024 to 64536", id="port-base-high"),
    pytest.param({"RAY_PORT_BASE": "2x"}, "RAY_PORT_BASE: must be a port from 1024 to 64536 (the Ray ports take 1000 "
                 "from it), got '2x'", id="not-int"),
    pytest.param({"RAY_NUM_CPUS": "0"}, "RAY_NUM_CPUS: must be a positive number of CPUs, got '0'", id="cpus-zero"),
    pytest.param({"RAY_JOIN_TIMEOUT_S": ""}, "RAY_JOIN_TIMEOUT_S: is empty; it must be a positive number of seconds; "
                 "hint: set RAY_JOIN_TIMEOUT_S=300 (its value when no layer assigns it)", id="timeout-empty"),
    pytest.param({"SERVER_PORT": "28500"}, "RAY_PORT_BASE, SERVER_PORT: SERVER_PORT = 28500 lies in the Ray port "
                 "block 28000-28999; hint: set RAY_PORT_BASE outside 27501-28500", id="service-port-in-block"),
    pytest.param({"RDZV_PORT": "28999"}, "RAY_PORT_BASE, RDZV_PORT: RDZV_PORT = 28999 lies in the Ray port block",
                 id="head-port-in-block"),
])
def test_a_bad_ray_key_stops_before_srun_naming_it(tmp_path, keys, message):
    with pytest.raises(EnvLayersError) as err:
        prepare({**RAY, **keys}, alloc(tmp_path))
    assert str(err.value).startswith(message)


def test_the_head_listens_on_the_rendezvous_port_at_the_nodes_address():
    plan = topology.plan({**RAY, "RDZV_PORT": "6400"})
    assert ray.head_argv({"RAY_NUM_CPUS": "1"}, plan, "10.9.0.1") == (
        "ray", "start", "--head", "--port=6400", "--node-ip-address=10.9.0.1", "--num-gpus=4", "--num-cpus=1",
        "--include-dashboard=false", "--disable-usage-stats", "--dashboard-agent-listen-port=28000",
        "--ray-client-server-port=28001", "--node-manager-port=28002", "--object-manager-port=28003",
        "--metrics-export-port=28004", "--dashboard-agent-grpc-port=28005", "--runtime-env-agent-port=28006",
        "--dashboard-port=28007", "--min-worker-port=28100", "--max-worker-port=28999", "--block")


@pytest.mark.parametrize("env, cap", [
    pytest.param(GATEWAY, 1, id="tp-4-on-4-gpus"),
    pytest.param({**GATEWAY, "TENSOR_PARALLEL_SIZE": "2", "NUMBER_OF_INSTANCES": "4"}, 2, id="two-fit-a-node"),
    pytest.param({**GATEWAY, "INFERENCE_NODES": "4", "TENSOR_PARALLEL_SIZE": "8", "USE_RAY_SERVE": "false"}, 1,
                 id="instance-spans-nodes"),
])
def test_gateway_replicas_per_node_are_capped_by_the_gpus_of_a_node(env, cap):
    assert raycluster.gateway_cap(topology.plan(env)) == cap


# --------------------------------------------------------------------------- the launch plan and ranks.sh


def test_ray_plan_wraps_every_rank_in_the_node_helper_and_writes_it(tmp_path):
    lp = prepare({**RAY, "RAY_NUM_CPUS": "1"}, alloc(tmp_path))
    assert set(lp.files) == {"ranks.sh", "launch.json", "raynode.py"}
    assert lp.files["raynode.py"] == Path(raynode.__file__).read_text()
    assert ("ENVLAYERS-TOPOLOGY: ray_head=10.9.0.1:29500 ray_nodes=2 join_timeout=300s "
            "temp_dir=/tmp/envlayers-ray-77-<rank>-<run dir crc32> pids=ray-pids-<rank>.txt "
            "auth=token (ray-token, 0600)") in lp.lines
    assert [t.url for t in lp.targets] == ["http://n1:8000/v1"]  # the head's own address, not loopback


def run_rank(tmp_path: Path, text: str, rank: int) -> list[str]:
    """ranks.sh through real bash, with a `python3` first on PATH that writes the words it was given."""
    (tmp_path / "ranks.sh").write_text(text)
    shim = tmp_path / "bin"
    shim.mkdir(exist_ok=True)
    (shim / "python3").write_text(f"#!/bin/bash\nprintf '%s\\n' \"$@\" > {tmp_path}/argv-$ENVLAYERS_RANK\n")
    (shim / "python3").chmod(0o755)
    env = {"PATH": f"{shim}:{os.environ['PATH']}", "ENVLAYERS_RANK": str(rank)}
    proc = subprocess.run(["bash", str(tmp_path / "ranks.sh")], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr + (tmp_path / f"server-{rank}.log").read_text()
    return (tmp_path / f"argv-{rank}").read_text().splitlines()


def test_ranks_sh_runs_the_node_helper_with_ray_first_then_the_server(tmp_path):
    lp = prepare({**RAY, "RAY_NUM_CPUS": "1", "RAY_JOIN_TIMEOUT_S": "90"}, alloc(tmp_path))
    helper = [str(tmp_path / "raynode.py")]
    common = ["--run-dir", str(tmp_path), "--job", "77", "--address", "10.9.0.1:29500", "--nodes", "2",
              "--auth-token-file", str(tmp_path / "ray-token")]
    head = run_rank(tmp_path, lp.files["ranks.sh"], 0)
    cut = head.index("--")
    assert head[:cut] == [*helper, "--rank", "0", *common, "--join-timeout", "90"]
    second = head.index("--", cut + 1)
    assert head[cut + 1:cut + 6] == ["ray", "start", "--head", "--port=29500", "--node-ip-address=10.9.0.1"]
    assert head[second - 1] == "--block"
    assert head[second + 1:] == list(lp.commands[0].argv)
    assert "--distributed-executor-backend" in head[second + 1:]
    worker = run_rank(tmp_path, lp.files["ranks.sh"], 1)
    assert worker == [*helper, "--rank", "1", *common, "--", *lp.commands[1].argv]


def test_gateway_plan_runs_the_serve_app_after_the_head_with_rank_zeros_vllm_command(tmp_path):
    lp = prepare({**GATEWAY, "ENVLAYERS_READY_TIMEOUT_S": "600"}, alloc(tmp_path))
    assert set(lp.files) == {"ranks.sh", "launch.json", "raynode.py", "gateway_app.py"}
    assert ("ENVLAYERS-TOPOLOGY: gateway port=8000 replicas=2 max_replicas_per_node=1 (Ray Serve; each replica runs "
            "rank 0's vllm serve on a free loopback port and proxies to it)") in lp.lines
    assert lp.metrics is True  # the gateway answers /metrics with every replica's samples
    assert ("ENVLAYERS-TOPOLOGY: gateway survival: min_replicas=1 replace_timeout=600s (a replica whose server dies "
            "is replaced by Serve; the job ends after replace_timeout with fewer than min_replicas healthy)") in lp.lines
    head = run_rank(tmp_path, lp.files["ranks.sh"], 0)
    second = head.index("--", head.index("--") + 1)
    app = head[second + 1:]
    assert app[:app.index("--")] == ["python3", str(tmp_path / "gateway_app.py"), "--address", "10.9.0.1:29500",
                                     "--replicas", "2", "--max-per-node", "1", "--served", "served",
                                     "--ready-timeout", "600", "--min-replicas", "1", "--replace-timeout", "600"]
    assert app[app.index("--") + 1:] == list(lp.commands[0].argv)


def test_the_gateway_replicas_get_the_key_file_and_rays_processes_no_key(tmp_path, monkeypatch):
    from envlayers import gateway_app

    key_file = tmp_path / "api-key"
    key_file.write_text("s3cret\n")
    lp = prepare({**GATEWAY, "SERVER_API_KEY_FILE": str(key_file)}, alloc(tmp_path))
    head = run_rank(tmp_path, lp.files["ranks.sh"], 0)
    assert head[head.index("--api-key-file") + 1] == str(key_file)
    assert gateway_app.read_key(str(key_file)) == "s3cret"
    monkeypatch.setenv("VLLM_API_KEY", "s3cret")
    monkeypatch.setenv("SERVER_API_KEY", "s3cret")
    node = raynode.Node({"rank": "0", "run-dir": str(tmp_path), "job": "7", "address": "127.0.0.1:29500",
                         "nodes": "1"}, ["ray", "start", "--head", "--block"], ["vllm", "serve"])
    assert "s3cret" not in node.ray_env.values()  # ray start, its raylet and workers, the node count
    assert node.env["VLLM_API_KEY"] == "s3cret"  # the server this node runs (vLLM's API server)


def test_gateway_survival_keys_reach_the_serve_app(tmp_path):
    lp = prepare({**GATEWAY, "MIN_REPLICAS": "2", "GATEWAY_REPLACE_TIMEOUT_S": "45"}, alloc(tmp_path))
    head = run_rank(tmp_path, lp.files["ranks.sh"], 0)
    assert head[head.index("--min-replicas") + 1] == "2" and head[head.index("--replace-timeout") + 1] == "45"


@pytest.mark.parametrize("keys, message", [
    ({"MIN_REPLICAS": "3"}, "MIN_REPLICAS: must be a whole number from 1 to 2"),
    ({"MIN_REPLICAS": "0"}, "MIN_REPLICAS: must be a positive integer, got '0'"),
    ({"GATEWAY_REPLACE_TIMEOUT_S": "soon"}, "must be a positive number of seconds"),
    ({"GATEWAY_REPLACE_TIMEOUT_S": ""}, "is empty"),
])
def test_a_bad_gateway_survival_key_stops_before_srun(tmp_path, keys, message):
    with pytest.raises((LaunchFailure, EnvLayersError), match=re.escape(message)):
        prepare({**GATEWAY, **keys}, alloc(tmp_path))


def test_one_node_gateway_starts_its_own_ray(tmp_path):
    lp = prepare({**BASE, "USE_RAY_SERVE": "true"}, alloc(tmp_path, NODES[:1]))
    assert lp.plan.shape == "gateway" and lp.ranks == 1
    head = run_rank(tmp_path, lp.files["ranks.sh"], 0)
    assert head[head.index("--nodes") + 1] == "1" and "--head" in head


def test_podman_cannot_carry_a_ray_shape(tmp_path):
    with pytest.raises(LaunchFailure, match="CONTAINER_RUNTIME=podman cannot run the gateway shape"):
        prepare({**BASE, "USE_RAY_SERVE": "true", "CONTAINER_RUNTIME": "podman", "ENVLAYERS_IMAGE": "img:1",
                 "ENVLAYERS_GPU_DEVICES": "none"},
                alloc(tmp_path, NODES[:1]))


# --------------------------------------------------------------------------- the node helper


@pytest.mark.parametrize("argv, ray, server", [
    pytest.param(["--rank", "0", "--run-dir", "/r", "--job", "1", "--address", "a:1", "--nodes", "2", "--", "ray",
                  "start", "--head", "--block", "--", "vllm", "serve", "--", "x"],
                 ["ray", "start", "--head", "--block"], ["vllm", "serve", "--", "x"], id="head-and-server"),
    pytest.param(["--rank", "1", "--run-dir", "/r", "--job", "1", "--address", "a:1", "--nodes", "2", "--", "ray",
                  "start", "--block"], ["ray", "start", "--block"], [], id="worker"),
])
def test_node_helper_splits_ray_from_the_server_at_the_separators(argv, ray, server):
    opts, got_ray, got_server = raynode.parse(argv)
    assert (got_ray, got_server) == (ray, server) and opts["address"] == "a:1"


@pytest.mark.parametrize("argv, message", [
    pytest.param(["--rank", "0"], "expected `-- RAY_START_ARGV...`", id="no-separator"),
    pytest.param(["--rank", "0", "--"], "missing --run-dir, --job, --address, --nodes", id="missing"),
])
def test_node_helper_refuses_a_malformed_command_line(argv, message):
    with pytest.raises(SystemExit, match=message):
        raynode.parse(argv)


GUARDED = """
import os, signal, subprocess, sys, time
sys.path.insert(0, {src!r})
from envlayers.launch import raynode
node = raynode.Node({{"rank": "3", "run-dir": {run!r}, "job": "9", "address": "127.0.0.1:1", "nodes": "1"}},
                    ["sleep", "--block"], [])
node.guard = raynode.Guard.start(node.tracker.path, node.temp_dir, {run!r} + "/server-3.log")
os.makedirs(node.temp_dir, exist_ok=True)
child = node.spawn(["bash", "-c", "sleep 120 & sleep 120 & wait"], dict(os.environ))
time.sleep(1.0)
node.tracker.scan()
print(node.temp_dir, flush=True)
if sys.argv[1] == "die":
    os.kill(os.getpid(), signal.SIGKILL)  # as srun ends a task: no clean-up of our own
node.stop()
node.guard.done()
"""


def recorded(path: Path) -> dict[int, int]:
    out = {}
    for line in path.read_text().splitlines():
        pid, start, _ = line.split(" ", 2)
        out[int(pid)] = int(start)
    return out


@pytest.mark.parametrize("how", ["die", "stop"])
def test_every_process_the_node_started_is_recorded_and_stopped_by_pid(tmp_path, how):
    src = str(Path(raynode.__file__).resolve().parents[2])
    proc = subprocess.run([sys.executable, "-c", GUARDED.format(src=src, run=str(tmp_path)), how],
                          capture_output=True, text=True, timeout=60)
    temp_dir = proc.stdout.strip()
    pids = recorded(tmp_path / "ray-pids-3.txt")
    assert len(pids) >= 3  # bash and its two sleeps
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(raynode.alive(p, s) for p, s in pids.items()):
        time.sleep(0.1)
    assert not [p for p, s in pids.items() if raynode.alive(p, s)]
    while time.monotonic() < deadline and os.path.exists(temp_dir):
        time.sleep(0.1)
    assert temp_dir.startswith("/tmp/envlayers-ray-9-3-") and not os.path.exists(temp_dir)
    if how == "die":  # the guard says so in the rank's log once it is done
        log = tmp_path / "server-3.log"
        while time.monotonic() < deadline and not (log.exists() and "its guard" in log.read_text()):
            time.sleep(0.1)
        # bash may already be gone by then (the kernel ends the helper's direct child with it): 2 or 3
        assert re.search(r"ENVLAYERS-STAGE: ray: the node helper was killed; its guard stopped [23] process\(es\)",
                         log.read_text()), log.read_text()
    else:
        assert "ENVLAYERS-STAGE: ray node of rank 3 stopped: none of the 3 process(es) it started is left" in proc.stdout


# --------------------------------------------------------------------------- the gateway


@pytest.mark.parametrize("argv, expected", [
    pytest.param(["vllm", "serve", "m", "--host", "0.0.0.0", "--port", "8000", "--enforce-eager"],
                 ["vllm", "serve", "m", "--enforce-eager", "--host", "127.0.0.1", "--port", "4242"], id="spaced"),
    pytest.param(["vllm", "serve", "m", "--host=::", "--port=9"],
                 ["vllm", "serve", "m", "--host", "127.0.0.1", "--port", "4242"], id="equals"),
])
def test_each_replica_serves_on_its_own_loopback_port(argv, expected):
    assert with_host_port(argv, "127.0.0.1", 4242) == expected


def test_the_gateway_listens_where_the_command_asked():
    argv = ["vllm", "serve", "m", "--host", "10.0.0.1", "--port=8100"]
    assert (flag_value(argv, "--host", "0.0.0.0"), flag_value(argv, "--port", "8000")) == ("10.0.0.1", "8100")


def test_the_gateway_and_launcher_modules_do_not_import_ray():
    code = ("import sys, envlayers.gateway_app, envlayers.launch.raycluster, envlayers.launch.raynode; "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'aiohttp', 'starlette'))))")
    out = subprocess.run([sys.executable, "-c", "import json; " + code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(Path(raynode.__file__).resolve().parents[2])})
    assert json.loads(out.stdout) == [], out.stderr


@pytest.mark.parametrize("rank, sig", [
    pytest.param(0, "SIGTERM", id="head-waiting-for-nodes-SIGTERM"),
    pytest.param(0, "SIGINT", id="head-waiting-for-nodes-SIGINT"),
    pytest.param(0, "SIGHUP", id="head-waiting-for-nodes-SIGHUP"),
    pytest.param(1, "SIGTERM", id="worker-SIGTERM"),
])
def test_a_signalled_node_helper_exits_128_plus_the_signal_even_before_the_nodes_joined(tmp_path, rank, sig):
    import signal
    import socket

    # `ray start` stands in as a process that blocks; the head's node count waits on an address where no Ray
    # head answers, so the signal comes while the nodes have not joined
    shim = tmp_path / "ray"
    shim.write_text("#!/bin/bash\nexec sleep 300\n")
    shim.chmod(0o755)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    argv = [sys.executable, raynode.__file__, "--rank", str(rank), "--run-dir", str(tmp_path), "--job", "31",
            "--address", f"127.0.0.1:{port}", "--nodes", "2", "--join-timeout", "120", "--", str(shim), "start",
            "--block"] + (["--", "sleep", "300"] if rank == 0 else [])
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        first = proc.stdout.readline()  # said after the signal handlers are in place
        assert first.startswith(f"ENVLAYERS-STAGE: ray {'head' if rank == 0 else 'worker'} node of rank {rank} "
                                "starting"), first
        pids = tmp_path / f"ray-pids-{rank}.txt"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(recorded(pids)) < (2 if rank == 0 else 1):
            time.sleep(0.05)  # the head's counter has started too: it is waiting for the nodes
        proc.send_signal(getattr(signal, sig))
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert "joined the cluster" not in rest and "starting the server" not in rest, rest
    assert proc.returncode == 128 + getattr(signal, sig), first + rest
    assert f"ray node of rank {rank} stopped: none of the" in rest, rest


# --------------------------------------------------------------------------- Ray's token authentication


def test_the_ray_token_is_random_0600_and_replaced_whole(tmp_path):
    from envlayers.launch.raycluster import write_token

    first = write_token(tmp_path)
    text = first.read_text()
    assert first.name == "ray-token" and len(text.strip()) == 64 and int(text, 16) >= 0
    assert first.stat().st_mode & 0o777 == 0o600
    assert write_token(tmp_path).read_text() != text  # a requeued run writes its own
    assert [p.name for p in tmp_path.iterdir()] == ["ray-token"]  # no temporary left


@pytest.mark.parametrize("content, mode, problem", [
    pytest.param("abc\n", 0o600, None, id="fine"),
    pytest.param("", 0o600, "is empty", id="empty"),
    pytest.param("abc\n", 0o644, "is readable by others (mode 0644", id="world-readable"),
    pytest.param(None, None, "cannot be read: No such file or directory", id="missing"),
])
def test_a_token_file_ray_could_not_use_safely_is_named(tmp_path, content, mode, problem):
    path = tmp_path / "ray-token"
    if content is not None:
        path.write_text(content)
        path.chmod(mode)
    found = raynode.token_problem(str(path))
    assert (found is None) if problem is None else (problem in found)


def test_every_process_of_a_node_runs_with_token_auth_and_no_token_in_its_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_AUTH_TOKEN", "from-the-shell")
    node = raynode.Node({"rank": "0", "run-dir": str(tmp_path), "job": "7", "address": "127.0.0.1:29500",
                         "nodes": "1", "auth-token-file": str(tmp_path / "ray-token")},
                        ["ray", "start", "--head", "--block"], [])
    assert node.env["RAY_AUTH_MODE"] == "token"
    assert node.env["RAY_AUTH_TOKEN_PATH"] == str(tmp_path / "ray-token")
    assert "RAY_AUTH_TOKEN" not in node.env


def test_an_image_without_ray_is_one_named_line_not_a_python_traceback(tmp_path):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    argv = [sys.executable, raynode.__file__, "--rank", "1", "--run-dir", str(tmp_path), "--job", "32",
            "--address", f"127.0.0.1:{port}", "--nodes", "2", "--join-timeout", "10", "--",
            str(tmp_path / "no-such-ray"), "start", "--block"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "Traceback" not in out, out
    errors = [line for line in out.splitlines() if line.startswith("ENVLAYERS-ERROR")]
    assert len(errors) == 1 and f"{tmp_path / 'no-such-ray'} is not installed where rank 1 runs" in errors[0], out
