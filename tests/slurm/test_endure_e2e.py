"""Endpoints that last, end to end on the real local Slurm cluster: a replica that dies or hangs is
dropped while the others serve, its node leaves the allocation, the job ends with the last one;
a hung single server ends its job. The engine is the stand-in (tests/standin), which hangs on SIGUSR1."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
from labtools import TERMINAL_STATES
from labruns import BANNER, KEYLESS, Run, engine_pid
from timing import LATE_S  # how late a busy machine may run an event

pytestmark = pytest.mark.slurm


def chat(address: str, timeout_s: float = 10) -> int:
    body = json.dumps({"model": "hpcagent-bench-vllm", "messages": [{"role": "user", "content": "hi"}]}).encode()
    req = urllib.request.Request(f"http://{address}:8000/v1/chat/completions", body,
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        assert json.loads(resp.read())["choices"][0]["message"]["content"]
        return resp.status


def job_nodes(lab, job_id: str) -> tuple[str, str]:
    text = lab.run(["scontrol", "show", "job", job_id]).stdout
    return re.search(r"^\s*NodeList=(\S+)", text, re.M).group(1), re.search(r"NumNodes=(\d+)", text).group(1)


def status(run: Run) -> str:
    return subprocess.run([sys.executable, "-m", "envlayers", "status", run.job_id], cwd=run.dir, env=run.env,
                          capture_output=True, text=True, timeout=60).stdout


def test_replicas_survive_a_dead_and_a_hung_peer_and_give_their_nodes_back(netns_lab, tmp_path):
    run = Run(netns_lab, tmp_path, EXPERIMENT="replicas", layer=KEYLESS + "INFERENCE_NODES=3\nHEALTH_FAIL_AFTER_S=6\n",
              SERVE_TIME="00:10:00")
    run.submit()
    run.wait_for("^" + re.escape(BANNER), timeout_s=90)
    addr = {n: netns_lab.nodes[n] for n in ("n1", "n2", "n3")}
    assert [r["alive"] for r in run.endpoint()["replicas"]] == [True, True, True]
    # a replica's engine dies (SIGKILL: the OOM killer's way)
    os.kill(engine_pid(run, "n3"), signal.SIGKILL)
    text = run.wait_for(r"^ENVLAYERS-STAGE: node n3 released back to Slurm", timeout_s=30)
    assert "ENVLAYERS-ERROR: replica rank 2 on n3 exited with code 137 after the endpoint was live" in text
    assert job_nodes(netns_lab, run.job_id) == ("n[1-2]", "2")
    assert chat(addr["n1"]) == 200 and chat(addr["n2"]) == 200
    ep = run.endpoint()
    assert [r["alive"] for r in ep["replicas"]] == [True, True, False]
    assert ep["addresses"] == [addr["n1"], addr["n2"]]
    shown = status(run)
    assert "  replicas:    2 of 3 alive (rank 0 on n1, rank 1 on n2); the job ends below MIN_REPLICAS=1" in shown
    assert "  dropped:     rank 2 on n3: exited with code 137 after the endpoint was live" in shown
    # a replica hangs: its socket accepts, nothing answers
    t_hang = time.monotonic()
    os.kill(engine_pid(run, "n2"), signal.SIGUSR1)
    run.wait_for(r"^ENVLAYERS-ERROR: replica rank 1 on n2 stopped answering", timeout_s=30)
    noticed = time.monotonic() - t_hang
    # without accounting storage Slurm shrinks a job once: it refuses the second resize until the
    # (never coming) database index is set, and the launcher says the node stays
    once = "accounting_storage/none" in netns_lab.conf.read_text()
    text = run.wait_for(r"^ENVLAYERS-WARN: could not release node n2" if once else
                        r"^ENVLAYERS-STAGE: node n2 released back to Slurm", timeout_s=40)
    assert re.search(r"^ENVLAYERS-ERROR: replica rank 1 on n2 stopped answering /health after the endpoint was live: "
                     rf"no healthy answer from http://{re.escape(addr['n2'])}:8000/health for \d+s "
                     r"\(HEALTH_FAIL_AFTER_S=6\); last seen: no answer within 3s", text, re.M)
    assert 4 <= noticed <= 20, noticed
    if once:
        assert re.search(r"^ENVLAYERS-WARN: could not release node n2 back to Slurm \(.*the DB index is being set, "
                         r"try again in a bit.*\); it stays allocated until the job ends$", text, re.M), text
    assert job_nodes(netns_lab, run.job_id) == (("n[1-2]", "2") if once else ("n1", "1"))
    assert chat(addr["n1"]) == 200
    assert [r["alive"] for r in run.endpoint()["replicas"]] == [True, False, False]
    # the last one dies: the job ends
    os.kill(engine_pid(run, "n1"), signal.SIGKILL)
    assert run.state(timeout_s=40) == "FAILED"
    text = run.out.read_text()
    assert "ENVLAYERS-ERROR: 0 of 3 replicas alive, fewer than MIN_REPLICAS=1: ending the job" in text
    assert "ENVLAYERS-STAGE: node n1 stays in the job: the launcher runs there" not in text  # rank 0 was the last
    run.assert_nothing_left()


def test_a_hung_single_server_ends_its_job(netns_lab, tmp_path):
    run = Run(netns_lab, tmp_path, layer=KEYLESS + "HEALTH_FAIL_AFTER_S=6\n", SERVE_TIME="00:10:00")
    run.submit()
    run.wait_for("^" + re.escape(BANNER), timeout_s=60)
    t_hang = time.monotonic()
    os.kill(engine_pid(run, "n1"), signal.SIGUSR1)
    assert run.state(timeout_s=6 + 3 + 3 * LATE_S) == "FAILED"
    took = time.monotonic() - t_hang
    text = run.out.read_text()
    assert re.search(r"^ENVLAYERS-ERROR: rank 0 on n1 stopped answering /health after the endpoint was live: no "
                     r"healthy answer from http://[\d.]+:8000/health for \d+s \(HEALTH_FAIL_AFTER_S=6\); last seen: "
                     r"no answer within 3s", text, re.M), text
    assert "[standin] SIGUSR1: hung" in (run.run_dir / "server-0.log").read_text()
    assert 6 <= took <= 6 + 3 + 2 * LATE_S, took  # never before HEALTH_FAIL_AFTER_S; a miss would run to SERVE_TIME
    run.assert_nothing_left()


def _answers(address: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{address}:8000/v1/models", timeout=1) as resp:
            return resp.status == 200
    except OSError:
        return False


def _finished(lab, job: str) -> bool:
    info = lab.job_info(job)
    return info is None or info.get("JobState") in TERMINAL_STATES


def test_a_chain_of_successors_hands_over_twice_without_a_gap(netns_lab, tmp_path):
    # a 4 min limit: each successor is timed to start 1 min after its predecessor started
    run = Run(netns_lab, tmp_path, layer=KEYLESS + "SUCCESSORS=2\nSUCCESSOR_DRAIN_S=5\n", SERVE_TIME="00:04:00")
    first = run.submit()
    run.wait_for("^" + re.escape(BANNER), timeout_s=60)
    root = run.run_dir.parent
    chain, served_by, gap, longest, t0 = [first], {}, None, 0.0, time.monotonic()
    deadline = time.monotonic() + 420
    while time.monotonic() < deadline:
        # follow the chain through chain.json; ask every job's recorded address
        rec = root / chain[-1] / "chain.json"
        if rec.exists():
            succ = json.loads(rec.read_text()).get("successor")
            if succ and succ not in chain:
                chain.append(succ)
                netns_lab._submitted.append(succ)
        up = []
        for job in chain:
            ep = root / job / "endpoint.json"
            if ep.exists() and _answers(json.loads(ep.read_text())["addresses"][0]):
                up.append(job)
                served_by.setdefault(job, time.monotonic() - t0)
        now = time.monotonic()
        if up:
            if gap is not None:
                longest = max(longest, now - gap)
            gap = None
        elif gap is None:
            gap = now
        # (a job that ended may share its node, and so its address, with a later one: ask Slurm)
        if len(chain) == 3 and chain[-1] in up and all(_finished(netns_lab, j) for j in chain[:-1]):
            break
        time.sleep(0.5)
    assert len(chain) == 3, chain
    states = [netns_lab.wait_job(j, timeout_s=5) for j in chain[:-1]]
    assert states == ["COMPLETED", "COMPLETED"], states
    for job, nxt in zip(chain, chain[1:]):
        out = (tmp_path / f"serve-only-{job}.out").read_text()
        assert re.search(rf"^ENVLAYERS-STAGE: successor job {nxt} submitted \(after:{job}\+1: starts 1 min after this "
                         r"job started, \d more after it\); this job ends once it is live$", out, re.M), out
        assert f"ENVLAYERS-STAGE: handed over to successor job {nxt}; ending job {job}" in out
    last = (tmp_path / f"serve-only-{chain[-1]}.out").read_text()
    assert f"ENVLAYERS-STAGE: last job of the chain (after job {chain[1]}): no successor" in last
    shown = subprocess.run([sys.executable, "-m", "envlayers", "status", chain[1]], cwd=tmp_path, env=run.env,
                           capture_output=True, text=True, timeout=60).stdout
    assert f"  chain:       after job {chain[0]}; successor job {chain[2]} (after:{chain[1]}+1)" in shown
    print(f"chain {chain}: first answered at {served_by} s; longest time with no job answering: {longest:.1f}s")
    assert longest == 0.0
    netns_lab.cancel(chain[-1])


def test_a_server_that_answers_health_but_no_longer_generates_ends_its_job(netns_lab, tmp_path):
    """/health says 200 and /metrics answers, but the engine stopped generating (the stand-in's SIGUSR2): the
    progress clock ends the job after PROGRESS_STALL_AFTER_S, long before HEALTH_FAIL_AFTER_S could."""
    run = Run(netns_lab, tmp_path, model="oss120b", layer=KEYLESS + "HEALTH_FAIL_AFTER_S=600\nPROGRESS_STALL_AFTER_S=6\n",
              SERVE_TIME="00:10:00")  # vLLM: SGLang's token counter moves only when a request ends
    run.submit()
    run.wait_for("^" + re.escape(BANNER), timeout_s=60)
    (address,) = json.loads((run.run_dir / "endpoint.json").read_text())["addresses"]
    os.kill(engine_pid(run, "n1"), signal.SIGUSR2)
    stuck = threading.Thread(target=lambda: _swallow(chat, address, 120), daemon=True)  # a client's request in flight
    stuck.start()
    assert run.state(timeout_s=600) == "FAILED"
    text = run.out.read_text()
    assert re.search(r"^ENVLAYERS-ERROR: rank 0 on n1 stopped generating after the endpoint was live: \d+ request\(s\) "
                     r"running or waiting.*, and its generated-token counter stayed at \d+ for \d+s "
                     r"\(PROGRESS_STALL_AFTER_S=6\); the watch's last probe: .+$", text, re.M), text
    assert "[standin] SIGUSR2: stalled" in (run.run_dir / "server-0.log").read_text()
    run.assert_nothing_left()


def _swallow(fn, *args) -> None:
    try:
        fn(*args)
    except OSError:
        pass  # the job's end cuts the request
