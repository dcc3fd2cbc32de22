"""ROUTER=smg end to end on the real local Slurm cluster with the real router binary (the `router` extra):
two stand-in SGLang replicas (the replicas experiment) on two nodes behind one URL, the official openai client through it, a replica
SIGKILLed while a client keeps asking (the failed requests counted), the router gone with the job."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from extratools import needs_extra
from labruns import BANNER, Run, engine_pid, env_layers, reachable

openai = needs_extra("openai", "test")
needs_extra("smg", "router")

pytestmark = pytest.mark.slurm
SERVED = "hpcagent-bench-vllm"


def served_by(run: Run) -> dict[str, int]:
    """Chat completions each replica's stand-in answered, read from their /metrics (node address -> count)."""
    out = {}
    for rep in run.endpoint()["replicas"]:
        if not rep["alive"]:
            continue
        text = urllib.request.urlopen(f"http://{rep['address']}:8000/metrics", timeout=5).read().decode()
        out[rep["address"]] = int(sum(float(line.rsplit(None, 1)[1]) for line in text.splitlines()
                                      if line.startswith(("vllm:request_success_total", "sglang:num_requests_total"))))
    return out


def test_one_router_url_serves_two_replicas_and_survives_a_killed_one(netns_lab, tmp_path):
    run = Run(netns_lab, tmp_path, EXPERIMENT="replicas", layer="ROUTER=smg\nROUTER_POLICY=round_robin\n"
              "HEALTH_FAIL_AFTER_S=6\n", SERVE_TIME="00:10:00")
    run.submit()
    text = run.wait_for("^" + re.escape(BANNER), timeout_s=120)
    assert re.search(r"^ENVLAYERS-STAGE: starting the router on node 0: smg launch --host 0.0.0.0 --port 30000 "
                     r"--worker-urls http://\S+:8000 http://\S+:8000 --policy round_robin .*# --api-key from "
                     r"SERVER_API_KEY_FILE", text, re.M), text
    assert "ENVLAYERS-STAGE: router live at http://n1:30000/v1 in front of 2 replica(s)" in text
    ep = run.endpoint()
    assert ep["base_urls"] == ["http://n1:30000/v1"] and ep["base_url"] == "http://n1:30000/v1"
    assert len(ep["replica_urls"]) == 2 and ep["router"]["kind"] == "smg"
    block = text.split(BANNER, 1)[1]
    assert "http://n1:30000/v1" in block and ":8000/v1" not in block  # one URL in the block
    # the router's Prometheus text on the port above its own, bound where it is: named in the block, readable
    assert "\nmetrics: http://n1:30001/metrics\n" in block and ep["metrics_at"] == "http://n1:30001/metrics"
    scraped = urllib.request.urlopen(reachable(ep["metrics_at"], netns_lab), timeout=10).read().decode()
    assert "# TYPE " in scraped
    key = (run.run_dir / "api-key").read_text().strip()
    assert key not in run.out.read_text() and key not in (run.run_dir / "router.log").read_text()
    router_pid = ep["router"]["pid"]
    assert key not in Path(f"/proc/{router_pid}/cmdline").read_bytes().decode(errors="replace")

    base = reachable(ep["base_url"], netns_lab)
    client = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=20)
    assert [m.id for m in client.models.list()] == [SERVED]
    before = served_by(run)
    for _ in range(6):
        reply = client.chat.completions.create(model=SERVED, max_tokens=8, messages=[{"role": "user", "content": "hi"}])
        assert reply.choices[0].message.content
    after = served_by(run)
    assert all(after[a] - before[a] == 3 for a in after), (before, after)  # round robin: 3 each
    with pytest.raises(openai.AuthenticationError):  # the router checks the per-job key itself
        openai.OpenAI(base_url=base, api_key="wrong-key-1234", max_retries=0).chat.completions.create(
            model=SERVED, max_tokens=8, messages=[{"role": "user", "content": "hi"}])

    # `bench JOBID` loads the router's URL; `--replica 1` that replica's own URL, past the router
    for extra, want in (((), base), (("--replica", "1"), reachable(ep["replica_urls"][1], netns_lab))):
        done = env_layers(run, "bench", run.job_id, *extra, "--concurrency", "1", "--requests", "2",
                          "--output-tokens", "4", "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        assert json.loads(done.stdout)["target"]["base_url"] == want

    # a client keeps asking while replica 1's engine is SIGKILLed
    results: list[tuple[float, str | None]] = []
    stop = threading.Event()

    def ask():
        c = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=10)
        while not stop.is_set():
            t = time.monotonic()
            try:
                c.chat.completions.create(model=SERVED, max_tokens=8, messages=[{"role": "user", "content": "hi"}])
                results.append((t, None))
            except Exception as err:  # noqa: BLE001 - counted, not raised
                results.append((t, f"{type(err).__name__}: {err}"[:120]))
            time.sleep(0.05)

    asker = threading.Thread(target=ask, daemon=True)
    asker.start()
    time.sleep(2)
    t_kill = time.monotonic()
    os.kill(engine_pid(run, "n2"), signal.SIGKILL)
    run.wait_for(r"^ENVLAYERS-ERROR: replica rank 1 on n2 exited with code 137", timeout_s=30)
    time.sleep(12)  # past smg's 2 failed health checks 5 s apart
    stop.set()
    asker.join(15)
    failed = [(round(t - t_kill, 2), e) for t, e in results if e is not None]
    print(f"ROUTER-KILL: {len(results)} requests, {len(failed)} failed; failures at s after SIGKILL: {failed}")
    assert len(results) > 50 and not failed, failed
    ep = run.endpoint()
    assert ep["base_urls"] == ["http://n1:30000/v1"] and [r["alive"] for r in ep["replicas"]] == [True, False]
    assert ep["replica_urls"] == [ep["replicas"][0]["base_url"]]
    assert ep["replica_addresses"] == [netns_lab.nodes["n1"]]
    # smg's own health checks, as the launcher last read them: said once, and shown by status
    run.wait_for(r"^ENVLAYERS-WARN: router: http://\S+:8000 marked down by its health checks \(1 of 2 replica", timeout_s=30)
    status = env_layers(run, "status", run.job_id)
    assert status.returncode == 0, status.stdout + status.stderr
    assert re.search(r"router: +1 of 2 replica\(s\) healthy in the router's own checks \(down: http://\S+:8000\)",
                     status.stdout), status.stdout
    # the job's end takes the router with it
    run.lab.run(["scancel", run.job_id])
    run.state(timeout_s=60)
    deadline = time.monotonic() + 20
    while Path(f"/proc/{router_pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not Path(f"/proc/{router_pid}").exists()
    acct = json.loads((run.run_dir / "accounting.json").read_text())
    # the requests idle release and the report count are the router's: each once (never more than were sent)
    # sent through it besides the asker's: 6 round-robin chats, 1 refused for its key, bench's 2 and its check
    # (bench --replica 1 went past the router)
    assert 0 < acct["live"]["requests"] <= len(results) + 6 + 1 + 3 and acct["live"]["counters_readable"], acct["live"]
    run.assert_nothing_left()


def test_cache_aware_routing_sends_a_repeated_prefix_to_one_replica(netns_lab, tmp_path):
    # the default policy (cache_aware): requests that share a long prefix go where that prefix went before,
    # read from the replicas' own request counters
    run = Run(netns_lab, tmp_path, EXPERIMENT="replicas", layer="ROUTER=smg\n", SERVE_TIME="00:10:00")
    run.submit()
    text = run.wait_for("^" + re.escape(BANNER), timeout_s=120)
    assert "ENVLAYERS-STAGE: router live at http://n1:30000/v1 in front of 2 replica(s) (policy cache_aware;" in text
    ep = run.endpoint()
    key = (run.run_dir / "api-key").read_text().strip()
    client = openai.OpenAI(base_url=reachable(ep["base_url"], netns_lab), api_key=key, max_retries=0, timeout=20)
    for prefix in ("You are a careful assistant who answers in French. " * 30,
                   "Summarise the following Slurm accounting record line by line. " * 30):
        before = served_by(run)
        for i in range(6):
            client.chat.completions.create(model=SERVED, max_tokens=8,
                                           messages=[{"role": "user", "content": prefix + f"question {i}"}])
        after = served_by(run)
        got = sorted(after[a] - before[a] for a in after)
        assert got == [0, 6], (prefix[:30], before, after)  # all six on one replica, none on the other
    run.lab.run(["scancel", run.job_id])
    run.state(timeout_s=60)
    run.assert_nothing_left()
