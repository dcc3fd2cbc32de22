"""ROUTER=smg with the REAL vLLM (its CPU build) as the workers on two lab nodes: the real router binary in
front of two real `vllm serve`, the per-job key, the official openai client through one URL, and a replica's
server SIGKILLed while a client keeps asking (the failed requests counted and printed)."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest
from extratools import needs_extra

from labruns import answers_openai, finish, RealRun, start_batch, wait_answered

openai = needs_extra("openai", "test")
needs_extra("smg", "router")

pytestmark = [pytest.mark.slurm, pytest.mark.real_vllm]


def finished(address: str) -> float:
    import urllib.request

    text = urllib.request.urlopen(f"http://{address}:8000/metrics", timeout=10).read().decode()
    return sum(float(line.rsplit(None, 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:request_success_total"))


def test_real_vllm_replicas_behind_the_router_answer_through_one_url_and_survive_a_killed_one(
        netns_lab, tmp_path, meter):  # noqa: F811
    run = RealRun(netns_lab, tmp_path, meter, "replicas + router: 2 nodes, SIGKILL of replica 1", EXPERIMENT="replicas",
                  model="oss120b", layer="SERVER_API_KEY_FILE=generate\n"
                                         "ROUTER=smg\nROUTER_POLICY=round_robin\nHEALTH_FAIL_AFTER_S=20\n")
    run.submit()
    text = run.wait_live()
    bases, served = run.block(text)
    assert bases == [f"http://{netns_lab.nodes['n1']}:30000/v1"], text  # one URL: the router's
    ep = run.endpoint()
    key = Path(ep["api_key_file"]).read_text().strip()
    answers_openai(bases[0], served, api_key=key)
    addresses = [r["address"] for r in ep["replicas"]]
    before = [finished(a) for a in addresses]
    client = openai.OpenAI(base_url=bases[0], api_key=key, max_retries=0, timeout=120)
    for _ in range(4):
        client.chat.completions.create(model=served, max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    after = [finished(a) for a in addresses]
    assert all(b - a >= 2 for a, b in zip(before, after)), (before, after)  # round robin reached both
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=bases[0], api_key="wrong-key-1234", max_retries=0).chat.completions.create(
            model=served, max_tokens=4, messages=[{"role": "user", "content": "hi"}])

    results: list[tuple[float, str | None]] = []
    stop = threading.Event()

    def ask():
        c = openai.OpenAI(base_url=bases[0], api_key=key, max_retries=0, timeout=60)
        while not stop.is_set():
            t = time.monotonic()
            try:
                c.chat.completions.create(model=served, max_tokens=4, messages=[{"role": "user", "content": "hi"}])
                results.append((t, None))
            except Exception as err:  # noqa: BLE001 - counted, not raised
                results.append((t, f"{type(err).__name__}: {err}"[:160]))

    asker = threading.Thread(target=ask, daemon=True)
    asker.start()
    # and a batch through the job id beside it (env_layers batch: the router's URL, the job's key file)
    n = 300
    batch, out = start_batch(run, n, "--concurrency", "2")
    wait_answered(batch, out, 20, timeout_s=300)
    t_kill = time.monotonic()
    os.kill(run.serve_pid("ENVLAYERS_RANK=1", what="replica 1"), signal.SIGKILL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not re.search(r"^ENVLAYERS-ERROR: replica rank 1 on n2 ", run.text(), re.M):
        time.sleep(0.5)
    time.sleep(12)  # past the router's 2 failed health checks 5 s apart
    stop.set()
    asker.join(120)
    failed = [(round(t - t_kill, 2), e) for t, e in results if e is not None]
    print(f"\nROUTER-REAL-KILL: {len(results)} requests, {len(failed)} failed; at s after SIGKILL: {failed}")
    assert re.search(r"^ENVLAYERS-ERROR: replica rank 1 on n2 ", run.text(), re.M), run.text()[-3000:]
    assert len(results) >= 10 and not failed, failed
    summary = finish(batch, out, n, echo=False)  # every custom_id answered once, through the kill (random weights)
    print(f"ROUTER-REAL-KILL: batch of {n}: retries {summary['retries_by_kind']}")
    answers_openai(bases[0], served, api_key=key)  # the endpoint keeps answering with one replica
    assert key not in run.text()
    run.cancel()
