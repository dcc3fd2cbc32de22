"""connect, ping, tunnel and release without a cluster: the checks on their inputs, the node-side
tunnel script run by real bash, ping against the real stand-in engine on 127.0.0.1, the gateway port
check through a real private sshd on 127.0.0.1, and connect's owner and key rules on a run directory.

Slurm is a two-line stand-in here (``scontrol`` answers "Invalid job id"), so a job is found by its
run directory alone; tests/slurm/test_access_e2e.py runs the same commands on the real local cluster.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envlayers.access import gateway as gw
from envlayers.access.ping import ping
from envlayers.access.tunnel import NODE_LINE, TunnelSpec
from envlayers.errors import EnvLayersError

import sshdtools
from rundirtools import write_run_dir
from slurmtools import NO_SUCH_JOB, slurm_bin
from timing import LATE_S  # how late a busy machine may run an event

REPO = Path(__file__).resolve().parents[1]
CONTROL_DIR = Path(f"/tmp/envlayers-tunnel-{os.getuid()}")  # where the node script keeps its control sockets
STANDIN = REPO / "tests" / "standin"


def cli(*args: str, env: dict | None = None, timeout_s: float = 60) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": str(REPO / "src"), **(env or {})}
    full.pop("ENVLAYERS_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "envlayers", *args], capture_output=True, text=True,
                          timeout=timeout_s, env=full)


# ------------------------------------------------------------------------------------------ inputs

@pytest.mark.parametrize("given, bind", [
    pytest.param(None, "127.0.0.1", id="default"),
    pytest.param("127.0.0.1", "127.0.0.1", id="loopback"),
    pytest.param("127.0.0.2", "127.0.0.2", id="other-loopback"),
    pytest.param("::1", "[::1]", id="ipv6-loopback"),
])
def test_remote_bind_accepts_numeric_loopback_only(given, bind):
    assert gw.check_remote_bind(given) == bind


@pytest.mark.parametrize("given, reason", [
    pytest.param("0.0.0.0", "binds every interface", id="any-ipv4"),
    pytest.param("*", "binds every interface", id="star"),
    pytest.param("", "binds every interface", id="empty"),
    pytest.param("::", "binds every interface", id="any-ipv6"),
    pytest.param("localhost", "a name the gateway resolves itself", id="localhost-name"),
    pytest.param("10.1.2.3", "not a loopback address", id="private-routable"),
    pytest.param("192.0.2.7", "not a loopback address", id="public-routable"),
    pytest.param("gateway.example.org", "not a numeric IP address", id="host-name"),
])
def test_remote_bind_refuses_anything_that_could_publish_the_server(given, reason):
    with pytest.raises(EnvLayersError) as err:
        gw.check_remote_bind(given)
    assert reason in str(err.value) and err.value.where == "--remote-bind"
    assert "must stay private" in str(err.value) or given == "localhost"


@pytest.mark.parametrize("dest, ok", [
    pytest.param("me@gw.example.org", True, id="user-host"),
    pytest.param("gw", True, id="host-only"),
    pytest.param("me@10.0.0.1", True, id="user-ip"),
    pytest.param("-oProxyCommand=sh", False, id="option-injection"),
    pytest.param("me@gw x", False, id="space"),
    pytest.param("@gw", False, id="empty-user"),
    pytest.param("", False, id="empty"),
])
def test_destination(dest, ok):
    if ok:
        assert gw.check_destination(dest) == dest
    else:
        with pytest.raises(EnvLayersError):
            gw.check_destination(dest)


@pytest.mark.parametrize("option, ok", [
    pytest.param("UserKnownHostsFile=/x/known", True, id="known-hosts"),
    pytest.param("ProxyJump=bastion", True, id="proxy-jump"),
    pytest.param("ServerAliveInterval 10", True, id="space-form"),
    pytest.param("RemoteForward=0.0.0.0:9000 127.0.0.1:8000", False, id="second-forward"),
    pytest.param("ExitOnForwardFailure=no", False, id="weaken-exit-on-failure"),
    pytest.param("GatewayPorts=yes", False, id="gateway-ports"),
    pytest.param("=yes", False, id="malformed"),
])
def test_ssh_options(option, ok):
    if ok:
        assert gw.check_options([option])[0].split("=")[0] == option.split("=")[0].split()[0]
    else:
        with pytest.raises(EnvLayersError):
            gw.check_options([option])


def test_forced_options_come_first_and_a_users_default_replaces_ours():
    g = gw.Gateway("me@gw", 2222, "/k", ("ServerAliveInterval=7",))
    argv = g.ssh_argv("-N")
    opts = [argv[i + 1] for i, a in enumerate(argv) if a == "-o"]
    assert opts[:2] == ["ExitOnForwardFailure=yes", "BatchMode=yes"]  # ssh keeps the first value given
    assert "ServerAliveInterval=7" in opts and "ServerAliveInterval=30" not in opts
    assert "ServerAliveCountMax=3" in opts
    assert argv[-1] == "-N" and ["-p", "2222"] == argv[argv.index("-p"):argv.index("-p") + 2]


def test_the_step_runs_on_the_api_node_inside_the_job():
    spec = TunnelSpec("42", "n7", 8000, gw.Gateway("me@gw"), "127.0.0.1", 8001)
    argv = spec.srun_argv()
    assert argv[:6] == ["srun", "--overlap", "--jobid=42", "--nodes=1", "--ntasks=1", "--nodelist=n7"]
    assert "-R 127.0.0.1:8001:127.0.0.1:8000 me@gw" in argv[-1]


# ------------------------------------------------------------------------------------------ node script

def _fake_ssh(tmp_path: Path, body: str) -> dict:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    (bindir / "ssh").write_text("#!/bin/bash\n" + body)
    (bindir / "ssh").chmod(0o755)
    return {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "SLURM_JOB_ID": "5", "SLURM_STEP_ID": "2"}


def test_node_script_keeps_only_the_lines_that_say_how_the_forward_went(tmp_path):
    env = _fake_ssh(tmp_path, (
        "echo 'OpenSSH_9.2p1' >&2; echo 'debug1: Reading configuration data' >&2\n"
        "echo 'Authenticated to gw ([10.0.0.1]:22) using \"publickey\".' >&2\n"
        "echo 'debug1: remote forward failure for: listen 127.0.0.1:8001, connect 127.0.0.1:8000' >&2\n"
        "echo 'debug1: channel 0: new [client-session]' >&2\n"
        "echo 'Error: remote port forwarding failed for listen port 8001' >&2; exit 255\n"))
    script = TunnelSpec("5", "n1", 8000, gw.Gateway("me@gw"), "127.0.0.1", 8001).node_script()
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=20)
    assert proc.returncode == 255
    assert proc.stdout.startswith("ENVLAYERS-TUNNEL: node=") and " step=5.2 pid=" in proc.stdout
    first = NODE_LINE.match_line(proc.stdout.splitlines()[0])  # what the opener reads of the line the step prints
    assert first is not None and first["step"] == "5.2" and int(first["pid"]) > 1
    assert proc.stderr.splitlines() == [
        "OpenSSH_9.2p1", 'Authenticated to gw ([10.0.0.1]:22) using "publickey".',
        "debug1: remote forward failure for: listen 127.0.0.1:8001, connect 127.0.0.1:8000",
        "Error: remote port forwarding failed for listen port 8001"]


def test_the_opener_reads_ssh_exit_code_from_the_line_the_step_prints(tmp_path):
    from envlayers.access.tunnel import ssh_said

    env = _fake_ssh(tmp_path, "echo 'ssh: connect to host gw port 22: Connection refused' >&2; exit 255\n")
    script = TunnelSpec("5", "n1", 8000, gw.Gateway("me@gw"), "127.0.0.1", 8001, keep_alive=True, restarts=0).node_script()
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=20)
    assert proc.returncode == 255
    assert re.search(r"^ENVLAYERS-TUNNEL: ssh exited with code 255 after \d+s; giving up after 0 restarts$", proc.stdout,
                     re.M)
    assert ssh_said(proc.stdout + proc.stderr) == ("ssh: connect to host gw port 22: Connection refused", "255")


def test_a_hostile_remote_bind_in_the_takeover_script_stays_text(tmp_path):
    canary = tmp_path / "canary"
    env = _fake_ssh(tmp_path, 'case " $* " in *" forward "*) exit 1 ;; *) sleep 5 ;; esac\n')
    bind = f"\"$(touch {canary})`touch {canary}`'"
    spec = TunnelSpec("5", "n1", 8000, gw.Gateway("me@gw"), bind, 8001, takeover=True, takeover_wait_s=0)
    proc = subprocess.run(["bash", "-c", spec.node_script()], input="go\nrecorded\n", capture_output=True,
                          text=True, env=env, timeout=30)
    assert not canary.exists()
    # the ask refused and no time left to ask again: the step ends (by its own TERM) and says why
    assert proc.returncode == -15 and f"ENVLAYERS-TUNNEL: {bind}:8001 is still held after 0s; giving up" in proc.stdout


def test_keep_alive_restarts_a_dropped_ssh_a_bounded_number_of_times(tmp_path):
    count = tmp_path / "starts"
    env = _fake_ssh(tmp_path, f"echo x >> {count}; exit 255\n")
    spec = TunnelSpec("5", "n1", 8000, gw.Gateway("me@gw"), "127.0.0.1", 8001, keep_alive=True, restarts=1)
    t0 = time.monotonic()
    proc = subprocess.run(["bash", "-c", spec.node_script()], capture_output=True, text=True, env=env, timeout=30)
    assert proc.returncode == 255
    assert len(count.read_text().splitlines()) == 2  # the first start and one restart
    assert "restart 1/1 in 2s" in proc.stdout and "giving up after 1 restarts" in proc.stdout
    assert time.monotonic() - t0 >= 2  # the back-off was waited


# ------------------------------------------------------------------------------------------ ping

def _standin(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    port = sshdtools.free_port()
    env = {**os.environ, "STANDIN_LOAD_SECONDS": "0", "PYTHONPATH": str(STANDIN / "pypath")}
    proc = subprocess.Popen([str(STANDIN / "bin" / "vllm"), "serve", "m", "--served-model-name", "tiny",
                             "--host", "127.0.0.1", "--port", str(port), *extra], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc, f"http://127.0.0.1:{port}/v1"
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the stand-in engine did not listen")


def _end(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:  # a handler thread still in a request: do not leave it running
        proc.kill()
        proc.wait(10)


@pytest.fixture
def engine(tmp_path):
    proc, url = _standin(tmp_path)
    yield url
    _end(proc)


@pytest.fixture
def keyed_engine(tmp_path):
    key = "k-" + os.urandom(6).hex()
    proc, url = _standin(tmp_path, "--api-key", key)
    yield url, key
    _end(proc)


def test_ping_times_both_checks_against_the_real_stand_in(engine):
    result = ping(engine, "tiny", timeout_s=5)
    assert result.ok and [c.name for c in result.checks] == ["models", "chat"]
    assert all(c.status == 200 and 0 < c.latency_s < 5 for c in result.checks)
    proc = cli("ping", engine.removesuffix("/v1"), "--json")
    data = json.loads(proc.stdout)
    assert proc.returncode == 0 and data["ok"] and data["results"][0]["served_model_name"] == "tiny"


@pytest.mark.parametrize("args, code, needle", [
    pytest.param(["--model", "other"], 1, "serves ['tiny'], not 'other'", id="wrong-model"),
    pytest.param([], 0, "POST /v1/chat/completions (max_tokens=1): 200 in", id="ok"),
])
def test_ping_exit_status(engine, args, code, needle):
    proc = cli("ping", engine, *args)
    assert proc.returncode == code and needle in proc.stdout, proc.stdout + proc.stderr


def test_ping_with_a_key_from_a_file(keyed_engine, tmp_path):
    url, key = keyed_engine
    no_key = cli("ping", url)
    assert no_key.returncode == 1 and "HTTP 401: the endpoint wants a key (--api-key-file FILE)" in no_key.stdout
    key_file = tmp_path / "key"
    key_file.write_text(key + "\n")
    key_file.chmod(0o600)
    with_key = cli("ping", url, "--api-key-file", str(key_file))
    assert with_key.returncode == 0, with_key.stdout
    assert key not in with_key.stdout + with_key.stderr


def test_ping_never_hangs_on_a_server_that_accepts_and_says_nothing():
    with socket.socket() as silent:  # listens, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        t0 = time.monotonic()
        proc = cli("ping", f"http://127.0.0.1:{port}", "--timeout-s", "1")
        took = time.monotonic() - t0
    assert proc.returncode == 1 and "no answer" in proc.stdout and "timed out" in proc.stdout
    assert took < 1 + LATE_S  # silent for ever


def test_ping_of_a_closed_port_fails_at_once():
    port = sshdtools.free_port()
    proc = cli("ping", f"http://127.0.0.1:{port}/v1", "--json")
    data = json.loads(proc.stdout)
    assert proc.returncode == 1 and len(data["results"][0]["checks"]) == 1  # no chat after no answer
    assert "Connection refused" in data["results"][0]["checks"][0]["detail"]


# ------------------------------------------------------------------------------------------ gateway port

@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    reason = sshdtools.ensure_openssh()
    if reason:
        pytest.skip(reason)
    server = sshdtools.Sshd.start(tmp_path_factory.mktemp("gateway"))
    yield server
    server.stop()


def _gateway(server) -> gw.Gateway:
    return gw.Gateway(server.destination, server.port, str(server.identity), tuple(server.client_options()))


def test_gateway_port_check_through_a_real_sshd(sshd, engine):
    port = int(engine.rsplit(":", 1)[1].split("/")[0])
    answers = gw.check_gateway_port(_gateway(sshd), "127.0.0.1", port)
    assert answers.state == "answers" and "HTTP/1.1 200" in answers.detail and answers.held
    free = gw.check_gateway_port(_gateway(sshd), "127.0.0.1", sshdtools.free_port())
    assert free.state == "free" and not free.held


def test_gateway_port_check_falls_back_to_a_direct_connect_when_the_gateway_is_this_host(sshd, tmp_path, engine):
    other_key = tmp_path / "other"  # a key the gateway does not know: ssh cannot log in
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other_key)], check=True)
    g = gw.Gateway(sshd.destination, sshd.port, str(other_key), tuple(sshd.client_options()))
    free = gw.check_gateway_port(g, "127.0.0.1", sshdtools.free_port())
    assert free.state == "free" and "Permission denied" in free.detail and "the gateway is this host" in free.detail
    port = int(engine.rsplit(":", 1)[1].split("/")[0])
    assert gw.check_gateway_port(g, "127.0.0.1", port).state == "listening"


def test_gateway_port_check_says_unknown_when_it_cannot_reach_a_remote_gateway(tmp_path):
    # a numeric address that is not this host, reached through a proxy command that fails: no packet leaves
    g = gw.Gateway("me@10.255.255.1", 22, None, ("ProxyCommand=false",))
    check = gw.check_gateway_port(g, "127.0.0.1", 8001, timeout_s=10)
    assert check.state == "unknown" and not check.held and "ssh to the gateway failed" in check.detail


# ------------------------------------------------------------------------------------------ connect

@pytest.fixture
def no_slurm(tmp_path):
    """Slurm's clients answering "no such job", so a job is found by its run directory alone."""
    return slurm_bin(tmp_path / "slurm-bin", NO_SUCH_JOB)


def _run_dir(tmp_path: Path, key_file: Path | None = None) -> Path:
    return write_run_dir(tmp_path / "runs" / "77", {
        "launch.json": {"served_model_name": "tiny", "nodes": ["n1"]},
        "endpoint.json": {"job_id": "77", "served_model_name": "tiny", "base_urls": ["http://n1:8000/v1"],
                          "addresses": ["10.9.0.11"], "api_key_required": key_file is not None},
        "serve.env": "export VLLM_SERVED_MODEL='tiny'\n"
                     + (f"export SERVER_API_KEY_FILE='{key_file}'\n" if key_file else "")})


def test_connect_names_the_key_file_never_the_key(tmp_path, no_slurm):
    key_file = tmp_path / "key"
    key_file.write_text("s3cret-value\n")
    key_file.chmod(0o600)
    run = _run_dir(tmp_path, key_file)
    text = cli("connect", "77", "--run-dir", str(run), env=no_slurm)
    assert text.returncode == 0, text.stderr
    assert "base URL:    http://n1:8000/v1  (by address: http://10.9.0.11:8000/v1)" in text.stdout
    assert f"API key:     required; it is in {key_file}" in text.stdout and "s3cret" not in text.stdout
    data = json.loads(cli("connect", "77", "--run-dir", str(run), "--json", env=no_slurm).stdout)
    assert data["api_key_file"] == str(key_file) and "api_key" not in data and data["served_model_name"] == "tiny"
    shown = json.loads(cli("connect", "77", "--run-dir", str(run), "--json", "--show-key", env=no_slurm).stdout)
    assert shown["api_key"] == "s3cret-value"


def test_connect_prints_the_laptop_route_through_this_host(tmp_path, no_slurm):
    import getpass

    key_file = tmp_path / "key"
    key_file.write_text("k\n")
    key_file.chmod(0o600)
    run = _run_dir(tmp_path, key_file)
    data = json.loads(cli("connect", "77", "--run-dir", str(run), "--json", env=no_slurm).stdout)
    me = f"{getpass.getuser()}@{socket.getfqdn()}"
    assert data["laptop"] == {"ssh": ["ssh", "-N", "-L", "8000:10.9.0.11:8000", me],
                              "base_url": "http://127.0.0.1:8000/v1", "through": socket.getfqdn()}
    text = cli("connect", "77", "--run-dir", str(run), env=no_slurm).stdout
    assert (f"laptop:      ssh -N -L 8000:10.9.0.11:8000 {me}  (leave it running), then base URL "
            "http://127.0.0.1:8000/v1 with the same key") in text


def test_connect_reaches_a_loopback_endpoint_from_a_laptop_through_its_node(tmp_path, no_slurm):
    import getpass

    run = _run_dir(tmp_path)
    ep = json.loads((run / "endpoint.json").read_text())
    ep.update(base_urls=["http://127.0.0.1:8000/v1"], addresses=["127.0.0.1"], nodes=["n1"], node_local=True)
    (run / "endpoint.json").write_text(json.dumps(ep))
    data = json.loads(cli("connect", "77", "--run-dir", str(run), "--json", env=no_slurm).stdout)
    me = getpass.getuser()
    assert data["laptop"]["ssh"] == ["ssh", "-N", "-J", f"{me}@{socket.getfqdn()}", "-L", "8000:127.0.0.1:8000",
                                     f"{me}@n1"]


def test_connect_warns_about_a_key_file_others_can_read(tmp_path, no_slurm):
    key_file = tmp_path / "key"
    key_file.write_text("k\n")
    key_file.chmod(0o644)
    proc = cli("connect", "77", "--run-dir", str(_run_dir(tmp_path, key_file)), env=no_slurm)
    assert (f"warning:     the key file {key_file} is readable or writable by others (mode 0644); run `chmod 600 "
            f"{key_file}`") in proc.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give files to another user")
def test_connect_is_for_the_owner_only(tmp_path, no_slurm):
    key_file = tmp_path / "key"
    key_file.write_text("k\n")
    run = _run_dir(tmp_path, key_file)
    os.chown(key_file, 65534, 65534)
    refused = cli("connect", "77", "--run-dir", str(run), "--show-key", env=no_slurm)
    assert refused.returncode == 2 and "the key file" in refused.stderr and "not to you" in refused.stderr
    os.chown(run, 65534, 65534)
    proc = cli("connect", "77", "--run-dir", str(run), env=no_slurm)
    assert proc.returncode == 2 and proc.stdout == ""
    assert f"job 77 is not yours: its run directory {run} belongs to nobody, you are root" in proc.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give files to another user")
def test_verify_reads_a_jobs_key_only_from_a_file_of_ones_own(tmp_path, no_slurm):
    key_file = tmp_path / "key"
    key_file.write_text("k\n")
    key_file.chmod(0o600)
    run = _run_dir(tmp_path, key_file)
    os.chown(key_file, 65534, 65534)
    proc = cli("verify", "77", "--run-dir", str(run), env=no_slurm)
    assert proc.returncode == 2 and proc.stdout == ""
    assert (f"{run}/serve.env: SERVER_API_KEY_FILE {key_file}: the key file belongs to nobody, not to you (root)"
            in proc.stderr), proc.stderr


def test_ping_gives_up_on_a_server_that_trickles_its_answer():
    import threading

    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(8)
        port = srv.getsockname()[1]
        stop = threading.Event()

        def trickle():  # one byte every 0.3 s: no single read ever times out
            conn, _ = srv.accept()
            with conn:
                conn.recv(4096)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
                while not stop.is_set():
                    try:
                        conn.sendall(b"x")
                    except OSError:
                        return
                    time.sleep(0.3)

        threading.Thread(target=trickle, daemon=True).start()
        t0 = time.monotonic()
        result = ping(f"http://127.0.0.1:{port}/v1", "tiny", timeout_s=1)
        took = time.monotonic() - t0
        stop.set()
    assert not result.ok and "no complete reply within 1s" in result.checks[0].detail
    assert took < 1 + LATE_S  # it trickles until the test stops it


def _no_slurm_job(tmp_path: Path, port: int) -> Path:
    run = _run_dir(tmp_path)
    ep = json.loads((run / "endpoint.json").read_text())
    ep.update(base_urls=[f"http://n1:{port}/v1"], addresses=["127.0.0.1"])
    (run / "endpoint.json").write_text(json.dumps(ep))
    return run


@pytest.mark.parametrize("command", ["ping", "tunnel"])
def test_a_job_slurm_no_longer_knows_is_not_pinged_or_tunnelled(tmp_path, no_slurm, command):
    run = _no_slurm_job(tmp_path, sshdtools.free_port())
    extra = ["--to", "me@gw", "--remote-port", "8001"] if command == "tunnel" else []
    proc = cli(command, "77", "--run-dir", str(run), *extra, env=no_slurm)
    assert proc.returncode == 2 and "job 77 has ended (no longer known to Slurm)" in proc.stderr
    assert not (run / "tunnel.log").exists()


def _tunnel_record(run: Path, server, pid: int, argv: list[str], port: int) -> None:
    (run / "tunnel.json").write_text(json.dumps({
        "job_id": "77", "state": "open", "node": "n1", "local_port": 8000,
        "gateway": {"destination": server.destination, "ssh_port": server.port, "identity": str(server.identity),
                    "options": server.client_options()},
        "remote_bind": "127.0.0.1", "remote_port": port,
        "route": {"base_url": f"http://127.0.0.1:{port}/v1", "provider_model_id": "tiny"},
        "host": socket.gethostname(), "srun_pid": pid, "srun_argv": argv, "step_id": None}))


def test_release_kills_the_recorded_pid_only_while_it_runs_the_recorded_command(tmp_path, no_slurm, sshd):
    port = sshdtools.free_port()
    run = _no_slurm_job(tmp_path, sshdtools.free_port())
    other = subprocess.Popen(["sleep", "60"])  # the recorded PID, now another program
    try:
        _tunnel_record(run, sshd, other.pid, ["srun", "--overlap", "--jobid=77"], port)
        proc = cli("release", "77", "--run-dir", str(run), env=no_slurm)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        # Slurm no longer knows job 77 and the PID runs something else: the tunnel ended with its job
        assert "2. tunnel: already: closed at " in proc.stdout
        assert ": job 77 is no longer known to Slurm; its tunnel step ended with it" in proc.stdout
        assert "1. gateway route: reminder: the tunnel closed at " in proc.stdout
        assert json.loads((run / "tunnel.json").read_text())["closed_by"] == "job end"
        assert other.poll() is None  # not ours any more: untouched
    finally:
        other.kill()
        other.wait()
    ours = subprocess.Popen(["sleep", "61"])  # the recorded PID still running the recorded command
    _tunnel_record(run, sshd, ours.pid, ["sleep", "61"], port)
    proc = cli("release", "77", "--run-dir", str(run), "--json", env=no_slurm)
    data = json.loads(proc.stdout)
    assert proc.returncode == 0 and ours.wait(10) == -15  # SIGTERM
    steps = {s["name"]: s for s in data["steps"]}
    assert steps["tunnel"]["status"] == "done" and steps["job"]["status"] == "already"
    assert steps["gateway-port"]["status"] == "done" and "no longer answers" in steps["gateway-port"]["detail"]
    again = cli("release", "77", "--run-dir", str(run), env=no_slurm)
    assert again.stdout.splitlines()[-1] == "job 77: everything is already released"
    assert json.loads((run / "tunnel.json").read_text())["state"] == "closed"


def test_release_fails_while_the_gateway_port_still_answers(tmp_path, no_slurm, sshd, engine):
    port = int(engine.rsplit(":", 1)[1].split("/")[0])  # something answers on the "gateway" port
    run = _no_slurm_job(tmp_path, sshdtools.free_port())
    _tunnel_record(run, sshd, 1, ["srun"], port)
    proc = cli("release", "77", "--run-dir", str(run), env=no_slurm, timeout_s=120)
    assert proc.returncode == 1
    assert f"4. gateway port: failed: 127.0.0.1:{port} on {sshd.destination} still answers" in proc.stdout
    assert f"ss -ltnp 'sport = :{port}'" in proc.stdout and "NOT fully released" in proc.stdout


def test_connect_refuses_a_job_slurm_runs_as_someone_else(tmp_path, no_slurm):
    run = _run_dir(tmp_path)
    record = (f"JobId=77 JobName=serve-only UserId=nobody(65534) JobState=RUNNING Reason=None NumNodes=1 "
              f"NodeList=n1 WorkDir={tmp_path} StdOut={tmp_path}/serve-only-77.out")
    scontrol = Path(no_slurm["PATH"].split(":")[0]) / "scontrol"
    scontrol.write_text(f"#!/bin/sh\necho '{record}'\n")
    for command in (["connect", "77"], ["ping", "77"], ["release", "77"],
                    ["tunnel", "77", "--to", "me@gw", "--remote-port", "8001"], ["bench", "77"],
                    ["batch", "77", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "out.jsonl")]):
        proc = cli(*command, "--run-dir", str(run), env=no_slurm)
        assert proc.returncode == 2 and "job 77 is not yours: Slurm runs it as nobody, you are" in proc.stderr, \
            proc.stderr
        assert proc.stdout == ""


@pytest.mark.parametrize("state, port, dest, found", [
    pytest.param("open", 8001, "me@gw", "41", id="same-port-open"),
    pytest.param("closed", 8001, "me@gw", None, id="closed"),
    pytest.param("open", 8002, "me@gw", None, id="other-port"),
    pytest.param("open", 8001, "me@other-gw", None, id="other-gateway"),
])
def test_a_held_port_is_traced_to_another_jobs_recorded_tunnel(tmp_path, monkeypatch, state, port, dest, found):
    from envlayers.access.tunnel import recorded_holder

    monkeypatch.setenv("ENVLAYERS_RUN_ROOT", str(tmp_path))
    (tmp_path / "41").mkdir()
    (tmp_path / "41" / "tunnel.json").write_text(json.dumps(
        {"job_id": "41", "state": state, "remote_port": port, "gateway": {"destination": dest}}))
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "tunnel.json").write_text("{not json")
    assert recorded_holder(TunnelSpec("42", "n1", 8000, gw.Gateway("me@gw"), "127.0.0.1", 8001)) == found


# ------------------------------------------------------------------------------------------ a chain of successors

def _link(root: Path, job: str, successor: str | None, live: bool, ended: bool = False) -> Path:
    run = root / job
    run.mkdir(parents=True)
    (run / "chain.json").write_text(json.dumps({"predecessor": None, "successor": successor, "left": 1}))
    if live:
        (run / "endpoint.json").write_text(json.dumps({"base_urls": [f"http://n{job[-1]}:8000/v1"]}))
    if ended:
        (run / "launch-end.json").write_text(json.dumps({"code": 0, "reason": f"handed over to successor job {successor}"}))
    return run


def _info(states: dict[str, str]):
    from envlayers.slurm import parse_scontrol_job

    return lambda jid: (parse_scontrol_job(f"JobId={jid} JobName=serve-only JobState={states[jid]} Reason=None")
                        if jid in states else None)


def test_the_chain_is_followed_to_the_newest_link_that_serves(tmp_path):
    from envlayers.job import newest_live
    from envlayers.cli.access_format import moved_line
    from envlayers.rundir import chain_links

    first = _link(tmp_path, "41", "42", live=True, ended=True)
    _link(tmp_path, "42", "43", live=True)
    _link(tmp_path, "43", None, live=False)
    assert [j for j, _ in chain_links("41", first)] == ["41", "42", "43"]
    # 43 is not live yet: 42 serves; 42 draining while 43 is live: 43
    moved = newest_live("41", first, _info({"41": "COMPLETED", "42": "RUNNING", "43": "RUNNING"}))
    assert moved == {"from": "41", "to": "42", "links": ["41", "42"], "state": "RUNNING",
                     "base_urls": ["http://n2:8000/v1"], "run_dir": str(tmp_path / "42")}
    assert moved_line(moved, "COMPLETED") == ("the endpoint moved from job 41 (COMPLETED) to job 42, its successor "
                                              "(chain 41 -> 42); new base URL: http://n2:8000/v1")
    (tmp_path / "43" / "endpoint.json").write_text(json.dumps({"base_urls": ["http://n3:8000/v1"]}))
    moved = newest_live("41", first, _info({"41": "COMPLETED", "42": "RUNNING", "43": "RUNNING"}))
    assert moved["to"] == "43" and moved["links"] == ["41", "42", "43"]
    assert moved_line(moved, None).startswith("the endpoint moved from job 41 to job 43, a later successor (chain "
                                              "41 -> 42 -> 43)")
    assert "42 (RUNNING: it drains and ends) to job 43" in moved_line(newest_live("42", tmp_path / "42", _info(
        {"42": "RUNNING", "43": "RUNNING"})), "RUNNING")
    # Slurm says 43 ended (its files say nothing yet): 42 again; nothing of the chain serves: None
    assert newest_live("41", first, _info({"42": "RUNNING", "43": "CANCELLED"}))["to"] == "42"
    assert newest_live("41", first, _info({"42": "COMPLETED", "43": "PENDING"})) is None
    assert newest_live("43", tmp_path / "43", _info({"43": "RUNNING"})) is None  # the last link serves itself


def test_a_chain_json_cycle_ends_the_walk(tmp_path):
    from envlayers.rundir import chain_links

    _link(tmp_path, "41", "42", live=False)
    _link(tmp_path, "42", "41", live=False)
    assert [j for j, _ in chain_links("41", tmp_path / "41")] == ["41", "42"]
    assert chain_links("41", None) == []


# ------------------------------------------------------------------------------------------ tunnel handover

def _named_server(name: str):
    """A real HTTP server on 127.0.0.1 that answers every GET with its name (one job's endpoint)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/slow":
                time.sleep(1.5)  # a request under way while the port is handed over
            body = name.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _lines_until(proc: subprocess.Popen, needle: str, seen: list[str], timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while not any(needle in ln for ln in seen):
        assert time.monotonic() < deadline, f"no {needle!r} in {seen}"
        line = proc.stdout.readline()
        assert line or proc.poll() is None, f"the node script ended: {seen}"
        seen.append(line.rstrip("\n"))


def test_a_successors_tunnel_takes_the_gateway_port_over_with_no_failed_request(tmp_path, sshd):
    import threading
    import urllib.request

    old_srv, new_srv = _named_server("old"), _named_server("new")
    rport = sshdtools.free_port()
    gateway = _gateway(sshd)
    old = TunnelSpec("5", "n1", old_srv.server_address[1], gateway, "127.0.0.1", rport, keep_alive=True,
                     restarts=2, control=True)
    new = TunnelSpec("6", "n2", new_srv.server_address[1], gateway, "127.0.0.1", rport, takeover=True)

    def node(spec: TunnelSpec, step: str) -> subprocess.Popen:
        env = {**os.environ, "SLURM_JOB_ID": spec.job_id, "SLURM_STEP_ID": step}
        return subprocess.Popen(["bash", "-c", spec.node_script()], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.PIPE, text=True, env=env, start_new_session=True)

    def get(path: str = "/v1/models") -> str:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{rport}{path}", timeout=5) as resp:
                return resp.read().decode()
        except OSError as err:
            return f"error: {err}"

    procs, seen_old, seen_new, answers = [], [], [], []
    try:
        procs.append(node(old, "1"))
        _lines_until(procs[0], "remote forward success for: listen 127.0.0.1:", seen_old)
        assert get() == "old"
        stop = threading.Event()

        def loop():
            while not stop.is_set():
                answers.append((time.monotonic(), get()))
                time.sleep(0.005)

        client = threading.Thread(target=loop)
        client.start()
        procs.append(node(new, "3"))
        _lines_until(procs[1], "ENVLAYERS-TUNNEL: connected; taking over 127.0.0.1:", seen_new)
        time.sleep(0.5)  # the new tunnel asks for the port while the old forward holds it
        assert {a for _, a in answers} == {"old"}
        slow: list[str] = []
        under_way = threading.Thread(target=lambda: slow.append(get("/slow")))
        under_way.start()
        time.sleep(0.3)
        # the cancel step, as it runs in the old job (without srun)
        argv = old.cancel_argv("5.1")
        assert argv[:3] == ["srun", "--overlap", "--jobid=5"] and "--nodelist=n1" in argv
        cancelled = subprocess.run(argv[argv.index("bash"):], capture_output=True, text=True, timeout=30)
        assert cancelled.returncode == 0, cancelled.stderr
        assert get() != "old"  # nothing leads to the old server now, and the new tunnel has not asked yet
        procs[1].stdin.write("go\n")  # as the follower does once the cancel step ended
        procs[1].stdin.flush()
        _lines_until(procs[1], "remote forward success for: listen 127.0.0.1:", seen_new)
        procs[1].stdin.write("recorded\n")  # as the follower does once both records are written
        procs[1].stdin.close()
        time.sleep(0.3)
        stop.set()
        client.join(10)
        under_way.join(10)
        assert slow == ["old"]  # the connection forwarded before the cancel went on to the old server
        said = "".join("o" if a == "old" else "n" if a == "new" else "x" for _, a in answers)
        assert said.rstrip("n").rstrip("x").strip("o") == "" and said.endswith("n"), said
        failed = [t for t, a in answers if a not in ("old", "new")]
        window = (failed[-1] - failed[0]) if failed else 0.0
        print(f"handover: {len(answers)} requests every 5 ms, {len(failed)} refused, window {window * 1000:.0f} ms")
        assert window < 0.5, said
        # the old master ends later (its job ends): --keep-alive does not take the port back
        old_ssh = int(next(ln for ln in seen_old if "ssh pid=" in ln).rsplit("=", 1)[1])
        os.kill(old_ssh, 15)
        assert procs[0].wait(15) == 0
        rest = procs[0].stdout.read()
        assert "after the handover to the successor's tunnel: not restarted" in rest, rest
        assert get() == "new"
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, 15)
                proc.wait(10)
        for sock in ("5.1", "6.3"):
            for suffix in ("", ".handed-over", ".taken"):
                (CONTROL_DIR / f"{sock}.sock{suffix}").unlink(missing_ok=True)
        old_srv.shutdown(), new_srv.shutdown()


def _open_tunnel_record(run: Path, job: str, state: str = "open") -> None:
    (run / "tunnel.json").write_text(json.dumps({"job_id": job, "state": state}))


@pytest.mark.parametrize("states, successor, left, state, code, said", [
    pytest.param({"41": "COMPLETED"}, None, 0, "open", 0, "job 41 ended, the last of its chain: the follower ends",
                 id="chain-over"),
    pytest.param({"41": "RUNNING"}, None, 1, "closed", 0, "the tunnel of job 41 is closed: the follower ends",
                 id="released"),
    pytest.param({"41": "COMPLETED", "42": "FAILED"}, "42", 1, "open", 1,
                 "job 41 ended and no successor will serve (job 42: FAILED): the follower ends", id="successor-failed"),
])
def test_the_chain_follower_ends_with_the_chain(tmp_path, states, successor, left, state, code, said):
    from envlayers.access.handover import follow

    run = tmp_path / "41"
    run.mkdir()
    (run / "chain.json").write_text(json.dumps({"predecessor": None, "successor": successor, "left": left}))
    _open_tunnel_record(run, "41", state)
    assert follow(run, job_info=_info(states), poll_s=0.01) == code
    assert (run / "tunnel.log").read_text().rstrip().endswith(said)


@pytest.mark.parametrize("make", ["link", "others"])
def test_the_control_sockets_directory_must_be_the_users_alone(tmp_path, make):
    from envlayers.access.tunnel import PRIVATE_DIR

    where = tmp_path / "envlayers-tunnel"
    if make == "link":  # a link another user left where the directory goes
        (tmp_path / "elsewhere").mkdir()
        where.symlink_to(tmp_path / "elsewhere")
    else:  # another user's directory under that name
        if os.geteuid() != 0:
            pytest.skip("giving a directory to another user needs root")
        where.mkdir(mode=0o777)
        os.chown(where, 65534, 65534)
    assert "/tmp/envlayers-tunnel-$(id -u)" in PRIVATE_DIR
    proc = subprocess.run(["bash", "-c", PRIVATE_DIR.replace("/tmp/envlayers-tunnel-$(id -u)", str(where))],
                          capture_output=True, text=True, timeout=10)
    assert proc.returncode == 1 and proc.stdout == f"ENVLAYERS-TUNNEL: {where} is not a directory of this user alone\n"
    fine = tmp_path / "mine"
    proc = subprocess.run(["bash", "-c", PRIVATE_DIR.replace("/tmp/envlayers-tunnel-$(id -u)", str(fine))],
                          capture_output=True, text=True, timeout=10)
    assert proc.returncode == 0 and oct(fine.stat().st_mode & 0o777) == "0o700"


def test_release_stops_only_the_recorded_follower(tmp_path):
    from envlayers.access.handover import stop_follower
    from envlayers.access.tunnelrecord import cmdline
    from envlayers.rundir import TunnelRecord

    argv = [sys.executable, "-c", "import time; time.sleep(60)"]
    proc = subprocess.Popen(argv)
    try:
        # until the child has exec'd, its command line is still pytest's (on a busy machine, for a while)
        deadline = time.monotonic() + 60
        while cmdline(proc.pid) != argv and time.monotonic() < deadline:
            time.sleep(0.01)
        assert cmdline(proc.pid) == argv
        other = TunnelRecord(follower={"pid": proc.pid, "argv": [*argv[:2], "other"], "host": socket.gethostname()})
        assert stop_follower(other) is None and proc.poll() is None  # not the recorded command: left alone
        mine = TunnelRecord(follower={"pid": proc.pid, "argv": argv, "host": socket.gethostname()})
        assert stop_follower(mine) == f"chain follower pid {proc.pid} stopped"
        assert proc.wait(10) == -15
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_chain_follower_waits_out_a_slurm_that_does_not_answer(tmp_path, monkeypatch):
    from envlayers.access import handover
    from envlayers.slurm import SlurmError

    monkeypatch.setattr(handover, "SLURM_EVERY_S", 0.05)
    run = tmp_path / "41"
    run.mkdir()
    (run / "chain.json").write_text(json.dumps({"predecessor": "40", "successor": None, "left": 0}))
    _open_tunnel_record(run, "41")
    asked = []

    def job_info(jid):
        asked.append(jid)
        if len(asked) < 3:
            raise SlurmError("`scontrol show job -o 41` did not answer within 30s")
        return _info({"41": "TIMEOUT"})(jid)

    assert handover.follow(run, job_info=job_info, poll_s=0.01) == 0
    log = (run / "tunnel.log").read_text()
    assert log.count("Slurm did not answer (`scontrol show job -o 41` did not answer within 30s); asking again") == 2
    assert log.rstrip().endswith("job 41 ended, the last of its chain: the follower ends")


# ------------------------------------------------------------------------------------------ what holds a port

def _listen_process(port: int) -> subprocess.Popen:
    """A real program (not ssh) listening on 127.0.0.1:port."""
    code = (f"import socket, time; s = socket.socket(); s.bind(('127.0.0.1', {port})); s.listen(); "
            "print('up', flush=True); time.sleep(120)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "up"
    return proc


def _wait_listening(port: int, timeout_s: float = 15) -> None:
    deadline = time.monotonic() + timeout_s
    while f":{port} " not in subprocess.run(["ss", "-Hltn"], capture_output=True, text=True).stdout:
        assert time.monotonic() < deadline, f"nothing listens on {port}"
        time.sleep(0.1)


def test_a_port_held_by_another_program_is_named_and_not_called_a_forward(tmp_path, sshd, monkeypatch):
    from envlayers.access.tunnel import _held_failure

    monkeypatch.setenv("ENVLAYERS_RUN_ROOT", str(tmp_path))
    port = sshdtools.free_port()
    holder = _listen_process(port)
    try:
        spec = TunnelSpec("42", "n1", 8000, _gateway(sshd), "127.0.0.1", port)
        err = _held_failure(spec, "Error: remote port forwarding failed")
        assert f"port {port} on the gateway host 127.0.0.1 is held by python3 (pid {holder.pid}, user " in err.message
        assert "not an ssh forward: another program listens there" in err.message
        assert "earlier forward" not in err.message and "another --remote-port" in err.hint
        assert not any(ln.strip().startswith("kill") for ln in err.lines), err.lines
    finally:
        holder.kill()
        holder.wait()


def test_a_port_held_by_an_earlier_forward_names_its_sshd_and_the_kill_clears_it(tmp_path, sshd, monkeypatch):
    from envlayers.access.tunnel import _held_failure

    monkeypatch.setenv("ENVLAYERS_RUN_ROOT", str(tmp_path))
    port = sshdtools.free_port()
    stale = subprocess.Popen(sshd.ssh_argv("-N", "-R", f"127.0.0.1:{port}:127.0.0.1:9", sshd.destination),
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_listening(port)
        owner = subprocess.run(["ss", "-Hltnp", f"sport = :{port}"], capture_output=True, text=True).stdout
        sshd_pid = int(owner.split('"sshd",pid=')[1].split(",")[0])
        err = _held_failure(TunnelSpec("42", "n1", 8000, _gateway(sshd), "127.0.0.1", port), "refused")
        assert f"port {port} on the gateway host 127.0.0.1 is still held by an earlier forward: an ssh forward: " \
               f"sshd (pid {sshd_pid}, user " in err.message
        kill = next(ln.strip() for ln in err.lines if ln.strip().startswith("kill "))
        assert kill.split("#")[0].split() == ["kill", str(sshd_pid)]
        subprocess.run(kill.split("#")[0].split(), check=True)  # what the advice says, on the "gateway host"
        assert stale.wait(15) is not None
    finally:
        if stale.poll() is None:
            stale.kill()
            stale.wait()


# ------------------------------------------------------------------------------------------ what ssh said

@pytest.mark.parametrize("trouble, said", [
    pytest.param("closed-port", "ssh: connect to host 127.0.0.1 port {port}: Connection refused", id="refused"),
    pytest.param("unknown-host-key", "No ED25519 host key is known for [127.0.0.1]:{port}", id="host-key"),
    pytest.param("unknown-user-key", "Permission denied (publickey)", id="auth"),
])
def test_an_ssh_that_cannot_reach_the_gateway_is_reported_in_its_own_words(tmp_path, sshd, trouble, said):
    from envlayers.access.tunnel import _failure

    port = sshd.port
    options = list(sshd.client_options())
    identity = str(sshd.identity)
    if trouble == "closed-port":
        port = sshdtools.free_port()
    elif trouble == "unknown-host-key":
        (tmp_path / "empty_known_hosts").write_text("")
        options[0] = f"UserKnownHostsFile={tmp_path / 'empty_known_hosts'}"
    else:
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")], check=True)
        identity = str(tmp_path / "other")
    spec = TunnelSpec("5", "n1", 8000, gw.Gateway(sshd.destination, port, identity, tuple(options)), "127.0.0.1",
                      sshdtools.free_port())
    env = {**os.environ, "SLURM_JOB_ID": "5", "SLURM_STEP_ID": "2"}
    proc = subprocess.run(["bash", "-c", spec.node_script()], capture_output=True, text=True, env=env, timeout=60,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 255
    err = _failure("exited", spec, proc.stdout + proc.stderr, 30)
    message = str(err.message)
    assert message.startswith(f"ssh from n1 to the gateway {sshd.destination} failed before the forward was up: ")
    assert said.format(port=port) in message and "\n" not in message, message


STEP_CANCELLED = "slurmstepd: error: *** STEP 5.2 ON n1 CANCELLED AT 2026-12-05T07:00:00 DUE TO TIME LIMIT ***"


@pytest.mark.parametrize("state", ["TIMEOUT", "COMPLETING"])
def test_a_tunnel_step_cut_by_the_jobs_end_says_the_job_ended_not_ssh(state):
    # before: "ssh from n1 to the gateway ... failed before the forward was up: ..." with ssh's hint
    from envlayers.access.tunnel import _failure, job_ended
    from envlayers.slurm import JobInfo

    spec = TunnelSpec("5", "n1", 8000, gw.Gateway("u@gw", 22, None, ()), "127.0.0.1", 9000)
    text = ("ENVLAYERS-TUNNEL: node=n1 step=5.2 pid=10\nsrun: Job step aborted: Waiting up to 32 seconds\n"
            f"{STEP_CANCELLED}\nConnection to gw closed by remote host.\nsrun: error: n1: task 0: Terminated\n")
    ended = job_ended("5", text, job_info=lambda jid: JobInfo(jid, state=state))
    message = _failure("exited", spec, text, 30, ended=ended).message
    assert message == (f"the tunnel step ended before the forward to the gateway u@gw was up: job 5 ended ({state}); "
                       "Slurm said: STEP 5.2 ON n1 CANCELLED AT 2026-12-05T07:00:00 DUE TO TIME LIMIT (not an ssh "
                       "failure)")
    assert job_ended("5", "", job_info=lambda jid: None) == "job 5 ended (no longer known to Slurm)"


def test_a_tunnel_step_of_a_running_job_that_ssh_ended_still_blames_ssh():
    from envlayers.access.tunnel import job_ended
    from envlayers.slurm import JobInfo

    assert job_ended("5", "ssh: connect to host gw port 22: Connection refused\n",
                     job_info=lambda jid: JobInfo(jid, state="RUNNING")) is None


# ------------------------------------------------------------------------------------------ tunnel.json, settled

def _scontrol_says(no_slurm: dict, state: str, tmp_path: Path) -> None:
    import pwd

    me = pwd.getpwuid(os.getuid()).pw_name
    record = (f"JobId=77 JobName=serve-only UserId={me}({os.getuid()}) JobState={state} Reason=None NumNodes=1 "
              f"NodeList=n1 WorkDir={tmp_path} StdOut={tmp_path}/serve-only-77.out EndTime=2026-12-04T05:00:00")
    (Path(no_slurm["PATH"].split(":")[0]) / "scontrol").write_text(f"#!/bin/sh\necho '{record}'\n")


def test_a_tunnel_whose_job_ended_is_not_reported_open_and_its_record_says_so(tmp_path, no_slurm, sshd):
    run = _no_slurm_job(tmp_path, sshdtools.free_port())
    gone = subprocess.Popen(["true"])
    gone.wait()
    _tunnel_record(run, sshd, gone.pid, ["srun", "--overlap", "--jobid=77"], 8001)
    _scontrol_says(no_slurm, "CANCELLED", tmp_path)
    proc = cli("connect", "77", "--run-dir", str(run), env=no_slurm)
    assert proc.returncode == 0, proc.stderr
    assert "(tunnel open" not in proc.stdout
    assert ("gateway:     http://127.0.0.1:8001/v1 on root@127.0.0.1: tunnel closed at 2026-12-04T05:00:00 "
            "(job 77 ended (CANCELLED); its tunnel step ended with it)") in proc.stdout.replace(sshd.destination,
                                                                                              "root@127.0.0.1")
    record = json.loads((run / "tunnel.json").read_text())
    assert (record["state"], record["closed_by"], record["closed_at"]) == ("closed", "job end", "2026-12-04T05:00:00")


def test_a_tunnel_whose_step_ended_while_the_job_runs_says_why(tmp_path, no_slurm, sshd):
    run = _no_slurm_job(tmp_path, sshdtools.free_port())
    gone = subprocess.Popen(["true"])
    gone.wait()
    _tunnel_record(run, sshd, gone.pid, ["srun", "--overlap", "--jobid=77"], 8001)
    record = json.loads((run / "tunnel.json").read_text())
    (run / "tunnel.log").write_text("ENVLAYERS-TUNNEL: ssh exited with code 255 after 3s; giving up after 5 restarts\n"
                                    "srun: error: n1: task 0: Exited with exit code 255\n")
    record["log"] = str(run / "tunnel.log")
    (run / "tunnel.json").write_text(json.dumps(record))
    _scontrol_says(no_slurm, "RUNNING", tmp_path)
    data = json.loads(cli("connect", "77", "--run-dir", str(run), "--json", env=no_slurm).stdout)
    assert data["gateway"] is None
    assert data["tunnel_closed"]["closed_why"] == ("its step ended while job 77 runs (ssh exited with code 255 "
                                                  "after 3s; giving up after 5 restarts)")
    assert json.loads((run / "tunnel.json").read_text())["closed_by"] == "step end"


def test_a_tunnel_whose_job_is_completing_says_the_job_ended(tmp_path, no_slurm, sshd):
    # before: "its step ended while job 77 runs (ssh exited with code 255 ...)": the job's end blamed on ssh
    run = _no_slurm_job(tmp_path, sshdtools.free_port())
    gone = subprocess.Popen(["true"])
    gone.wait()
    _tunnel_record(run, sshd, gone.pid, ["srun", "--overlap", "--jobid=77"], 8001)
    record = json.loads((run / "tunnel.json").read_text())
    (run / "tunnel.log").write_text("ENVLAYERS-TUNNEL: ssh exited with code 255 after 3s; giving up after 5 restarts\n")
    record["log"] = str(run / "tunnel.log")
    (run / "tunnel.json").write_text(json.dumps(record))
    _scontrol_says(no_slurm, "COMPLETING", tmp_path)
    data = json.loads(cli("connect", "77", "--run-dir", str(run), "--json", env=no_slurm).stdout)
    assert data["tunnel_closed"]["closed_why"] == "job 77 ended (COMPLETING); its tunnel step ended with it"
    assert json.loads((run / "tunnel.json").read_text())["closed_by"] == "job end"


def test_a_tunnel_step_slurm_cancelled_says_slurm_did(tmp_path, no_slurm, sshd):
    run = _no_slurm_job(tmp_path, sshdtools.free_port())
    gone = subprocess.Popen(["true"])
    gone.wait()
    _tunnel_record(run, sshd, gone.pid, ["srun", "--overlap", "--jobid=77"], 8001)
    record = json.loads((run / "tunnel.json").read_text())
    (run / "tunnel.log").write_text(f"ENVLAYERS-TUNNEL: ssh pid=12\n{STEP_CANCELLED}\n"
                                    "srun: error: n1: task 0: Terminated\n")
    record["log"] = str(run / "tunnel.log")
    (run / "tunnel.json").write_text(json.dumps(record))
    _scontrol_says(no_slurm, "RUNNING", tmp_path)
    data = json.loads(cli("connect", "77", "--run-dir", str(run), "--json", env=no_slurm).stdout)
    assert data["tunnel_closed"]["closed_why"] == ("Slurm ended its step, not ssh (Slurm said: STEP 5.2 ON n1 "
                                                  "CANCELLED AT 2026-12-05T07:00:00 DUE TO TIME LIMIT)")


# ------------------------------------------------------------------------------------------ an opener killed half way

def test_a_takeover_step_ends_itself_when_its_opener_dies_before_recording_it(sshd):
    """The successor's step, opened by the chain follower, waits for the word "recorded" on its stdin
    (which srun carries from the follower): the follower's end before that ends the step and its ssh."""
    rport = sshdtools.free_port()
    env = {**os.environ, "SLURM_JOB_ID": "6", "SLURM_STEP_ID": "4"}
    results = {}
    for case in ("opener-dies", "recorded"):
        spec = TunnelSpec("6", "n2", sshdtools.free_port(), _gateway(sshd), "127.0.0.1", rport, takeover=True)
        proc = subprocess.Popen(["bash", "-c", spec.node_script()], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
        seen: list[str] = []
        try:
            _lines_until(proc, "ENVLAYERS-TUNNEL: connected; taking over 127.0.0.1:", seen)
            proc.stdin.write("go\n")
            proc.stdin.flush()
            _lines_until(proc, "remote forward success for: listen 127.0.0.1:", seen)
            _wait_listening(rport)
            ssh_pid = int(next(ln for ln in seen if "ssh pid=" in ln).rsplit("=", 1)[1])
            if case == "recorded":
                proc.stdin.write("recorded\n")
            proc.stdin.close()  # the opener's end: its side of the pipe closes
            if case == "opener-dies":
                assert proc.wait(15) is not None
                rest = proc.stdout.read()
                assert "its opener ended before recording this tunnel: ending it" in rest, rest
                deadline = time.monotonic() + 10
                while sshdtools.pid_alive(ssh_pid) or f":{rport} " in subprocess.run(
                        ["ss", "-Hltn"], capture_output=True, text=True).stdout:
                    assert time.monotonic() < deadline, "the takeover's ssh or its forward outlived the opener"
                    time.sleep(0.1)
            else:
                time.sleep(1.0)  # the recorded step goes on after its opener's end
                assert proc.poll() is None and sshdtools.pid_alive(ssh_pid)
                _wait_listening(rport)
            results[case] = "ok"
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, 15)
                proc.wait(10)
            for suffix in ("", ".taken"):
                (CONTROL_DIR / f"6.4.sock{suffix}").unlink(missing_ok=True)
    assert results == {"opener-dies": "ok", "recorded": "ok"}
