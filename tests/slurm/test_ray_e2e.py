"""The ray and gateway shapes end to end on the lab, with real Ray across the lab's network-namespace nodes.

The only stand-in is the engine (tests/standin): given ``--distributed-executor-backend ray`` it joins
the Ray cluster at RAY_ADDRESS and refuses to start unless the cluster has the node count the test
expects (STANDIN_RAY_NODES), so an answer proves the cluster formed. Every Ray process a job started is
recorded in its run directory (ray-pids-<rank>.txt); after scancel none of them may be alive.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from extratools import needs_extra

from labtools import gateway_ready, processes_mentioning
from labruns import BANNER, KEYLESS, REPO, STANDIN, Run

if not os.environ.get("ENVLAYERS_REQUIRE_SLURM"):
    needs_extra("ray", "ray")  # the test command installs it
openai = needs_extra("openai", "test")

pytestmark = pytest.mark.slurm


def ray_run(lab, tmp_path: Path, **kw) -> Run:
    """A Run whose ranks find `ray` and `python3` of this interpreter's environment (where the extra is
    installed), after the stand-in's `vllm`."""
    bin_dir = Path(sys.executable).parent
    layer = kw.pop("layer", "")
    kw["layer"] = layer if "SERVER_API_KEY_FILE" in layer else KEYLESS + layer  # keyless unless the test names a key
    return Run(lab, tmp_path, PATH=f"{STANDIN / 'bin'}:{bin_dir}:{lab.env.get('PATH', os.environ['PATH'])}", **kw)


def recorded_pids(run_dir: Path) -> dict[int, int]:
    """pid -> start time, from every rank's ray-pids-<rank>.txt."""
    out = {}
    for f in run_dir.glob("ray-pids-*.txt"):
        for line in f.read_text().splitlines():
            pid, start, _name = line.split(" ", 2)
            out[int(pid)] = int(start)
    return out


def still_alive(pids: dict[int, int]) -> list[int]:
    alive = []
    for pid, start in pids.items():
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if fields[0] not in ("Z", "X") and int(fields[19]) == start:
            alive.append(pid)
    return alive


def assert_no_ray_left(run: Run, timeout_s: float = 30) -> None:
    pids = recorded_pids(run.run_dir)
    names = " ".join(line.split(" ", 2)[2] for f in run.run_dir.glob("ray-pids-*.txt")
                     for line in f.read_text().splitlines())
    assert "gcs_server" in names and names.count("raylet") >= 2, names  # the head's GCS, a raylet per node
    deadline = time.monotonic() + timeout_s
    while still_alive(pids) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert not still_alive(pids), f"Ray processes of job {run.job_id} survived: {still_alive(pids)}"
    run.assert_nothing_left()


def openai_answers(lab, text: str, api_key: str = "EMPTY") -> str:
    """The printed base URL (node name -> its address: the host cannot resolve lab names), asked through
    the official client; returns the served name it listed."""
    base = re.search(r"^base URL: (\S+)$", text, re.M).group(1)
    served = re.search(r"^served name: (\S+)", text, re.M).group(1)
    base = re.sub(r"http://(n\d+):", lambda m: f"http://{lab.nodes[m.group(1)]}:", base)
    client = openai.OpenAI(base_url=base, api_key=api_key, max_retries=0, timeout=30)
    assert [m.id for m in client.models.list()] == [served]
    reply = client.chat.completions.create(model=served, max_tokens=16,
                                           messages=[{"role": "user", "content": "Say hi."}])
    assert reply.model == served and reply.choices[0].message.content
    return served


RAY_CLIENT = """
import sys
import ray
try:
    ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
    print("JOINED", sum(1 for n in ray.nodes() if n.get("Alive")))
except Exception as err:
    print("REFUSED", type(err).__name__, " ".join(str(err).split())[:300])
"""


def ray_client(home: Path, address: str) -> str:
    """What a plain ``ray.init(address=...)`` from outside the job gets: no token in its environment, a
    HOME of its own (Ray also looks for ~/.ray/auth_token). Its last line (JOINED n | REFUSED ...) and
    the GCS client's complaint, if it printed one."""
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(HOME=str(home), RAY_USAGE_STATS_ENABLED="0")
    proc = subprocess.run([sys.executable, "-c", RAY_CLIENT, address], env=env, capture_output=True, text=True,
                          timeout=180)
    said = [line for line in proc.stdout.splitlines() if line.startswith(("JOINED", "REFUSED"))]
    complaint = next((line for line in proc.stderr.splitlines() if "Unauthenticated" in line), "")
    return (said[-1] if said else f"no answer (rc={proc.returncode}): {proc.stderr[-300:]}") + " " + complaint


def ray_records(run: Run) -> list[dict]:
    lines = (run.dir / "engines.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if "ray" in r]


def test_ray_shape_forms_one_cluster_on_two_nodes_and_leaves_no_ray_process(netns_lab, tmp_path):
    # llama405bray: tp=8 on 2 nodes of 4 GPUs, vLLM's Ray executor
    run = ray_run(netns_lab, tmp_path, model="llama405bray", layer="RAY_NUM_CPUS=1\n", SERVE_TIME="00:10:00",
              STANDIN_RAY_NODES="2")
    run.submit()
    text = run.wait_for("^" + re.escape(BANNER), timeout_s=180)
    n1 = netns_lab.nodes["n1"]
    assert "ENVLAYERS-TOPOLOGY: shape=ray nodes=2 gpus_per_node=4 tp=8 pp=1 world=8 api_rank=0 port=8000" in text
    # the head's port: RDZV_PORT, or the first free one above it on the head node
    port = re.search(rf"^ENVLAYERS-TOPOLOGY: ray_head={re.escape(n1)}:(29[56]\d\d) ray_nodes=2 join_timeout=300s ",
                     text, re.M).group(1)
    assert "--distributed-executor-backend ray" in text
    assert re.search(rf"^ENVLAYERS-STAGE: rank 1 on n2: .*ray start --address=n1:{port} .*--num-cpus=1 .*--block$",
                     text, re.M)
    head_log = (run.run_dir / "server-0.log").read_text()
    assert f"ENVLAYERS-STAGE: ray: 2 of 2 node(s) joined the cluster at {n1}:{port}" in head_log
    assert re.search(rf"^ENVLAYERS-STAGE: ray cluster at {re.escape(n1)}:{port}: 2 of 2 node\(s\) joined after "
                     r"[\d.]+s\nENVLAYERS-STAGE: endpoint live after", text, re.M)
    openai_answers(netns_lab, text)
    (engine,) = ray_records(run)  # one vLLM, on the head, in a cluster of both nodes
    assert engine["ray"] == {"address": f"{n1}:{port}", "nodes": 2, "gpus": 8} and engine["hostname"] == "n1"
    assert engine["env"]["VLLM_HOST_IP"] == n1  # vLLM's address on each node: its own
    assert f"--node-ip-address={netns_lab.nodes['n2']}" in (run.run_dir / "server-1.log").read_text()
    # Ray's token authentication: the engine joined with the job's token, read from its 0600 file ...
    token_file = run.run_dir / "ray-token"
    assert engine["env"]["RAY_AUTH_MODE"] == "token" and engine["env"]["RAY_AUTH_TOKEN_PATH"] == str(token_file)
    assert "RAY_AUTH_TOKEN" not in engine["env"] and token_file.stat().st_mode & 0o777 == 0o600
    token = token_file.read_text().strip()
    assert not [p.name for p in run.run_dir.iterdir() if p.is_file() and p != token_file
                and token in p.read_text(errors="replace")] and token not in run.out.read_text()
    # ... and a client without it, from outside the job, is refused by the cluster's head
    outsider = ray_client(tmp_path / "outsider", f"{n1}:{port}")
    assert outsider.startswith("REFUSED "), outsider
    assert "Unauthenticated" in outsider or "InvalidAuthToken" in outsider or "Failed to connect" in outsider
    netns_lab.cancel(run.job_id)
    assert run.state() == "CANCELLED"
    assert_no_ray_left(run)


def test_a_node_that_does_not_join_in_time_ends_the_job_naming_the_missing_count(netns_lab, tmp_path):
    # 2 s is shorter than a Ray node takes to start here: the head gives up with the count it saw
    run = ray_run(netns_lab, tmp_path, model="llama405bray", layer="RAY_NUM_CPUS=1\nRAY_JOIN_TIMEOUT_S=2\n",
              SERVE_TIME="00:10:00")
    run.submit()
    text = run.wait_for(r"^ENVLAYERS-STAGE: ending job", timeout_s=120)
    assert re.search(r"ENVLAYERS-ERROR: ray: [01] of 2 node\(s\) joined the Ray cluster at \S+:29\d+ within 2s "
                     r"\([12] missing\)", text), text
    assert re.search(r"^ENVLAYERS-ERROR: rank 0 on n1 exited with code 3 before the endpoint was live", text, re.M), text
    assert run.state(timeout_s=60) in ("FAILED", "COMPLETED")
    assert not still_alive(recorded_pids(run.run_dir))
    assert not (tmp_path / "engines.jsonl").exists()  # no server was started


def test_gateway_spreads_two_replicas_over_two_nodes_behind_one_endpoint_with_no_limit_of_its_own(netns_lab, tmp_path):
    # llama405bgateway scaled to the lab: 2 instances of tp=4 on 2 nodes of 4 GPUs, forced by USE_RAY_SERVE
    key = "gw-" + os.urandom(8).hex()
    key_file = tmp_path / "api-key"
    key_file.write_text(key + "\n")
    key_file.chmod(0o600)
    run = ray_run(netns_lab, tmp_path, model="llama405bgateway", SERVE_TIME="00:10:00", STANDIN_RAY_NODES="2",
                  STANDIN_TTFT_S="4", layer=f"RAY_NUM_CPUS=1\nINFERENCE_NODES=2\nTENSOR_PARALLEL_SIZE=4\n"
                  f"USE_RAY_SERVE=true\nSERVER_API_KEY_FILE={key_file}\nIDLE_WARN_AFTER_S=3600\n"
                  # no health watch: its one-token completions would add to the counts asserted below
                  "HEALTH_FAIL_AFTER_S=0\n")
    run.submit()
    text = run.wait_for("^" + re.escape(BANNER), timeout_s=240)
    gateway_ready(run, 2)  # live comes with the first replica; this test looks at both
    assert ("ENVLAYERS-TOPOLOGY: shape=gateway nodes=2 gpus_per_node=4 tp=4 pp=1 world=4 instances=2 "
            "max_instances_per_node=1 api_rank=0 port=8000") in text
    assert "ENVLAYERS-TOPOLOGY: gateway port=8000 replicas=2 max_replicas_per_node=1 " in text
    assert "base URL: http://n1:8000/v1\n" in text and "\nmetrics: http://n1:8000/metrics\n" in text
    # the gateway's /metrics counts every replica: idle release reads it
    text = run.wait_for(r"^ENVLAYERS-STAGE: idle release: warn after 3600s without a request \(request counters "
                        rf"from http://{re.escape(netns_lab.nodes['n1'])}:8000/metrics\)", timeout_s=30)
    served = openai_answers(netns_lab, text, api_key=key)
    base = f"http://{netns_lab.nodes['n1']}:8000/v1"
    with pytest.raises(openai.AuthenticationError):  # each replica's vLLM checks the key behind the gateway
        openai.OpenAI(base_url=base, api_key="wrong", max_retries=0, timeout=30).models.list()
    # the replicas read the key from its file: none of Ray's own processes carries it in its environment
    checked = 0
    for pid in still_alive(recorded_pids(run.run_dir)):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            environ = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if re.search(r"raylet|gcs_server|ray::|default_worker\.py|ray start|log_monitor", argv):
            checked += 1
            assert key not in environ, argv
    assert checked >= 4, checked  # each node's raylet and workers, the head's GCS
    # one vLLM per replica, one replica per node (GPUs per node cap them), each in the whole cluster, each
    # on its own loopback port behind the gateway
    engines = sorted(ray_records(run), key=lambda r: r["hostname"])
    assert [e["hostname"] for e in engines] == ["n1", "n2"]
    assert all(e["ray"]["nodes"] == 2 and e["ray"]["gpus"] == 8 for e in engines)
    assert [e["env"]["VLLM_HOST_IP"] for e in engines] == [netns_lab.nodes["n1"], netns_lab.nodes["n2"]]
    assert all(e["argv"][-4:-1] == ["--host", "127.0.0.1", "--port"] for e in engines)
    # no limit of the gateway's own: 16 streamed requests at once (Serve's default would run 5 per replica
    # and queue the rest) all see their first token after one TTFT of the engines, not two
    from concurrent.futures import ThreadPoolExecutor

    client = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=60)

    def first_token(i: int) -> float:
        t0 = time.monotonic()
        stream = client.chat.completions.create(model=served, max_tokens=8, stream=True,
                                                messages=[{"role": "user", "content": f"Count to {i}."}])
        waited = None
        for chunk in stream:
            if waited is None and chunk.choices and chunk.choices[0].delta.content:
                waited = time.monotonic() - t0
        return waited

    with ThreadPoolExecutor(16) as pool:
        waits = list(pool.map(first_token, range(16)))
    assert None not in waits and max(waits) < 7.5, waits  # STANDIN_TTFT_S=4 once; 8+ if queued behind others
    # one /metrics for the whole endpoint: both replicas' samples, labelled, the 17 chat requests counted once,
    # and the launcher's one-token completion that made the endpoint live
    body = urllib.request.urlopen(f"http://{netns_lab.nodes['n1']}:8000/metrics", timeout=30).read().decode()
    done = {m.group(1): float(m.group(2)) for m in re.finditer(
        r'^vllm:request_success_total\{replica="(\d)",[^}]*\} (\S+)$', body, re.M)}
    assert set(done) == {"0", "1"} and sum(done.values()) == 17 + 1, body
    assert body.count("# TYPE vllm:request_success_total counter\n") == 1, body
    netns_lab.cancel(run.job_id)
    assert run.state() == "CANCELLED"
    assert_no_ray_left(run)
    assert key not in "".join(f.read_text() for f in run.run_dir.glob("server-*.log"))


def test_a_cluster_with_the_wrong_node_count_stops_the_engine_and_the_job(netns_lab, tmp_path):
    # the stand-in counts the nodes of the cluster it joined: 2 formed, 3 expected, so it refuses loudly
    run = ray_run(netns_lab, tmp_path, model="llama405bray", layer="RAY_NUM_CPUS=1\n", SERVE_TIME="00:10:00",
                  STANDIN_RAY_NODES="3")
    run.submit()
    text = run.wait_for(r"^ENVLAYERS-STAGE: ending job", timeout_s=180)
    assert re.search(r"^ENVLAYERS-ERROR: rank 0 on n1 exited with code 1 before the endpoint was live", text, re.M), text
    assert re.search(r"has 2 live node\(s\), expected STANDIN_RAY_NODES=3", text), text  # in the log tail printed
    assert run.state(timeout_s=60) in ("FAILED", "COMPLETED")
    assert_no_ray_left(run)


def node_helper_pid(run: Run, rank: int) -> int:
    """The PID of rank ``rank``'s raynode.py: the one whose parent is the rank's ranks.sh (its guard runs the
    same command line, reparented)."""
    for pid in processes_mentioning(str(run.run_dir / "raynode.py")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            stat = Path(f"/proc/{pid}/stat").read_text()
            parent = Path(f"/proc/{stat[stat.rfind(')') + 2:].split()[1]}/cmdline").read_bytes()
        except OSError:
            continue
        if b"--rank" in argv and argv[argv.index(b"--rank") + 1] == str(rank).encode() and b"ranks.sh" in parent:
            return pid
    raise AssertionError(f"no raynode.py of rank {rank} under ranks.sh")


def test_a_killed_node_helper_ends_the_job_and_its_guard_stops_that_nodes_ray(netns_lab, tmp_path):
    run = ray_run(netns_lab, tmp_path, model="llama405bray", layer="RAY_NUM_CPUS=1\n", SERVE_TIME="00:10:00",
              STANDIN_RAY_NODES="2")
    run.submit()
    run.wait_for("^" + re.escape(BANNER), timeout_s=180)
    worker_pids = {}
    for line in (run.run_dir / "ray-pids-1.txt").read_text().splitlines():
        pid, start, _ = line.split(" ", 2)
        worker_pids[int(pid)] = int(start)
    assert still_alive(worker_pids)
    os.kill(node_helper_pid(run, 1), signal.SIGKILL)  # as srun ends a task it was told twice to stop
    text = run.wait_for(r"^ENVLAYERS-STAGE: ending job", timeout_s=60)
    assert re.search(r"^ENVLAYERS-ERROR: rank 1 on n2 exited with code 137 after the endpoint was live", text, re.M), text
    deadline = time.monotonic() + 20
    while "its guard stopped" not in (run.run_dir / "server-1.log").read_text() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert re.search(r"^ENVLAYERS-STAGE: ray: the node helper was killed; its guard stopped [1-9]\d* process",
                     (run.run_dir / "server-1.log").read_text(), re.M)
    assert run.state(timeout_s=60) in ("FAILED", "COMPLETED")
    assert_no_ray_left(run)


def test_a_gateway_replica_that_keeps_dying_ends_the_job_below_min_replicas(netns_lab, tmp_path):
    # the replica on n2 (SLURM_PROCID 1) dies 6 s after it answers, and so does every replacement Serve puts
    # there: with MIN_REPLICAS=2 the endpoint never recovers, and the job ends once the grace is over
    run = ray_run(netns_lab, tmp_path, model="llama405bgateway", SERVE_TIME="00:10:00",
                  STANDIN_CRASH_AFTER_READY_SECONDS="6", STANDIN_RANKS="1",
                  layer="RAY_NUM_CPUS=1\nINFERENCE_NODES=2\nTENSOR_PARALLEL_SIZE=4\nUSE_RAY_SERVE=true\n"
                        "MIN_REPLICAS=2\nGATEWAY_REPLACE_TIMEOUT_S=20\n")
    run.submit()
    text = run.wait_for(r"^ENVLAYERS-STAGE: ending job", timeout_s=300)
    assert BANNER in text  # it was live first
    assert "ENVLAYERS-TOPOLOGY: gateway survival: min_replicas=2 replace_timeout=20s " in text
    assert re.search(r"^ENVLAYERS-ERROR: rank 0 on n1 exited with code 1 after the endpoint was live", text, re.M), text
    log = (run.run_dir / "server-0.log").read_text()
    assert re.search(r"^ENVLAYERS-ERROR: gateway: replica [01] on n2: its vllm serve \(pid \d+\) exited with code "
                     r"\d+; Ray Serve replaces the replica", log, re.M), log
    assert re.search(r"^ENVLAYERS-ERROR: gateway: [01] of 2 replica\(s\) healthy, fewer than MIN_REPLICAS=2 for "
                     r"\d+s, longer than the 20s Serve is given to replace them \(GATEWAY_REPLACE_TIMEOUT_S\): ending the job",
                     log, re.M), log
    assert re.search(r"^ENVLAYERS-ERROR: gateway: [01] of 2 replica\(s\) healthy, fewer than MIN_REPLICAS=2", text,
                     re.M), text  # in the job output too
    assert run.state(timeout_s=60) in ("FAILED", "COMPLETED")
    assert_no_ray_left(run)


def test_a_gateway_replica_whose_engine_is_killed_is_replaced_while_the_other_keeps_answering(netns_lab, tmp_path):
    run = ray_run(netns_lab, tmp_path, model="llama405bgateway", SERVE_TIME="00:10:00", STANDIN_RAY_NODES="2",
                  layer="RAY_NUM_CPUS=1\nINFERENCE_NODES=2\nTENSOR_PARALLEL_SIZE=4\nUSE_RAY_SERVE=true\n")
    run.submit()
    text = run.wait_for("^" + re.escape(BANNER), timeout_s=240)
    served = openai_answers(netns_lab, text)
    gateway_ready(run, 2)  # live comes with the first replica; the one on n2 may still be starting
    (victim,) = [e for e in ray_records(run) if e["hostname"] == "n2"]
    # the official client as users run it (its default retries), asked without a pause from the kill until
    # the replacement answers; every request must be answered
    client = openai.OpenAI(base_url=f"http://{netns_lab.nodes['n1']}:8000/v1", api_key="EMPTY", timeout=30)
    os.kill(victim["pid"], signal.SIGKILL)
    t0, asked, log = time.monotonic(), 0, ""
    replaced = re.compile(r"^ENVLAYERS-STAGE: gateway: replica ([01]) on n2 replaced: its new vllm serve \(pid (\d+)\) "
                          r"answers", re.M)
    while time.monotonic() - t0 < 180:
        reply = client.chat.completions.create(model=served, max_tokens=4,
                                               messages=[{"role": "user", "content": f"Say {asked}."}])
        assert reply.choices[0].message.content, reply
        asked += 1
        log = (run.run_dir / "server-0.log").read_text()
        if replaced.search(log):
            break
    assert replaced.search(log), log
    died = re.search(rf"^ENVLAYERS-ERROR: gateway: replica ([01]) on n2: its vllm serve \(pid {victim['pid']}\) was "
                     r"killed by SIGKILL \(exit code 137\); Ray Serve replaces the replica, the others keep serving$",
                     log, re.M)
    assert died and died.group(1) == replaced.search(log).group(1), log  # the replacement takes the dead one's label
    new_pid = int(replaced.search(log).group(2))
    # the job output says it too, as it happens
    out = run.wait_for(r"^ENVLAYERS-STAGE: gateway: replica [01] on n2 replaced: ", timeout_s=30)
    assert re.search(rf"^ENVLAYERS-ERROR: gateway: replica [01] on n2: its vllm serve \(pid {victim['pid']}\) was "
                     r"killed by SIGKILL", out, re.M), out
    assert [e["pid"] for e in ray_records(run) if e["hostname"] == "n2"] == [victim["pid"], new_pid]
    # the replacement serves: both replicas' samples are in the gateway's /metrics again, and the job lives on
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        body = urllib.request.urlopen(f"http://{netns_lab.nodes['n1']}:8000/metrics", timeout=30).read().decode()
        if "did not answer" not in body and {"0", "1"} <= set(re.findall(r'replica="(\d)"', body)):
            break
        time.sleep(1)
    assert "did not answer" not in body and {"0", "1"} <= set(re.findall(r'replica="(\d)"', body)), body
    for i in range(4):
        assert client.chat.completions.create(model=served, max_tokens=4,
                                              messages=[{"role": "user", "content": f"Again {i}."}]).choices
    assert netns_lab.job_info(run.job_id)["JobState"] == "RUNNING"
    # status says it in words: how many replicas Serve reports healthy, and what happened to the one that died
    deadline, shown = time.monotonic() + 30, ""
    while time.monotonic() < deadline:
        shown = subprocess.run([sys.executable, "-m", "envlayers", "status", run.job_id, "--no-probe"], cwd=run.dir,
                               env=dict(run.env, PYTHONPATH=str(REPO / "src")), capture_output=True, text=True,
                               timeout=60).stdout
        if "2 of 2 healthy behind the gateway" in shown:
            break
        time.sleep(1)
    assert re.search(r"replicas: +2 of 2 healthy behind the gateway \(Ray Serve replaces one that dies\)", shown), shown
    assert re.search(rf"replica: +replica [01] on n2: its vllm serve \(pid {victim['pid']}\) was killed by SIGKILL",
                     shown), shown
    print(f"{asked} request(s) answered between the kill and the replacement, "
          f"{time.monotonic() - t0:.1f}s")
    netns_lab.cancel(run.job_id)
    assert run.state() == "CANCELLED"
    assert_no_ray_left(run)


def stat_fields(pid: int) -> list[str]:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rfind(")") + 2:].split()


def test_a_gateway_replica_actor_killed_outright_takes_its_vllm_serve_with_it(netns_lab, tmp_path):
    # Ray or Serve may force-kill a replica's actor (no code of it runs): its server must not live on holding
    # its GPUs until the job ends. Serve then starts a new replica, with a new server.
    run = ray_run(netns_lab, tmp_path, model="llama405bgateway", SERVE_TIME="00:10:00", STANDIN_RAY_NODES="2",
                  layer="RAY_NUM_CPUS=1\nINFERENCE_NODES=2\nTENSOR_PARALLEL_SIZE=4\nUSE_RAY_SERVE=true\n")
    run.submit()
    text = run.wait_for("^" + re.escape(BANNER), timeout_s=240)
    gateway_ready(run, 2)
    (victim,) = [e for e in ray_records(run) if e["hostname"] == "n2"]
    server = {victim["pid"]: int(stat_fields(victim["pid"])[19])}
    actor = int(stat_fields(victim["pid"])[1])  # the server's parent: the Serve replica's actor process
    assert Path(f"/proc/{actor}/cmdline").read_bytes().startswith(b"ray::"), Path(f"/proc/{actor}/cmdline").read_bytes()
    os.kill(actor, signal.SIGKILL)
    t0 = time.monotonic()
    while still_alive(server) and time.monotonic() - t0 < 60:
        time.sleep(0.2)
    assert not still_alive(server), f"the killed actor's vllm serve (pid {victim['pid']}) outlived it by 60s"
    print(f"the server was gone {time.monotonic() - t0:.1f}s after its actor was killed")
    # and its guard did it (not the job's end): its line, relayed from the dead actor's Ray log to rank 0's
    said = re.compile(rf"gateway guard: the replica's actor \(pid {actor}\) ended with its vllm serve \(pid "
                      rf"{victim['pid']}\) still running; stopped its process group \(SIGTERM")
    deadline, log = time.monotonic() + 60, ""
    while not said.search(log) and time.monotonic() < deadline:
        time.sleep(0.5)
        log = (run.run_dir / "server-0.log").read_text()
    assert said.search(log), log[-3000:]
    # Serve replaces the replica: a new server on n2, registered under the dead one's label, and both answer
    replaced = re.compile(r"^ENVLAYERS-STAGE: gateway: replica ([01]) on n2 replaced: its new vllm serve \(pid (\d+)\) "
                          r"answers", re.M)
    deadline, log = time.monotonic() + 180, ""
    while not replaced.search(log) and time.monotonic() < deadline:
        time.sleep(0.5)
        log = (run.run_dir / "server-0.log").read_text()
    assert replaced.search(log), log[-3000:]
    new_pid = int(replaced.search(log).group(2))
    assert new_pid != victim["pid"] and Path(f"/proc/{new_pid}").exists()
    openai_answers(netns_lab, text)
    assert netns_lab.job_info(run.job_id)["JobState"] == "RUNNING"
    netns_lab.cancel(run.job_id)
    assert run.state() == "CANCELLED"
    assert_no_ray_left(run)


def test_gateway_on_one_node_starts_its_own_ray_and_places_both_replicas_there(netns_lab, tmp_path):
    # USE_RAY_SERVE=true on one node: 2 instances of tp=2 share the node's 4 GPUs (at most 2 per node)
    run = ray_run(netns_lab, tmp_path, model="llama405bgateway", SERVE_TIME="00:10:00", STANDIN_RAY_NODES="1",
                  layer="RAY_NUM_CPUS=1\nINFERENCE_NODES=1\nTENSOR_PARALLEL_SIZE=2\nUSE_RAY_SERVE=true\n")
    run.submit()
    text = run.wait_for("^" + re.escape(BANNER), timeout_s=240)
    assert "ENVLAYERS-TOPOLOGY: gateway port=8000 replicas=2 max_replicas_per_node=2 " in text
    assert re.search(r"^ENVLAYERS-STAGE: ray cluster at \S+: 1 of 1 node\(s\) joined after", text, re.M)
    openai_answers(netns_lab, text)
    gateway_ready(run, 2)  # live comes with the first replica
    engines = ray_records(run)
    assert [e["hostname"] for e in engines] == ["n1", "n1"] and all(e["ray"]["nodes"] == 1 for e in engines)
    assert len({e["argv"][-1] for e in engines}) == 2  # a loopback port each
    netns_lab.cancel(run.job_id)
    assert run.state() == "CANCELLED"
    pids = recorded_pids(run.run_dir)
    deadline = time.monotonic() + 30
    while still_alive(pids) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert not still_alive(pids)
    run.assert_nothing_left()
