"""The launcher end to end on the lab with the REAL vLLM (its CPU build), not the stand-in engine.

Each job is a catalog model's layers (oss120b for one node, oss20bdp for data parallel, llama405bray for
the ray shape) with the operator's SERVE_ENV_FILE on top: no container, the tiny seeded random-weight
model (tests/realengine/tiny_model.py), tp=1 on one fake GPU per node, both parsers, vLLM's CPU KV cache
size, and the real engine's own ``vllm`` first on the job's PATH (tests/realvllm.py finds it). One job per
shape, with every check of that shape in it, and the faults at its end: the real engine is slow to start
on a shared two-core machine (a minute or more), so every wait is for an event (the endpoint block, or
the job's end), bounded generously. Each job prints how long it took; the module prints the whole file's
time and the peak memory the machine used.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from extratools import needs_extra

from labruns import BANNER, LIVE_TIMEOUT_S, RealRun, answers_openai, curl

# tests/realvllm.py: the real engine's virtual environment and the tiny model (skips, or fails where required,
# when the engine is not installed here)
realvllm = pytest.importorskip("realvllm")

openai = needs_extra("openai", "test")

pytestmark = [pytest.mark.slurm, pytest.mark.real_vllm]

SERVED = "hpcagent-bench-vllm"


# --------------------------------------------------------------------------- checks every live shape makes


def metrics_of(base_url: str) -> str:
    with urllib.request.urlopen(base_url.removesuffix("/v1") + "/metrics", timeout=30) as resp:
        return resp.read().decode()


def assert_real_metrics(text: str, finished_at_least: int) -> None:
    """The real engine's /metrics carries every name the project reads (launch/idle.py: the idle meter,
    report and the gateway's per-replica counters read them through it)."""
    from envlayers.launch.idle import METRIC_NAMES, parse_prometheus, read_counters

    names = parse_prometheus(text)
    wanted = [n for group in METRIC_NAMES["vllm"] for n in group]
    assert "vllm:num_requests_running" in wanted
    assert [n for n in wanted if n not in names] == [], sorted(n for n in names if n.startswith("vllm:"))
    counters = read_counters("vllm", text)
    assert counters is not None and counters.finished >= finished_at_least, counters


def assert_phases_in_order(run: RealRun, ranks: int = 1) -> dict:
    """``env_layers status JOB --json``: the startup phases the launcher read from the real log, in the
    order reached, and every rank at the furthest phase."""
    from envlayers.phases import PHASE_ORDER, parse_phases

    deadline = time.monotonic() + 60  # the launcher rewrites accounting.json every few seconds
    while True:
        res = run.cli("status", run.job_id, "--json")
        assert res.returncode == 0, res.stdout + res.stderr
        status = json.loads(res.stdout)
        if (status.get("accounting") or {}).get("live_at") or time.monotonic() > deadline:
            break
        time.sleep(2)
    reached = list((status.get("accounting") or {}).get("phases") or {})
    expected = ["loading", "weights-loaded", "kv-cache", "ready"]  # no graph capture: --enforce-eager
    assert reached == expected, json.dumps(status.get("accounting"), indent=1)
    times = [status["accounting"]["phases"][p] for p in reached]
    assert times == sorted(times)
    assert status["endpoint"] and status["phase"]["name"] == "ready", status["phase"]
    for rank in range(ranks):
        phases = [p.name for p in parse_phases(run.log(rank).splitlines()).phases]
        assert phases == [p for p in PHASE_ORDER if p in phases] and "kv-cache" in phases, (rank, phases)
    return status


def stop_watch(run: RealRun, what: str, t_fault: float) -> None:
    """Print how long the job took to end after the fault."""
    print(f"\n[real-vllm] job {run.job_id} ({run.name}): {what} -> job ended in "
          f"{time.monotonic() - t_fault:.1f}s", flush=True)


def launcher_errors(text: str) -> list[str]:
    """The launcher's ENVLAYERS-ERROR lines (printed, the job's record in the test output), tail lines left out."""
    errors = [line for line in text.splitlines() if line.startswith("ENVLAYERS-ERROR: ")]
    print("\n[real-vllm] " + "\n[real-vllm] ".join(e[:400] for e in errors if " lines of " not in e), flush=True)
    return errors


# --------------------------------------------------------------------------- the shapes


def test_single_node_real_vllm_serves_verify_and_a_stopped_engine_core_ends_the_job(netns_lab, tmp_path, meter):
    # verify asks for max_tokens=2048, which vLLM 0.32 refuses above max_model_len (HTTP 400: "max_tokens=2048
    # cannot be greater than max_model_len=512"): this job serves the tiny model's whole context
    run = RealRun(netns_lab, tmp_path, meter, "single: live, verify, SIGSTOP of EngineCore",
                  layer="HEALTH_FAIL_AFTER_S=30\n"
                        f"SERVER_EXTRA_ARGS='--enforce-eager --max-model-len 2048 --dtype {realvllm.DTYPE}'\n")
    run.submit()
    stopped = None
    try:
        text = run.wait_live()
        assert f"model id: {realvllm.model_dir()} (vllm, single)" in text
        (base,), served = run.block(text)
        assert served == SERVED
        answers_openai(base, served)
        log = run.log(0)
        assert "Explicitly set (1.0/" in log  # VLLM_CPU_KVCACHE_SPACE=1 reached the engine: 1 GiB of KV cache
        assert "'gpu_memory_utilization'" not in log  # the empty key omitted the flag
        pid = run.engine_core_pid(0)
        server = run.rank_pid(0, b"--served-model-name")
        assert b"VLLM_CPU_KVCACHE_SPACE=1" in Path(f"/proc/{server}/environ").read_bytes().split(b"\0")
        assert_phases_in_order(run)
        assert_real_metrics(metrics_of(base), finished_at_least=2)
        # a healthy real log: no finding at all (tests/test_standin_vs_real.py holds the patterns to it)
        healthy = tmp_path / "healthy-server-0.log"
        healthy.write_text(run.log(0))
        diag = run.cli("diagnose", str(healthy))
        assert diag.returncode == 0, diag.stdout + diag.stderr
        # the gates against the real engine and its real parsers
        verified = run.cli("verify", run.job_id, "--timeout-s", "170", timeout_s=900)
        report = verified.stdout
        print(f"\n[real-vllm] env_layers verify {run.job_id}:\n{report}", flush=True)
        assert verified.returncode == 1, report + verified.stderr
        assert re.search(r"^PASS  metrics +Prometheus text, \d+ metrics$", report, re.M), report
        accuracy = re.search(r"^FAIL  accuracy +(\d+)/12 correct at temperature 0, below the baseline 11/12", report,
                             re.M)
        assert accuracy and int(accuracy.group(1)) < 11, report
        assert re.search(r"^      evidence: \w+: expected .+, got ", report, re.M), report
        # random weights: no structured call from the hermes parser; the qwen3 parser's split is evidence
        assert re.search(r"^FAIL  tools +no tool_calls: the model answered in prose instead of calling get_weather$",
                         report, re.M), report
        assert re.search(r"^(?:PASS|FAIL)  reasoning +", report, re.M), report
        assert re.search(r"^      evidence: reasoning: \d+ characters$", report, re.M), report
        assert re.search(r"^verdict: FAILED \(1 passed, 3 failed, 0 skipped\)$", report, re.M), report
        assert_real_metrics(metrics_of(base), finished_at_least=2 + 14)  # verify's requests were counted
        # the fault: a stopped EngineCore still lets /health say 200; the watch's one-token completion does not
        stopped = pid
        t_fault = time.monotonic()
        os.kill(pid, signal.SIGSTOP)
        assert run.wait_end() == "FAILED"
        stop_watch(run, "SIGSTOP of EngineCore", t_fault)
        errors = launcher_errors(run.text())
        assert any(e.startswith("ENVLAYERS-ERROR: rank 0 on n1 stopped answering /health after the endpoint was "
                                "live: no healthy answer from ") and "HEALTH_FAIL_AFTER_S=30" in e
                   for e in errors), run.text()
    finally:
        if stopped is not None:
            run.kill_leftover(stopped)


def test_single_node_sigkill_of_the_engine_core_ends_the_job_naming_rank_0(netns_lab, tmp_path, meter):
    run = RealRun(netns_lab, tmp_path, meter, "single: SIGKILL of EngineCore")
    run.submit()
    run.wait_live()
    pid = run.engine_core_pid(0)
    t_fault, killed_at = time.monotonic(), time.time()
    os.kill(pid, signal.SIGKILL)
    assert run.wait_end() == "FAILED"
    stop_watch(run, "SIGKILL of EngineCore", t_fault)
    text = run.text()
    # the launcher acts on the API server's own report of its engine core's death, not on its exit seconds later
    assert re.search(r"^ENVLAYERS-ERROR: rank 0 on n1 lost its engine core after the endpoint was live \(its log: "
                     r".*MPClient: engine core exited unexpectedly", text, re.M), text
    launcher_end = (run.run_dir / "launch-end.json").stat().st_mtime - killed_at
    exit_file = run.run_dir / "rank-0.exit"
    rank_exit = f"{exit_file.stat().st_mtime - killed_at:.1f}s" if exit_file.exists() else "(stopped by the launcher)"
    print(f"[real-vllm] job {run.job_id}: EngineCore killed -> the launcher ended {launcher_end:.1f}s; rank 0 "
          f"exited {rank_exit}; rank 0's exit file: {exit_file.read_text().strip() if exit_file.exists() else None}",
          flush=True)
    assert launcher_end < 60


def test_a_flag_the_real_engine_refuses_ends_the_job_quoting_its_root_cause(netns_lab, tmp_path, meter):
    run = RealRun(netns_lab, tmp_path, meter, "single: --max-model-len beyond the model",
                  layer=f"SERVER_EXTRA_ARGS='--enforce-eager --max-model-len 100000 --dtype {realvllm.DTYPE}'\n")
    run.submit()
    assert run.wait_end(timeout_s=LIVE_TIMEOUT_S) == "FAILED"
    text = run.text()
    said = [e for e in launcher_errors(text) if e.startswith("ENVLAYERS-ERROR: rank 0 engine said: ")]
    assert said, text
    assert "max_model_len" in said[0] and "100000" in said[0] and "2048" in said[0], said
    assert "See root cause above" not in said[0]
    assert BANNER not in text


def test_replicas_on_two_nodes_both_real_servers_answer(netns_lab, tmp_path, meter):
    run = RealRun(netns_lab, tmp_path, meter, "replicas: 2 nodes", EXPERIMENT="replicas")
    run.submit()
    text = run.wait_live()
    bases, served = run.block(text)
    assert bases == [f"http://{netns_lab.nodes['n1']}:8000/v1", f"http://{netns_lab.nodes['n2']}:8000/v1"]
    for base in bases:
        answers_openai(base, served)
        assert_real_metrics(metrics_of(base), finished_at_least=2)
    assert_phases_in_order(run, ranks=2)
    run.cancel()


def test_data_parallel_on_two_nodes_with_a_job_key_then_a_killed_headless_rank_ends_it(netns_lab, tmp_path, meter):
    run = RealRun(netns_lab, tmp_path, meter, "data-parallel: 2 nodes, SIGKILL of headless rank 1",
                  model="oss20bdp", layer="NUMBER_OF_INSTANCES=2\nSERVER_API_KEY_FILE=generate\nSTARTUP_STALL_S=300\n")
    run.submit()
    text = run.wait_live()
    assert ("ENVLAYERS-TOPOLOGY: shape=data-parallel nodes=2 gpus_per_node=1 tp=1 pp=1 world=1 instances=2 "
            "instances_per_node=1 api_rank=0 port=8000") in text
    (base,), served = run.block(text)
    key = Path(run.endpoint()["key_file"]).read_text().strip()
    assert curl(base + "/models").stdout.endswith("\n401")  # the real vLLM took the key from VLLM_API_KEY
    answers_openai(base, served, api_key=key)
    assert_real_metrics(metrics_of(base), finished_at_least=2)
    assert_phases_in_order(run, ranks=2)
    assert "(EngineCore_DP1 pid=" in run.log(1)  # the second engine runs on the headless node
    pid = run.rank_pid(1, b"--headless")
    t_fault = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    assert run.wait_end() == "FAILED"
    stop_watch(run, "SIGKILL of the headless rank 1", t_fault)
    out = run.text()
    assert re.search(r"^ENVLAYERS-ERROR: rank 1 on n2 exited with code 137 after the endpoint was live", out, re.M), out
    assert key not in out + "".join(run.log(r) for r in (0, 1))


def test_pipeline_across_two_nodes_both_ranks_load_and_meet(netns_lab, tmp_path, meter):
    run = RealRun(netns_lab, tmp_path, meter, "pipeline: tp=1 pp=2 over 2 nodes",
                  layer="INFERENCE_NODES=2\nPIPELINE_PARALLEL_SIZE=2\nSTARTUP_STALL_S=240\n")
    run.submit()
    deadline = time.monotonic() + LIVE_TIMEOUT_S
    while time.monotonic() < deadline and BANNER not in run.text() and not run.ended():
        time.sleep(1)
    text = run.text()
    for rank in (0, 1):
        log = run.log(rank)
        assert "Loading weights took" in log, (rank, log[-3000:])
        assert f"rank {rank} in world size 2 is assigned as DP rank 0, PP rank {rank}" in log, (rank, log[-3000:])
        assert "Failed to get the IP address" not in log
    if BANNER in text:  # the engine's pipeline on CPU generates: the endpoint is live and a chat answers
        (base,), served = run.block(text)
        answers_openai(base, served)
        run.cancel()
        return
    # vLLM 0.32's CPU model runner cannot run a pipeline stage: the first forward pass fails on the last stage
    # (`assert self.intermediate_tensors is not None`), and the launcher's one-token completion says so
    assert run.wait_end() == "FAILED"
    errors = launcher_errors(run.text())
    assert any(e.startswith("ENVLAYERS-ERROR: rank 0 on n1 lists 'hpcagent-bench-vllm' but cannot generate: a "
                            "one-token completion answered HTTP 500") for e in errors), run.text()
    assert any(e.startswith("ENVLAYERS-ERROR: rank 1 engine said: ") and "AssertionError" in e for e in errors), \
        run.text()
    assert "assert self.intermediate_tensors is not None" in run.log(1)


def test_ray_shape_with_the_real_vllm_ends_quoting_that_the_cpu_platform_has_no_ray(netns_lab, tmp_path, meter):
    ray = needs_extra("ray", "ray")
    import msgpack  # Ray's one dependency the engine's environment lacks

    # the real `vllm` alone ahead of this interpreter's bin (where Ray is), so `ray` and `python3` are Ray's
    shim = tmp_path / "vllm-only"
    shim.mkdir()
    (shim / "vllm").symlink_to(realvllm.bin_dir() / "vllm")
    # the engine's environment has no Ray (it would stop at "Failed to import Ray"): the cluster's own Ray,
    # the one the job's Ray head runs, in reach of the engine, and nothing else of this interpreter's
    reach = tmp_path / "ray-for-vllm"
    reach.mkdir()
    for module in (ray, msgpack):
        (reach / Path(module.__file__).parent.name).symlink_to(Path(module.__file__).parent)
    run = RealRun(netns_lab, tmp_path, meter, "ray: 2 nodes", model="llama405bray",
                  layer="TENSOR_PARALLEL_SIZE=2\nRAY_NUM_CPUS=1\n",
                  path_first=f"{shim}:{Path(sys.executable).parent}")
    run.env["PYTHONPATH"] += os.pathsep + str(reach)
    run.submit()
    assert run.wait_end(timeout_s=LIVE_TIMEOUT_S) == "FAILED"
    text = run.text()
    assert "ENVLAYERS-TOPOLOGY: shape=ray nodes=2 gpus_per_node=1 tp=2" in text
    said = [e for e in launcher_errors(text) if " engine said: " in e]
    assert any("ValueError: current platform cpu does not support ray" in e for e in said), text
