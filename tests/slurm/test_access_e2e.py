"""From SUBMIT=0 to a chat completion through a gateway host's fixed loopback port, and back to
everything released, on the real local Slurm cluster with a real sshd as the gateway host.

Three network stacks, as on a site: the login node is this host, the API node is the job's lab
node, and the gateway host is another lab node's network namespace (the job does not use that node),
where a private sshd (tests/sshdtools.py) listens on the node's lab address. The tunnel's remote
end is that namespace's 127.0.0.1, so what answers there came through the tunnel. Nothing leaves
127.0.0.0/8 and the lab's own namespaces.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from labtools import TERMINAL_STATES, lab_command, pid_alive
from labruns import BANNER, Run

import sshdtools

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slurm


def netns_of(lab) -> dict[str, str]:
    """Lab node -> its network namespace, from `cluster/slurm-lab status`."""
    out = lab_command("status", env={"ENVLAYERS_LAB_DIR": str(lab.lab_dir)}).stdout
    return dict(re.findall(r"^node: name=(\S+) .*netns=(\S+)$", out, re.M))


class Gateway:
    """A private sshd in the namespace of a lab node the job does not use."""

    def __init__(self, lab, folder: Path, node: str):
        self.node, self.netns = node, netns_of(lab)[node]
        self.server = sshdtools.Sshd.start(folder, listen=lab.nodes[node], netns=self.netns)

    def tunnel_args(self) -> list[str]:
        args = ["--to", self.server.destination, "--ssh-port", str(self.server.port),
                "--identity", str(self.server.identity)]
        for opt in self.server.client_options():
            args += ["-o", opt]
        return args

    def sh(self, *argv: str, timeout_s: float = 30) -> subprocess.CompletedProcess:
        """A command on the gateway host (in its namespace)."""
        return subprocess.run(["ip", "netns", "exec", self.netns, *argv], capture_output=True, text=True,
                              timeout=timeout_s, env={**os.environ, "PYTHONPATH": str(REPO / "src")})


@pytest.fixture
def gateways(slurm_lab, tmp_path):
    """Starts a gateway beside a running job: ``gateways(job_id)``. Stopped (and checked gone) at teardown."""
    if slurm_lab.mode != "netns":
        pytest.skip("needs the lab's network namespaces (a gateway host apart from the API node)")
    reason = sshdtools.ensure_openssh()
    if reason:
        pytest.fail(reason) if os.environ.get("ENVLAYERS_REQUIRE_SLURM") == "1" else pytest.skip(reason)
    started: list[Gateway] = []

    def start(job_id: str) -> Gateway:
        used = slurm_lab.job_info(job_id)["NodeList"]
        node = next(n for n in sorted(slurm_lab.nodes, reverse=True) if n != used)
        started.append(Gateway(slurm_lab, tmp_path / f"gateway-{len(started)}", node))
        return started[-1]

    yield start
    for gw in started:
        pids = gw.server.stop()
        assert not any(sshdtools.pid_alive(p) for p in pids), "the gateway sshd outlived the test"


def env_layers(run: Run, *args: str, timeout_s: float = 90, **more: str) -> subprocess.CompletedProcess:
    env = {**run.env, "PYTHONPATH": str(REPO / "src"), **more}
    return subprocess.run([sys.executable, "-m", "envlayers", *args], cwd=run.dir, env=env, capture_output=True,
                          text=True, timeout=timeout_s)


def start_job(lab, tmp_path: Path) -> tuple[Run, str]:
    key = "k3y-" + os.urandom(6).hex()
    key_file = tmp_path / "api-key"
    key_file.write_text(key + "\n")
    key_file.chmod(0o600)
    # the job runs this checkout's launcher too, not whichever envlayers is installed
    run = Run(lab, tmp_path, layer=f"SERVER_API_KEY_FILE={key_file}\n", SERVE_TIME="00:10:00",
              PYTHONPATH=f"{REPO / 'tests' / 'standin' / 'pypath'}:{REPO / 'src'}")
    dry = run.sbatch(submit=False)
    assert "sbatch" in dry.stdout and BANNER not in dry.stdout
    run.submit()
    live = env_layers(run, "wait", run.job_id, "--timeout", "60", "--progress", "none")
    assert live.returncode == 0, live.stdout + live.stderr
    return run, key


def test_submit_to_gateway_chat_to_release(slurm_lab, gateways, tmp_path):
    run, key = start_job(slurm_lab, tmp_path)
    gateway = gateways(run.job_id)
    jid = run.job_id
    key_file = tmp_path / "api-key"

    # what a client needs, and a check of the endpoint with the job's key
    connect = env_layers(run, "connect", jid)
    assert connect.returncode == 0, connect.stderr
    assert f"API key:     required; it is in {key_file}" in connect.stdout and key not in connect.stdout
    ping = env_layers(run, "ping", jid, "--json")
    assert ping.returncode == 0 and json.loads(ping.stdout)["ok"], ping.stdout + ping.stderr

    # the tool's own refusal of a public gateway bind: nothing is started
    steps_before = slurm_lab.run(["squeue", "-h", "-s", "-j", jid, "-o", "%i"]).stdout
    public = env_layers(run, "tunnel", jid, *gateway.tunnel_args(), "--remote-port", "8001", "--remote-bind", "0.0.0.0")
    assert public.returncode == 2 and "binds every interface of the gateway host" in public.stderr
    assert slurm_lab.run(["squeue", "-h", "-s", "-j", jid, "-o", "%i"]).stdout == steps_before
    assert not (run.run_dir / "tunnel.log").exists()

    # an unreachable gateway sshd: ssh's own words, naming the host, in one line
    closed = sshdtools.free_port()
    args = gateway.tunnel_args()
    args[args.index("--ssh-port") + 1] = str(closed)
    unreachable = env_layers(run, "tunnel", jid, *args, "--remote-port", "8001")
    assert unreachable.returncode == 1, unreachable.stdout + unreachable.stderr
    first = unreachable.stderr.splitlines()[0]
    assert first.startswith(f"env_layers: error: ssh from ") and \
        f"to the gateway {gateway.server.destination} failed before the forward was up: ssh: connect to host " \
        f"{gateway.server.listen} port {closed}: Connection refused (ssh exit 255)" in first, unreachable.stderr
    assert "srun: error" not in unreachable.stderr
    assert not (run.run_dir / "tunnel.json").exists()

    # another program (not ssh) holds the port on the gateway host: named, and no kill advice
    rport = sshdtools.free_port()
    code = (f"import socket, time; s = socket.socket(); s.bind(('127.0.0.1', {rport})); s.listen(); "
            "print('up', flush=True); time.sleep(300)")
    squatter = subprocess.Popen(["ip", "netns", "exec", gateway.netns, sys.executable, "-c", code],
                                stdout=subprocess.PIPE, text=True)
    try:
        assert squatter.stdout.readline().strip() == "up"
        taken = env_layers(run, "tunnel", jid, *gateway.tunnel_args(), "--remote-port", str(rport))
        assert taken.returncode == 1, taken.stdout + taken.stderr
        assert f"port {rport} on the gateway host {gateway.server.listen} is held by python3 (pid {squatter.pid}, " \
               "user root" in taken.stderr and "not an ssh forward: another program listens there" in taken.stderr, \
            taken.stderr
        assert "earlier forward" not in taken.stderr and "kill" not in taken.stderr
    finally:
        squatter.kill()
        squatter.wait(10)

    # an earlier allocation's forward still holds the port on the gateway host
    stale = subprocess.Popen(gateway.server.ssh_argv("-N", "-R", f"127.0.0.1:{rport}:127.0.0.1:9",
                                                     gateway.server.destination),
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 15
        while f":{rport}" not in gateway.sh("ss", "-Hltn").stdout:
            assert time.monotonic() < deadline and stale.poll() is None, "the stale forward did not come up"
            time.sleep(0.1)
        held = env_layers(run, "tunnel", jid, *gateway.tunnel_args(), "--remote-port", str(rport))
        assert held.returncode == 1, held.stdout + held.stderr
        holder = gateway.sh("ss", "-Hltnp", f"sport = :{rport}").stdout
        pid = int(re.search(r'"sshd",pid=(\d+)', holder).group(1))
        assert f"port {rport} on the gateway host {gateway.server.listen} is still held by an earlier forward: " \
               f"an ssh forward: sshd (pid {pid}, user root" in held.stderr, held.stderr
        printed = [ln.strip() for ln in held.stderr.splitlines()]
        find = next(ln for ln in printed if ln.startswith("ss -ltnp"))
        kill = next(ln for ln in printed if ln.startswith("kill "))
        assert find.startswith(f"ss -ltnp 'sport = :{rport}'") and kill.split("#")[0].split() == ["kill", str(pid)]
        # follow the printed advice on the gateway host
        gateway.sh(*kill.split("#")[0].split())
        stale.wait(15)
    finally:
        if stale.poll() is None:
            stale.kill()
            stale.wait(5)

    # now the tunnel: from the API node, inside the job
    opened = env_layers(run, "tunnel", jid, *gateway.tunnel_args(), "--remote-port", str(rport))
    assert opened.returncode == 0, opened.stdout + opened.stderr
    assert "gateway route entry:\n" f"  base_url: http://127.0.0.1:{rport}/v1\n" \
           "  provider_model_id: hpcagent-bench-vllm\n" in opened.stdout
    assert f"gateway: 127.0.0.1:{rport} answers on the gateway host (answered: HTTP/1.1 401" in opened.stdout
    record = json.loads((run.run_dir / "tunnel.json").read_text())
    assert record["state"] == "open" and record["srun_argv"][:3] == ["srun", "--overlap", f"--jobid={jid}"]
    assert pid_alive(record["srun_pid"]) and pid_alive(record["node_pid"], "ssh")
    assert f"-R 127.0.0.1:{rport}:127.0.0.1:8000" in record["ssh_command"]
    assert key not in (run.run_dir / "tunnel.log").read_text()
    second = env_layers(run, "tunnel", jid, *gateway.tunnel_args(), "--remote-port", str(rport + 1))
    assert second.returncode == 2 and f"job {jid} already has a tunnel to" in second.stderr

    # a chat completion through the gateway host's fixed loopback port, with the key
    body = json.dumps({"model": "hpcagent-bench-vllm", "max_tokens": 8,
                       "messages": [{"role": "user", "content": "hi"}]})
    chat = gateway.sh("curl", "-s", "-m", "10", f"http://127.0.0.1:{rport}/v1/chat/completions",
                      "-H", "Content-Type: application/json", "-H", f"Authorization: Bearer {key}", "-d", body)
    answer = json.loads(chat.stdout)
    assert answer["model"] == "hpcagent-bench-vllm" and answer["choices"][0]["message"]["content"]
    via = gateway.sh(sys.executable, "-m", "envlayers", "ping", f"http://127.0.0.1:{rport}/v1",
                     "--api-key-file", str(key_file))
    assert via.returncode == 0, via.stdout + via.stderr
    assert "gateway:     http://127.0.0.1:" in env_layers(run, "connect", jid).stdout

    # release, in order, and nothing left running
    released = env_layers(run, "release", jid)
    assert released.returncode == 0, released.stdout + released.stderr
    lines = released.stdout.splitlines()
    assert lines[0].startswith("1. gateway route: reminder: remove this route")
    assert lines[1:3] == [f"     base_url: http://127.0.0.1:{rport}/v1", "     provider_model_id: hpcagent-bench-vllm"]
    assert lines[3] == f"2. tunnel: done: scancel {record['step_id']}, srun pid {record['srun_pid']} ended"
    assert lines[4].startswith("3. server and allocation: done: scancel sent (RUNNING); ended (CANCELLED)")
    assert f"4. gateway port: done: 127.0.0.1:{rport} on {gateway.server.destination} no longer answers" \
        in released.stdout
    assert lines[-1] == f"job {jid}: released"
    assert not pid_alive(record["srun_pid"]) and not pid_alive(record["node_pid"])
    assert f":{rport}" not in gateway.sh("ss", "-Hltn").stdout
    run.assert_nothing_left()
    again = env_layers(run, "release", jid)
    assert again.returncode == 0 and again.stdout.splitlines()[-1] == f"job {jid}: everything is already released"
    assert "2. tunnel: already: closed at " in again.stdout


def test_keep_alive_restarts_a_dropped_tunnel_and_the_job_end_stops_it(slurm_lab, gateways, tmp_path):
    run, key = start_job(slurm_lab, tmp_path)
    gateway = gateways(run.job_id)
    rport = sshdtools.free_port()
    opened = env_layers(run, "tunnel", run.job_id, *gateway.tunnel_args(), "--remote-port", str(rport),
                        "--keep-alive", "--restarts", "2")
    assert opened.returncode == 0, opened.stdout + opened.stderr
    assert "up to 2 times in a row, 2 s to 60 s apart" in opened.stdout
    record = json.loads((run.run_dir / "tunnel.json").read_text())
    log = run.run_dir / "tunnel.log"
    first = int(re.search(r"ENVLAYERS-TUNNEL: ssh pid=(\d+)", log.read_text()).group(1))
    os.kill(first, 9)  # the connection drops
    deadline = time.monotonic() + 30
    while "restart 1/2 in 2s" not in log.read_text() or log.read_text().count("remote forward success") < 2:
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.2)
    ping = gateway.sh(sys.executable, "-m", "envlayers", "ping", f"http://127.0.0.1:{rport}/v1",
                      "--api-key-file", str(tmp_path / "api-key"))
    assert ping.returncode == 0, ping.stdout + ping.stderr
    # the job ends: the tunnel step ends with it
    slurm_lab.cancel(run.job_id)
    assert run.state() == "CANCELLED"
    deadline = time.monotonic() + 15
    while pid_alive(record["node_pid"]) or pid_alive(record["srun_pid"]):
        assert time.monotonic() < deadline, "the tunnel outlived its job"
        time.sleep(0.2)
    # the record and every reader say the tunnel closed with the job, and when
    connect = env_layers(run, "connect", run.job_id)
    assert "(tunnel open" not in connect.stdout and \
        f"tunnel closed at " in connect.stdout and f"(job {run.job_id} ended (CANCELLED); its tunnel step ended " \
        "with it)" in connect.stdout, connect.stdout + connect.stderr
    settled = json.loads((run.run_dir / "tunnel.json").read_text())
    assert (settled["state"], settled["closed_by"]) == ("closed", "job end") and settled["closed_at"], settled
    released = env_layers(run, "release", run.job_id)
    assert released.returncode == 0, released.stdout + released.stderr
    assert f"2. tunnel: already: closed at {settled['closed_at']}: job {run.job_id} ended (CANCELLED)" \
        in released.stdout and "3. server and allocation: already" in released.stdout, released.stdout
    assert "1. gateway route: reminder: the tunnel closed at" in released.stdout
    again = env_layers(run, "release", run.job_id)
    assert "1. gateway route: already: reminded" in again.stdout, again.stdout


# a client on the gateway host's loopback port: GET /v1/models with the key every 20 ms, each outcome
# one line of JSON, until the stop file appears (bounded)
CLIENT_LOOP = r"""
import json, sys, time, urllib.request, os
url, key, out, stop = sys.argv[1:5]
deadline = time.time() + 900
with open(out, "a") as fh:
    while not os.path.exists(stop) and time.time() < deadline:
        t = time.time()
        req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"})
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                ok, said = resp.status == 200, str(resp.status)
        except Exception as err:
            ok, said = False, str(err)[:120]
        fh.write(json.dumps({"t": t, "ok": ok, "said": said}) + "\n")
        fh.flush()
        time.sleep(0.02)
"""


def gaps(lines: list[dict]) -> tuple[float, int]:
    """(the longest time from a failed request to the next answered one, failed requests)."""
    longest, first_fail, failed = 0.0, None, 0
    for rec in lines:
        if rec["ok"]:
            if first_fail is not None:
                longest = max(longest, rec["t"] - first_fail)
            first_fail = None
        else:
            failed += 1
            first_fail = rec["t"] if first_fail is None else first_fail
    return longest, failed


def test_a_tunnel_follows_a_chain_of_successors_and_clients_see_the_moves(slurm_lab, gateways, tmp_path):
    # a 4 min limit: each successor starts 1 min after its predecessor; a per-job key the chain keeps;
    # partition and account from the submitting shell (the job script names neither)
    run = Run(slurm_lab, tmp_path, layer="SERVER_API_KEY_FILE=generate\nSLURM_PARTITION=\nSUCCESSORS=2\n"
              "SUCCESSOR_DRAIN_S=8\n", SERVE_TIME="00:04:00", SBATCH_PARTITION="mi200", SBATCH_ACCOUNT="chain-acct",
              PYTHONPATH=f"{REPO / 'tests' / 'standin' / 'pypath'}:{REPO / 'src'}")
    first = run.submit()
    live = env_layers(run, "wait", first, "--timeout", "60", "--progress", "none")
    assert live.returncode == 0, live.stdout + live.stderr
    key = (run.run_dir / "api-key").read_text().strip()
    gateway = gateways(first)
    rport = sshdtools.free_port()
    opened = env_layers(run, "tunnel", first, *gateway.tunnel_args(), "--remote-port", str(rport))
    assert opened.returncode == 0, opened.stdout + opened.stderr
    assert f"tunnel: follows the chain of successors: when job {first}'s successor is live" in opened.stdout
    follower = json.loads((run.run_dir / "tunnel.json").read_text())["follower"]
    assert pid_alive(follower["pid"])

    loop = tmp_path / "client_loop.py"
    loop.write_text(CLIENT_LOOP)
    answers, stop = tmp_path / "answers.jsonl", tmp_path / "stop-client"
    client = subprocess.Popen(["ip", "netns", "exec", gateway.netns, sys.executable, str(loop),
                               f"http://127.0.0.1:{rport}/v1/models", key, str(answers), str(stop)],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    root = run.run_dir.parent
    chain = [first]
    try:
        deadline = time.monotonic() + 480
        while time.monotonic() < deadline:
            rec = root / chain[-1] / "chain.json"
            succ = json.loads(rec.read_text()).get("successor") if rec.exists() else None
            if succ and succ not in chain:
                chain.append(succ)
                slurm_lab._submitted.append(succ)
            done = len(chain) == 3 and (root / chain[2] / "tunnel.json").exists()
            if done and all((slurm_lab.job_info(j) or {}).get("JobState", "COMPLETED") in TERMINAL_STATES
                            for j in chain[:2]):
                break
            time.sleep(1)
        time.sleep(3)
    finally:
        stop.write_text("")
        client.wait(30)
    lines = [json.loads(ln) for ln in answers.read_text().splitlines()]
    assert len(chain) == 3, chain
    for old, new in zip(chain, chain[1:]):
        old_rec = json.loads((root / old / "tunnel.json").read_text())
        new_rec = json.loads((root / new / "tunnel.json").read_text())
        assert old_rec["state"] == "handed-over" and old_rec["successor"] == new, old_rec
        assert new_rec["took_over_from"] == old and new_rec["remote_port"] == rport
        log = (root / new / "tunnel.log").read_text()
        assert f"ENVLAYERS-TUNNEL: remote forward success for: listen 127.0.0.1:{rport} (taken over)" in log, log
        assert (root / new / "api-key").read_text().strip() == key
        info = slurm_lab.job_info(new)
        assert (info["Partition"], info["Account"]) == ("mi200", "chain-acct"), info
        out = (tmp_path / f"serve-only-{old}.out").read_text()
        assert re.search(rf"^ENVLAYERS-STAGE: successor job {new}: sbatch --parsable --dependency=after:{old}\+1 "
                         r"--time=0:04:00 --partition=mi200 --account=chain-acct --chdir=\S+ \S+/job.sh; it keeps this "
                         r"job's API key$", out, re.M), out
    longest, failed = gaps(lines)
    span = lines[-1]["t"] - lines[0]["t"]
    print(f"chain {chain}: {len(lines)} requests through the gateway port over {span:.0f}s, {failed} failed, "
          f"longest window without an answer {longest * 1000:.0f} ms; the follower's own measure: "
          + ", ".join(str(json.loads((root / j / 'tunnel.json').read_text()).get("closed_s")) for j in chain[:2]))
    assert span > 120 and longest < 2.0, (longest, [ln for ln in lines if not ln["ok"]][:10])

    # a client that kept the first job's node URL: connect and status say where the endpoint went
    last_url = json.loads((root / chain[2] / "endpoint.json").read_text())["base_urls"][0]
    moved = (f"the endpoint moved from job {first} (COMPLETED) to job {chain[2]}, a later successor (chain "
             f"{first} -> {chain[1]} -> {chain[2]}); new base URL: {last_url}")
    connect = env_layers(run, "connect", first)
    print(connect.stdout)
    assert connect.returncode == 0 and f"moved:       {moved}\n" in connect.stdout, connect.stdout + connect.stderr
    assert f"job {chain[2]}: RUNNING\nbase URL:    {last_url}" in connect.stdout
    data = json.loads(env_layers(run, "connect", first, "--json").stdout)
    assert data["job_id"] == chain[2] and data["moved"]["from"] == first and data["base_urls"] == [last_url]
    shown = env_layers(run, "status", first, "--no-probe").stdout
    assert f"  moved:       {moved}\n" in shown, shown
    assert json.loads(env_layers(run, "status", first, "--json", "--no-probe").stdout)["chain"]["moved"]["to"] == chain[2]
    pinged = env_layers(run, "ping", first)  # the successor's key, from its run dir
    assert pinged.returncode == 0 and pinged.stdout.startswith(f"moved: {moved}\n"), pinged.stdout + pinged.stderr

    # release from the first job's id: the follower, the last job and its tunnel; the port closes
    released = env_layers(run, "release", first)
    print(opened.stdout + shown + released.stdout)
    assert released.returncode == 0, released.stdout + released.stderr
    assert f"2c. successors (chain): done: 2 later job(s) of the chain" in released.stdout, released.stdout
    assert f"job {chain[2]}: tunnel closed; RUNNING -> " in released.stdout
    assert f"4. gateway port: done: 127.0.0.1:{rport} on {gateway.server.destination} no longer answers" \
        in released.stdout, released.stdout
    deadline = time.monotonic() + 15
    while pid_alive(follower["pid"]):
        assert time.monotonic() < deadline, "the chain follower outlived the release"
        time.sleep(0.2)
    assert f":{rport}" not in gateway.sh("ss", "-Hltn").stdout


def test_a_follower_killed_before_recording_the_successors_tunnel_leaves_nothing_of_it(slurm_lab, gateways, tmp_path):
    # the follower pauses once the successor's forward is up, before anything records it: this test's
    # sitecustomize.py (tests/slurm/pausehook), on the PYTHONPATH of the tunnel command and so of its follower
    pause = tmp_path / "paused.json"
    run = Run(slurm_lab, tmp_path, layer="SERVER_API_KEY_FILE=generate\nSLURM_PARTITION=\nSUCCESSORS=1\n"
              "SUCCESSOR_DRAIN_S=8\n", SERVE_TIME="00:04:00", SBATCH_PARTITION="mi200", SBATCH_ACCOUNT="chain-acct",
              PYTHONPATH=f"{REPO / 'tests' / 'standin' / 'pypath'}:{REPO / 'src'}")
    first = run.submit()
    live = env_layers(run, "wait", first, "--timeout", "60", "--progress", "none")
    assert live.returncode == 0, live.stdout + live.stderr
    gateway = gateways(first)
    rport = sshdtools.free_port()
    opened = env_layers(run, "tunnel", first, *gateway.tunnel_args(), "--remote-port", str(rport),
                        PYTHONPATH=f"{Path(__file__).parent / 'pausehook'}:{REPO / 'src'}",
                        PAUSE_BEFORE_RECORD=str(pause))
    assert opened.returncode == 0, opened.stdout + opened.stderr
    follower = json.loads((run.run_dir / "tunnel.json").read_text())["follower"]
    root = run.run_dir.parent
    succ, paused = None, None
    deadline = time.monotonic() + 300
    while paused is None:
        assert time.monotonic() < deadline and pid_alive(follower["pid"]), "the follower never reached the pause"
        chain = run.run_dir / "chain.json"
        found = json.loads(chain.read_text()).get("successor") if chain.exists() else None
        if found and found != succ:
            succ = found
            slurm_lab._submitted.append(succ)
        try:
            paused = json.loads(pause.read_text())
        except (OSError, ValueError):
            time.sleep(0.5)
    assert paused["follower_pid"] == follower["pid"] and succ
    intent = json.loads((root / succ / "tunnel.json").read_text())
    assert intent["state"] == "opening" and intent["srun_pid"] == paused["srun_pid"], intent
    assert pid_alive(paused["srun_pid"]) and f":{rport}" in gateway.sh("ss", "-Hltn").stdout

    os.kill(follower["pid"], 9)  # killed between opening the successor's forward and recording it
    deadline = time.monotonic() + 60
    while True:
        steps = slurm_lab.run(["squeue", "-h", "-s", "-j", succ, "-o", "%i %j"]).stdout
        left = [pid for pid in (paused["srun_pid"], paused["node_pid"]) if pid and pid_alive(pid)]
        held = f":{rport}" in gateway.sh("ss", "-Hltn").stdout
        if not left and "envlayers-tunnel" not in steps and not held:
            break
        assert time.monotonic() < deadline, f"left after the follower's death: pids {left}, steps {steps!r}, port " \
                                            f"held {held}"
        time.sleep(0.5)
    log = (root / succ / "tunnel.log").read_text()
    assert "its opener ended before recording this tunnel: ending it" in log, log
    connect = env_layers(run, "connect", succ)
    assert connect.returncode == 0 and "(tunnel open" not in connect.stdout, connect.stdout + connect.stderr
    settled = json.loads((root / succ / "tunnel.json").read_text())
    assert (settled["state"], settled["closed_by"]) == ("closed", "opener end"), settled
    print(f"follower {follower['pid']} killed at the pause: step of job {succ} (srun pid {paused['srun_pid']}) "
          f"ended by itself; record: {settled['closed_why']}")
    released = env_layers(run, "release", first)
    assert released.returncode == 0, released.stdout + released.stderr


def test_a_tunnel_cut_by_the_jobs_end_says_the_job_ended_not_ssh(slurm_lab, tmp_path):
    # a gateway host that takes the connection and never answers: ssh waits, the job ends meanwhile. The
    # error used to be "ssh from n1 to the gateway ... failed before the forward was up" with ssh's hint
    if slurm_lab.mode != "netns":
        pytest.skip("needs the lab's network namespaces (a gateway host apart from the API node)")
    run, _ = start_job(slurm_lab, tmp_path)
    jid = run.job_id
    used = slurm_lab.job_info(jid)["NodeList"]
    node = next(n for n in sorted(slurm_lab.nodes, reverse=True) if n != used)
    addr, port = slurm_lab.nodes[node], sshdtools.free_port()
    silent = subprocess.Popen(["ip", "netns", "exec", netns_of(slurm_lab)[node], sys.executable, "-c",
                               "import socket, sys, time\ns = socket.create_server((sys.argv[1], int(sys.argv[2])))\n"
                               "print('listening', flush=True)\nconns = []\n"
                               "while True:\n    conns.append(s.accept())\n", addr, str(port)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert silent.stdout.readline() == "listening\n"
        env = dict(run.env, PYTHONPATH=str(REPO / "src"))
        opener = subprocess.Popen([sys.executable, "-m", "envlayers", "tunnel", jid, "--to", f"root@{addr}",
                                   "--ssh-port", str(port), "--remote-port", "8001", "--start-timeout", "120"],
                                  cwd=run.dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        log = run.run_dir / "tunnel.log"
        deadline = time.monotonic() + 60
        while "ENVLAYERS-TUNNEL: node=" not in (log.read_text() if log.exists() else ""):  # the step runs
            assert opener.poll() is None and time.monotonic() < deadline, opener.communicate()
            time.sleep(0.1)
        slurm_lab.cancel(jid)
        out, err = opener.communicate(timeout=90)
    finally:
        silent.kill()
        silent.wait()
    assert opener.returncode == 1, out + err
    first = err.splitlines()[0]
    assert first.startswith(f"env_layers: error: the tunnel step ended before the forward to the gateway root@{addr} "
                            f"was up: job {jid} ended ("), err
    assert "(not an ssh failure)" in first and "ssh from" not in err, err
