"""wait / status / logs / stop without a cluster: the fake Slurm (``fake``, the runner) on the fake clock
(``clock``, both from conftest.py) and run directories from rundirtools."""

from __future__ import annotations

import io
import json
import os
import subprocess
from pathlib import Path

import pytest
from envlayers import ops, readiness, rundir, slurm
from envlayers.job import Job, endpoint_urls, find_job, replica_urls
from envlayers.ops import watch
from envlayers.cli import ops_format as fmt
from rundirtools import VLLM_LOG, endpoint_data, invoke, make_job
from slurmtools import scontrol_line

# ------------------------------------------------------------------------------------------ rundir

JOB_OUT = """ENVLAYERS-STAGE: run_dir=/scratch/alice/inference-server/77
ENVLAYERS-TOPOLOGY: shape=pipeline nodes=2 gpus_per_node=4 tp=4 pp=2 world=8 api_rank=0 port=8000
ENVLAYERS-STAGE: rank 0 up on nid001
ENVLAYERS-STAGE: rank 1 up on nid002
ENVLAYERS-STAGE: all 2 ranks started
ENVLAYERS-WARN: readiness budget 7200s exceeds the allocation; clamping to 3240s
libfabric:81377:1764511190::cxi:core:cxip_gen_auth_key_ss_env_get_vni():612<warn> Unable to find SLINGSHOT_VNIS
ENVLAYERS-STAGE: endpoint live after 41.5s
===== endpoint is live =====
base URL: http://nid001:8000/v1
model name: hpcagent-bench-vllm

ENVLAYERS-ERROR: rank 1 exited with code 137 after the endpoint was live
"""


def test_parse_job_output_reads_every_launcher_line():
    r = rundir.parse_job_output(JOB_OUT)
    assert r.run_dir == "/scratch/alice/inference-server/77"
    assert r.ranks_up == {0: "nid001", 1: "nid002"} and r.ranks_started == 2
    assert r.topology == ["shape=pipeline nodes=2 gpus_per_node=4 tp=4 pp=2 world=8 api_rank=0 port=8000"]
    assert r.warnings == ["readiness budget 7200s exceeds the allocation; clamping to 3240s"]
    assert r.last_error == "rank 1 exited with code 137 after the endpoint was live"
    assert r.live and r.live_after_s == 41.5
    assert r.endpoint_block == ("===== endpoint is live =====\nbase URL: http://nid001:8000/v1\n"
                                "model name: hpcagent-bench-vllm\n")


def test_last_error_skips_the_log_tail_header():
    r = rundir.parse_job_output("ENVLAYERS-ERROR: rank 0 on n1 exited with code 1 before the endpoint was live\n"
                                "ENVLAYERS-ERROR: last 20 lines of /runs/7/server-0.log:\n"
                                "RuntimeError: boom\n")
    assert r.last_error == "rank 0 on n1 exited with code 1 before the endpoint was live"


def test_parse_job_output_accepts_the_launched_spelling_and_no_block():
    r = rundir.parse_job_output("ENVLAYERS-STAGE: all 4 ranks launched\n")
    assert r.ranks_started == 4 and not r.live and r.run_dir is None


def test_locate_takes_the_run_dir_from_the_job_output(tmp_path):
    run_dir = make_job(tmp_path, "55")
    info = slurm.parse_scontrol_job(scontrol_line("55", workdir=str(tmp_path)))
    files = rundir.locate("55", info, environ={}, cwd=Path("/nonexistent"))
    assert files.job_out == tmp_path / "serve-only-55.out" and files.run_dir == run_dir


def test_locate_falls_back_to_scratch_when_the_output_is_gone(tmp_path):
    (tmp_path / "scratch" / "inference-server" / "56").mkdir(parents=True)
    files = rundir.locate("56", None, environ={"SCRATCH": str(tmp_path / "scratch")}, cwd=tmp_path)
    assert files.run_dir == tmp_path / "scratch" / "inference-server" / "56"
    assert files.job_out == tmp_path / "serve-only-56.out"


def test_locate_without_anything_has_no_run_dir(tmp_path):
    assert rundir.locate("57", None, environ={}, cwd=tmp_path).run_dir is None


def test_job_files_read_tolerantly(tmp_path):
    run_dir = make_job(tmp_path, "58", exits={0: 0, 1: 137}, endpoint=endpoint_data("58", tmp_path))
    (run_dir / "rank-2.exit").write_text("")
    (run_dir / "launch.json").write_text('{"engine": "vllm", "served_mod')  # half-written
    files = rundir.JobFiles("58", None, run_dir)
    assert files.rank_exits() == {0: 0, 1: 137, 2: None}
    assert files.endpoint().base_urls == ["http://n1:8000/v1"]  # a field it does not know is no obstacle
    assert "some_future_field" not in files.endpoint().to_dict()
    assert files.launch() is None
    assert rundir.JobFiles("58", None, None).endpoint() is None


# ------------------------------------------------------------------------------------------ progress

def test_progress_plain_prints_a_timestamped_line_per_change():
    out = io.StringIO()
    p = fmt.Progress(out, mode="plain", clock=lambda: 0)
    p.update("job 1: PENDING (Priority)", 1, key="a")
    p.update("job 1: PENDING (Priority)", 2, key="a")
    p.message("ENVLAYERS-WARN: x")
    p.update("job 1: RUNNING", 3, key="b")
    lines = out.getvalue().splitlines()
    assert len(lines) == 3
    assert lines[0].endswith("] job 1: PENDING (Priority) [1s]") and lines[0].startswith("[")
    assert lines[1].endswith("ENVLAYERS-WARN: x") and lines[2].endswith("job 1: RUNNING [3s]")


def test_progress_tty_rewrites_one_line_and_keeps_messages_above_it():
    out = io.StringIO()
    p = fmt.Progress(out, mode="tty")
    p.update("job 1: PENDING", 1)
    p.update("job 1: PENDING", 1.2)  # the same on screen: nothing written
    p.update("job 1: PENDING", 2)
    p.message("ENVLAYERS-ERROR: boom")
    p.close()
    assert out.getvalue() == ("\r\x1b[Kjob 1: PENDING [1s]\r\x1b[Kjob 1: PENDING [2s]"
                              "\r\x1b[KENVLAYERS-ERROR: boom\njob 1: PENDING [2s]\n")


@pytest.mark.parametrize("state, report_lines, with_phase, expect", [
    pytest.param("PENDING", [], False, "job 9: PENDING (Priority)", id="pending"),
    pytest.param("RUNNING", [], False, "job 9: RUNNING on n1, waiting for the launcher", id="no-launcher-yet"),
    pytest.param("RUNNING", ["ENVLAYERS-STAGE: rank 0 up on n1"], False, "job 9: RUNNING on n1, 1/1 ranks up",
                 id="ranks"),
    pytest.param("RUNNING", [], True, "job 9: RUNNING on n1, phase: KV cache allocated (kv_cache_gib=24)",
                 id="phase"),
])
def test_progress_text(state, report_lines, with_phase, expect):
    info = slurm.parse_scontrol_job(scontrol_line("9", state, reason="Priority" if state == "PENDING" else "None"))
    report = rundir.parse_job_output("\n".join(report_lines))
    phase = None
    if with_phase:
        from envlayers.phases import parse_phases
        from envlayers.ops.progress import RankProgress
        phase = RankProgress(parse_phases(VLLM_LOG[2:3]).last, 1, 1)
    job = Job("9", info, rundir.JobFiles("9", None, None))
    assert fmt.progress_text(ops.WaitEvent("state", job, report, phase)) == expect


def test_compact_duration():
    from envlayers.durations import compact

    assert [compact(s) for s in (None, 0, 59.6, 75, 3725)] == ["-", "0s", "1m00s", "1m15s", "1h02m05s"]


# ------------------------------------------------------------------------------------------ wait

def test_wait_prints_the_endpoint_block_once_live(fake, tmp_path):
    run_dir = make_job(tmp_path, "100", log_lines=VLLM_LOG)
    (run_dir / "endpoint.json").write_text(json.dumps(endpoint_data("100", run_dir)))
    fake.states["100"] = ["RUNNING"]
    res = invoke("wait", "100", "--poll", "0.05")
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith(readiness.BANNER + "\nbase URL: http://n1:8000/v1\n")
    assert "stop: env_layers stop 100 " in res.stdout


def test_wait_shows_state_then_phases_in_order(fake, tmp_path):
    run_dir = make_job(tmp_path, "101", log_lines=[])
    fake.states["101"] = ["PENDING", "PENDING", "RUNNING"]
    log = run_dir / "server-0.log"

    def grow(job, n):  # one more log line per Slurm poll; live after the last
        if 3 <= n < 3 + len(VLLM_LOG):
            with log.open("a") as fh:
                fh.write(VLLM_LOG[n - 3] + "\n")
        elif n >= 3 + len(VLLM_LOG):
            (run_dir / "endpoint.json").write_text(json.dumps(endpoint_data("101", run_dir)))

    fake.on_poll = grow
    res = invoke("wait", "101", "--poll", "0.05", "--progress", "plain")
    assert res.exit_code == 0, res.output
    seen = [line.split("] ", 1)[1] for line in res.stderr.splitlines()]
    order = ["PENDING", "RUNNING on n1", "loading weights", "weights loaded", "KV cache allocated", "capturing graphs"]
    positions = [next(i for i, s in enumerate(seen) if word in s) for word in order]
    assert positions == sorted(positions), seen
    assert sum("KV cache allocated" in s for s in seen) == 1  # details filling in is not a new line


def test_wait_on_a_job_that_ended_exits_1_with_the_reason_and_error(fake, tmp_path):
    make_job(tmp_path, "102", out_lines=["ENVLAYERS-STAGE: rank 0 up on n1",
                                         "ENVLAYERS-ERROR: rank 0 exited with code 1 before the endpoint was live"],
             log_lines=VLLM_LOG[:2] + ["RuntimeError: boom"], exits={0: 1})
    fake.states["102"] = ["RUNNING", "FAILED"]
    fake.extra["102"] = {"exit_code": "1:0"}
    res = invoke("wait", "102", "--poll", "0.05")
    assert res.exit_code == 1
    assert res.stderr.splitlines()[-1].startswith("  next: env_layers diagnose 102")
    err = res.stderr
    assert "job 102 ended before its endpoint was live: FAILED, exit 1:0" in err
    assert "ENVLAYERS-ERROR: rank 0 exited with code 1 before the endpoint was live" in err
    assert "rank 0 -> 1" in err and "weights loaded" in err


def test_wait_ended_job_with_stale_endpoint_is_not_live(fake, tmp_path):
    run_dir = make_job(tmp_path, "103")
    (run_dir / "endpoint.json").write_text(json.dumps(endpoint_data("103", run_dir)))
    fake.states["103"] = ["CANCELLED"]
    res = invoke("wait", "103", "--json")
    assert res.exit_code == 1
    data = json.loads(res.stdout)
    assert data["outcome"] == "ended" and data["state"] == "CANCELLED" and not data["live"]


def test_wait_timeout_exits_3_and_says_the_job_goes_on(fake, tmp_path):
    make_job(tmp_path, "104", log_lines=VLLM_LOG[:1])
    fake.states["104"] = ["RUNNING"]
    res = invoke("wait", "104", "--timeout", "0.3", "--poll", "0.05")
    assert res.exit_code == 3
    assert "job 104 not live after 0s: RUNNING, phase: loading weights" in res.stderr
    assert "env_layers stop 104" in res.stderr


def test_wait_json_when_live(fake, tmp_path):
    run_dir = make_job(tmp_path, "105", log_lines=VLLM_LOG)
    (run_dir / "endpoint.json").write_text(json.dumps(endpoint_data("105", run_dir)))
    fake.states["105"] = ["RUNNING"]
    res = invoke("wait", "105", "--json", "--progress", "none")
    data = json.loads(res.stdout)
    assert res.exit_code == 0 and data["outcome"] == "live" and data["endpoint"]["base_url"] == "http://n1:8000/v1"
    assert data["phase"]["name"] == "ready" and res.stderr == ""


def test_wait_notices_a_job_that_slurm_forgot(fake, tmp_path):
    make_job(tmp_path, "106")
    fake.states["106"] = ["RUNNING"]

    def forget(job, n):
        if n >= 2:
            fake.states.pop("106", None)

    fake.on_poll = forget
    res = invoke("wait", "106", "--poll", "0.05")
    assert res.exit_code == 1 and "Slurm no longer lists it" in res.stderr


def test_wait_rides_out_a_slurm_hiccup(fake, tmp_path, monkeypatch):
    run_dir = make_job(tmp_path, "108")
    fake.states["108"] = ["RUNNING"]
    real = fake.__call__

    def flaky(argv, **kw):
        n = sum(1 for c in fake.calls if c[:3] == ["scontrol", "show", "job"])
        if argv[:3] == ["scontrol", "show", "job"] and n in (1, 2):
            fake.calls.append(list(argv))
            return subprocess.CompletedProcess(argv, 1, "", "slurm_load_jobs error: Socket timed out on send/recv "
                                                             "operation\n")
        if n >= 3:
            (run_dir / "endpoint.json").write_text(json.dumps(endpoint_data("108", run_dir)))
        return real(argv, **kw)

    monkeypatch.setattr(slurm, "run", flaky)
    res = invoke("wait", "108", "--poll", "0.05", "--progress", "plain")
    assert res.exit_code == 0, res.output
    assert res.stderr.count("Slurm did not answer") == 1 and "Socket timed out" in res.stderr


def test_wait_on_a_forgotten_job_with_files_here_ends_at_once(fake, tmp_path):
    make_job(tmp_path, "107", out_lines=["ENVLAYERS-STAGE: endpoint live after 3.0s", readiness.BANNER])
    res = invoke("wait", "107", "--poll", "0.05")  # Slurm knows nothing of 107, its output is here
    assert res.exit_code == 1
    assert "job 107 ended after its endpoint had been live (Slurm no longer lists it)" in res.stderr


@pytest.mark.parametrize("args, message", [
    pytest.param(["wait", "999"], "no job 999: Slurm does not know it", id="wait-unknown"),
    pytest.param(["status", "999"], "no job 999", id="status-unknown"),
    pytest.param(["logs", "999"], "no job 999", id="logs-unknown"),
    pytest.param(["stop", "999"], "no job 999", id="stop-unknown"),
    pytest.param(["wait", "12a"], "'12a' is not a Slurm job id", id="bad-id"),
])
def test_unknown_job_is_one_line_with_a_hint_and_exit_2(fake, args, message):
    res = invoke(*args)
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "hint:" in lines[0]


# ------------------------------------------------------------------------------------------ status

def test_status_lists_my_jobs_as_a_table(fake, tmp_path, monkeypatch):
    run_dir = make_job(tmp_path, "200")
    (run_dir / "endpoint.json").write_text(json.dumps(endpoint_data("200", run_dir)))
    make_job(tmp_path, "201", launch={"engine": "sglang", "served_model_name": "glm-served", "model": "zai/GLM",
                                      "target": "experiment:glm53"})
    fake.squeue_out = (f"200|serve-only|RUNNING|None|1|n1|4:00:00|3:59:00|2026-12-02T09:00:01|N/A|alice|{tmp_path}\n"
                       f"201|serve-only|RUNNING|None|2|n[2-3]|4:00:00|1:00:00|2026-12-02T09:00:01|N/A|alice|{tmp_path}\n"
                       f"202|serve-only|PENDING|Resources|4||4:00:00|4:00:00|N/A|N/A|alice|{tmp_path}\n")
    monkeypatch.setattr("getpass.getuser", lambda: "alice")
    res = invoke("status")
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[0].split() == ["JOBID", "STATE", "NODES", "TIME", "LEFT", "TARGET", "MODEL", "ID", "SERVED", "NAME",
                                "PHASE", "URL"]
    # the same words as status JOBID and --json: target, model id, served name, state, phase, url
    assert lines[1].split() == ["200", "RUNNING", "1", "3h59m00s", "-", "Qwen/Qwen3-8B", "hpcagent-bench-vllm",
                                "live", "http://n1:8000/v1"]
    assert lines[2].split() == ["201", "RUNNING", "2", "1h00m00s", "experiment:glm53", "zai/GLM", "glm-served",
                                "starting", "-"]
    assert lines[3].split() == ["202", "PENDING", "(Resources)", "4", "4h00m00s", "-", "-", "-", "-", "-"]
    assert fake.calls[0][-2:] == ["-u", "alice"]


def test_status_all_users_and_json(fake, tmp_path):
    fake.squeue_out = f"300|serve-only|PENDING|Priority|1||10:00|10:00|N/A|N/A|bob|{tmp_path}\n"
    res = invoke("status", "--all", "--json")
    rows = json.loads(res.stdout)
    assert rows[0]["job_id"] == "300" and rows[0]["state"] == "PENDING (Priority)" and rows[0]["time_left_s"] == 600
    assert "-u" not in fake.calls[0]


def test_status_empty(fake):
    res = invoke("status", "--all")
    assert res.exit_code == 0 and "no endpoint jobs" in res.stdout


SERVE_ENV = ("# site: h100\nexport INFERENCE_MODEL='zai/GLM'\nexport VLLM_SERVED_MODEL='from-serve-env'\n"
             "export INFERENCE_ENGINE='vllm'\n")  # the merged layers, as the job script writes them


@pytest.mark.parametrize("files, previous_at_top, want", [
    pytest.param({"serve.env": SERVE_ENV}, False,
                 {"target": None, "model_id": "zai/GLM", "served_name": "from-serve-env", "engine": "vllm",
                  "site": None}, id="serve-env-only"),
    pytest.param({"serve.env": SERVE_ENV, "launch.json": {"served_model_name": "from-launch", "engine": "sglang",
                                                          "site": "mi300a", "target": "experiment:glm53"}}, False,
                 {"target": "experiment:glm53", "model_id": "zai/GLM", "served_name": "from-launch",
                  "engine": "sglang", "site": "mi300a"}, id="launch-before-serve-env"),
    pytest.param({"serve.env": SERVE_ENV, "launch.json": {"served_model_name": "from-launch", "target": "t:x"},
                  "endpoint.json": {"served_model_name": "from-endpoint", "model": "m/ep", "base_urls": []}}, False,
                 {"target": "t:x", "model_id": "m/ep", "served_name": "from-endpoint", "engine": "vllm",
                  "site": None}, id="endpoint-first-target-from-launch"),
    pytest.param({"serve.env": SERVE_ENV}, True, dict.fromkeys(("target", "model_id", "served_name", "engine",
                                                                 "site")), id="an-earlier-runs-files-say-nothing"),
])
def test_what_a_job_serves_is_read_once_for_status_and_clients(tmp_path, files, previous_at_top, want):
    # the Job handle reads it (endpoint.json, else launch.json, else serve.env); status shows that reading
    # and a client's default model is its served name
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for name, body in files.items():
        (run_dir / name).write_text(body if isinstance(body, str) else json.dumps(body))
    job = Job("7", None, rundir.JobFiles("7", None, run_dir, previous_at_top=previous_at_top))
    assert job.identity() == want
    assert job.served == want["served_name"]
    if not previous_at_top:  # (status asks Slurm's record whether the top is an earlier run's: none here)
        assert {k: v for k, v in ops.status.job_record(job, probe_endpoint=False).items() if k in want} == want


def test_status_of_one_job_is_the_full_record(fake, tmp_path, monkeypatch):
    run_dir = make_job(tmp_path, "400", out_lines=["ENVLAYERS-STAGE: rank 0 up on n1", "ENVLAYERS-STAGE: all 1 ranks started",
                                                   "ENVLAYERS-WARN: core limit was unlimited"],
                       log_lines=VLLM_LOG)
    (run_dir / "endpoint.json").write_text(json.dumps(endpoint_data("400", run_dir)))
    fake.states["400"] = ["RUNNING"]
    probed = []
    monkeypatch.setattr(readiness, "probe", lambda url, name, api_key=None, timeout_s=2.0: probed.append(url) or
                        readiness.Probe(url, True, 200, "ok"))
    res = invoke("status", "400")
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert out.startswith("job 400: RUNNING\n")
    for text in ("nodes:       1 (n1)", "time:        3h59m00s left of 4h00m00s", f"run dir:     {run_dir}",
                 "ranks:       1/1 up (0 on n1)", "phase:       ready", "url:         http://n1:8000/v1",
                 "probe:       http://127.0.0.1:8000/v1: answers (ok)", "warning:     core limit was unlimited",
                 "model id:    Qwen/Qwen3-8B (vllm)", "served name: hpcagent-bench-vllm"):
        assert text in out, text
    assert probed == ["http://127.0.0.1:8000/v1"]  # the address, not the node name
    data = json.loads(invoke("status", "400", "--json", "--no-probe").stdout)
    assert data["phase"]["name"] == "ready" and data["probes"] == [] and data["launcher"]["ranks_up"] == {"0": "n1"}


def test_status_of_a_failed_job_shows_its_errors_and_rank_exits(fake, tmp_path):
    make_job(tmp_path, "401", out_lines=["ENVLAYERS-ERROR: rank 0 exited with code 137 before the endpoint was live"],
             log_lines=VLLM_LOG[:1], exits={0: 137})
    fake.states["401"] = ["FAILED"]
    fake.extra["401"] = {"exit_code": "1:0", "reason": "NonZeroExitCode"}
    out = invoke("status", "401").stdout
    assert out.startswith("job 401: FAILED (NonZeroExitCode), exit 1:0\n")
    assert "rank exits:  rank 0 -> 137" in out and "error:       rank 0 exited with code 137" in out
    assert "phase:       loading weights" in out


def test_status_of_a_pending_job(fake, tmp_path):
    fake.states["402"] = ["PENDING"]
    fake.extra["402"] = {"reason": "Resources"}
    out = invoke("status", "402").stdout
    assert out.startswith("job 402: PENDING (Resources)\n") and "run dir:     - (not created yet)" in out


# ------------------------------------------------------------------------------------------ logs

def test_logs_rank0_by_default_and_tail(fake, tmp_path):
    make_job(tmp_path, "500", log_lines=VLLM_LOG)
    fake.states["500"] = ["RUNNING"]
    assert invoke("logs", "500").stdout.splitlines() == VLLM_LOG
    assert invoke("logs", "500", "--tail", "2").stdout.splitlines() == VLLM_LOG[-2:]
    data = json.loads(invoke("logs", "500", "-n", "1", "--json").stdout)
    assert data["lines"] == VLLM_LOG[-1:] and data["rank"] == 0


def test_logs_of_the_job_output(fake, tmp_path):
    make_job(tmp_path, "501", out_lines=["ENVLAYERS-STAGE: rank 0 up on n1"])
    fake.states["501"] = ["RUNNING"]
    assert invoke("logs", "501", "--rank", "job", "--tail", "1").stdout == "ENVLAYERS-STAGE: rank 0 up on n1\n"


def test_logs_of_a_missing_rank_names_the_ranks_there_are(fake, tmp_path):
    make_job(tmp_path, "502", log_lines=VLLM_LOG)
    fake.states["502"] = ["RUNNING"]
    res = invoke("logs", "502", "--rank", "3")
    assert res.exit_code == 2 and "no server-3.log" in res.stderr and "ranks with logs: [0]" in res.stderr


def test_logs_of_a_pending_job_says_when_they_appear(fake):
    fake.states["503"] = ["PENDING"]
    fake.extra["503"] = {"reason": "Priority"}
    res = invoke("logs", "503")
    assert res.exit_code == 2
    assert "no run directory for job 503 yet" in res.stderr and "PENDING (Priority)" in res.stderr


def test_logs_bad_rank(fake):
    res = invoke("logs", "1", "--rank", "x")
    assert res.exit_code == 2 and "rank number or 'job'" in res.stderr


def test_logs_follow_prints_new_lines_until_the_job_ends(fake, tmp_path):
    run_dir = make_job(tmp_path, "504", log_lines=VLLM_LOG[:1])
    fake.states["504"] = ["RUNNING", "RUNNING", "COMPLETED"]

    def grow(job, n):
        if n == 2:
            with (run_dir / "server-0.log").open("a") as fh:
                fh.write(VLLM_LOG[1] + "\n")

    fake.on_poll = grow
    res = invoke("logs", "504", "--follow")
    assert res.exit_code == 0
    assert res.stdout.splitlines() == VLLM_LOG[:2]


# ------------------------------------------------------------------------------------------ stop

def _no_answer(url, name, api_key=None, timeout_s=2.0):
    return readiness.Probe(url, False, None, "no answer: [Errno 111] Connection refused")


def test_stop_cancels_waits_and_confirms_the_endpoint_is_silent(fake, tmp_path, monkeypatch):
    run_dir = make_job(tmp_path, "600")
    (run_dir / "endpoint.json").write_text(json.dumps(endpoint_data("600", run_dir)))
    fake.states["600"] = ["RUNNING"]
    monkeypatch.setattr(readiness, "probe", _no_answer)
    res = invoke("stop", "600")
    assert res.exit_code == 0, res.output
    assert fake.cancelled == ["600"]
    assert res.stdout.splitlines() == [
        "job 600: scancel sent (RUNNING)",
        "job 600: ended (CANCELLED) after 0s",
        "endpoint http://127.0.0.1:8000/v1: no longer answers (no answer: [Errno 111] Connection refused)",
        "job 600: stopped",
    ]


def test_stop_fails_when_the_endpoint_still_answers(fake, tmp_path, monkeypatch):
    run_dir = make_job(tmp_path, "601")
    (run_dir / "endpoint.json").write_text(json.dumps(endpoint_data("601", run_dir)))
    fake.states["601"] = ["RUNNING"]
    monkeypatch.setattr(readiness, "probe", lambda url, name, api_key=None, timeout_s=2.0:
                        readiness.Probe(url, True, 200, "ok"))
    monkeypatch.setattr(ops, "stop_job", _fast_stop(ops.stop_job))
    res = invoke("stop", "601", "--json")
    data = json.loads(res.stdout)
    assert res.exit_code == 1 and not data["ok"] and data["ended"] and data["probes"][0]["answers"]


def test_stop_fails_when_slurm_does_not_end_the_job(fake, tmp_path):
    make_job(tmp_path, "602")
    fake.states["602"] = ["RUNNING"]
    fake.after_cancel = "COMPLETING"
    res = invoke("stop", "602", "--timeout", "0.3")
    assert res.exit_code == 1 and "still COMPLETING" in res.stderr


def test_stop_of_an_ended_job_does_not_cancel(fake, tmp_path, monkeypatch):
    make_job(tmp_path, "603")
    fake.states["603"] = ["FAILED"]
    monkeypatch.setattr(readiness, "probe", _no_answer)
    res = invoke("stop", "603")
    assert res.exit_code == 0 and fake.cancelled == []
    assert "already ended (FAILED)" in res.stdout and "never went live" in res.stdout


def test_stop_of_a_job_in_a_chain_stops_its_successors_first_latest_first(fake, tmp_path, monkeypatch):
    run_dir = make_job(tmp_path, "610")
    (run_dir / "endpoint.json").write_text(json.dumps(endpoint_data("610", run_dir)))
    (run_dir / "chain.json").write_text(json.dumps({"predecessor": None, "successor": "611"}))
    (run_dir.parent / "611").mkdir()
    (run_dir.parent / "611" / "chain.json").write_text(json.dumps({"predecessor": "610", "successor": "612"}))
    fake.states.update({"610": ["RUNNING"], "611": ["PENDING"], "612": ["PENDING"]})
    monkeypatch.setattr(readiness, "probe", _no_answer)
    res = invoke("stop", "610")
    assert res.exit_code == 0, res.output
    # left pending, a successor would start once its predecessor ends and bring the endpoint back
    assert fake.cancelled == ["612", "611", "610"]
    assert res.stdout.splitlines()[0] == ("job 610: its chain goes on to job(s) 612, 611; stopping those first, "
                                          "latest first, so none starts once this one ends")
    assert res.stdout.splitlines()[-1] == "job 610: stopped"
    res = invoke("stop", "610", "--json")
    assert [r["job_id"] for r in json.loads(res.stdout)["successors"]] == ["612", "611"]


def test_stop_fails_when_a_successor_does_not_end(fake, tmp_path, monkeypatch):
    run_dir = make_job(tmp_path, "620")
    (run_dir / "chain.json").write_text(json.dumps({"predecessor": None, "successor": "621"}))
    fake.states.update({"620": ["RUNNING"], "621": ["PENDING"]})
    fake.after_cancel = "COMPLETING"
    monkeypatch.setattr(readiness, "probe", _no_answer)
    res = invoke("stop", "620", "--timeout", "0.3", "--json")
    data = json.loads(res.stdout)
    assert res.exit_code == 1 and not data["ok"] and not data["successors"][0]["ended"]


def test_stop_of_a_chain_goes_on_when_slurm_cannot_say_of_a_successor(fake, tmp_path, monkeypatch):
    run_dir = make_job(tmp_path, "630")
    # Slurm cannot say of 631; '../x' after it is not a job id: the walk ends there
    (run_dir / "chain.json").write_text(json.dumps({"predecessor": None, "successor": "631"}))
    (run_dir.parent / "631").mkdir()
    (run_dir.parent / "631" / "chain.json").write_text(json.dumps({"successor": "../x"}))
    fake.states.update({"630": ["RUNNING"]})
    monkeypatch.setattr(readiness, "probe", _no_answer)
    from envlayers.errors import EnvLayersError
    from envlayers.ops import stop as stop_module

    real_find = stop_module.find_job

    def find_job(job_id, **kw):  # Slurm stops answering for the successor only
        if job_id == "631":
            raise EnvLayersError("scontrol show job 631: Unable to contact slurm controller")
        return real_find(job_id, **kw)

    monkeypatch.setattr(stop_module, "find_job", find_job)
    res = invoke("stop", "630")
    assert fake.cancelled == ["630"]  # the job asked for is stopped all the same
    assert res.exit_code == 1 and "job 631: NOT stopped: " in res.stderr, res.output
    assert res.stdout.splitlines()[-1] == "job 630: stopped"
    from envlayers.rundir import chain_links

    assert [j for j, _ in chain_links("630", run_dir)] == ["630", "631"]


def _fast_stop(real):
    def stop_job(*args, **kw):
        return real(*args, probe_window_s=0.2, poll_s=0.05, **kw)
    return stop_job


def test_endpoint_urls_use_addresses_when_given():
    ep = rundir.EndpointRecord.from_dict
    assert endpoint_urls(ep({"base_urls": ["http://n1:8000/v1", "http://n2:8000/v1"],
                                 "addresses": ["10.0.0.1", "10.0.0.2"]})) == [
        "http://10.0.0.1:8000/v1", "http://10.0.0.2:8000/v1"]
    assert endpoint_urls(ep({"base_urls": ["http://n1:8000/v1"], "addresses": ["http://10.0.0.1:8000/v1"]})) == [
        "http://10.0.0.1:8000/v1"]  # the launcher writes whole URLs
    assert endpoint_urls(ep({"base_url": "http://n1:8000/v1"})) == ["http://n1:8000/v1"]
    assert endpoint_urls(None) == []


def test_replica_urls_are_the_replicas_own_behind_a_router_and_the_base_urls_without_one():
    routed = rundir.EndpointRecord.from_dict({
        "base_urls": ["http://n1:30000/v1"], "addresses": ["10.0.0.1", "10.0.0.2"],
        "replica_urls": ["http://n1:8000/v1", "http://n2:8000/v1"], "replica_addresses": ["10.0.0.1", "10.0.0.2"]})
    assert endpoint_urls(routed) == ["http://10.0.0.1:30000/v1"]
    assert replica_urls(routed) == ["http://10.0.0.1:8000/v1", "http://10.0.0.2:8000/v1"]
    # replica 0 gone: the router's URL stays on node 0, the one replica left keeps its own address
    routed.replica_urls, routed.replica_addresses = ["http://n2:8000/v1"], ["10.0.0.2"]
    assert replica_urls(routed) == ["http://10.0.0.2:8000/v1"]
    assert endpoint_urls(routed) == ["http://10.0.0.1:30000/v1"]
    plain = rundir.EndpointRecord(base_urls=["http://n1:8000/v1", "http://n2:8000/v1"], addresses=["10.0.0.1", "10.0.0.2"])
    assert replica_urls(plain) == endpoint_urls(plain) == ["http://10.0.0.1:8000/v1", "http://10.0.0.2:8000/v1"]
    assert replica_urls(None) == []


def test_cli_commands_are_registered_and_cheap_to_import():
    import subprocess as sp
    import sys
    code = ("import sys; from envlayers.cli import cli; import envlayers.cli.ops_cmds; "
            "print(sorted(m for m in ('envlayers.ops','envlayers.job','envlayers.slurm','urllib.request') if m in sys.modules))")
    out = sp.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert out.stdout.strip() == "[]", out.stderr


# ------------------------------------------------------------------------------------------ the watcher

def test_watcher_asks_slurm_every_poll_and_looks_at_files_every_step(fake, tmp_path, clock):
    make_job(tmp_path, "700")
    fake.states["700"] = ["RUNNING"]
    job = find_job("700")
    w = watch.JobWatcher(job, poll_s=1.0, step_s=0.25, clock=clock.watch())
    asked = [tick.asked_slurm for _, tick in zip(range(9), w.ticks())]
    # turns at t0, +0.25, ... +2.0: Slurm at +1.0 and +2.0 only
    assert asked == [False, False, False, False, True, False, False, False, True]
    assert clock.slept == [0.25] * 8


def test_watcher_rides_out_slurm_silence_then_gives_up(fake, tmp_path, clock, monkeypatch):
    make_job(tmp_path, "701")
    fake.states["701"] = ["RUNNING"]
    job = find_job("701")
    monkeypatch.setattr(slurm, "run", lambda argv, **kw: subprocess.CompletedProcess(
        argv, 1, "", "slurm_load_jobs error: Socket timed out on send/recv operation\n"))
    w = watch.JobWatcher(job, poll_s=10.0, step_s=10.0, clock=clock.watch(), outage_s=60.0)
    ticks = w.ticks()
    silent = []
    with pytest.raises(slurm.SlurmError, match="Socket timed out"):
        for tick in ticks:
            silent.append(tick.slurm_silent)
    said = [s for s in silent if s]
    assert len(said) == 1 and "Socket timed out" in said[0]  # said once per outage
    assert 60.0 < clock.now - 1000.0 <= 80.0  # gave up once the outage passed outage_s


# ------------------------------------------------------------------------------------------ a controller outage

OUTAGE_TEXT = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)\n"


@pytest.mark.parametrize("stderr, unreachable", [
    pytest.param(OUTAGE_TEXT, True, id="connect-failure"),
    pytest.param("slurm_load_jobs error: Socket timed out on send/recv operation\n", True, id="socket-timeout"),
    pytest.param("slurm_load_jobs error: Zero Bytes were transmitted or received\n", True, id="zero-bytes"),
    pytest.param("slurm_load_jobs error: Access/permission denied\n", False, id="permission-denied"),
])
def test_a_controller_that_does_not_answer_is_unreachable_not_a_refusal(stderr, unreachable):
    def run(argv, **kw):
        return subprocess.CompletedProcess(argv, 1, "", stderr)

    with pytest.raises(slurm.SlurmError) as caught:
        slurm.job_info("1234", run=run)
    assert isinstance(caught.value, slurm.SlurmUnreachable) is unreachable
    assert caught.value.exit_code == (75 if unreachable else 2)


def test_sbatch_that_cannot_reach_the_controller_is_unreachable():
    def run(argv, **kw):
        return subprocess.CompletedProcess(argv, 1, "", "sbatch: error: Batch job submission failed: "
                                                        "Unable to contact slurm controller (connect failure)\n")

    with pytest.raises(slurm.SlurmUnreachable, match="could not reach Slurm.*connect failure"):
        slurm.submit(["--nodes=1"], "#!/bin/bash\n", run=run)


def test_a_client_command_that_hangs_is_unreachable(monkeypatch):
    def hang(*args, **kw):
        raise subprocess.TimeoutExpired(args[0], kw.get("timeout"))

    monkeypatch.setattr(subprocess, "run", hang)
    with pytest.raises(slurm.SlurmUnreachable, match="did not answer within 5s"):
        slurm.run(["scontrol", "ping"], timeout_s=5)


def test_wait_rides_out_an_outage_at_its_first_look_and_then_reports_live(fake, tmp_path, clock):
    run_dir = make_job(tmp_path, "720", log_lines=VLLM_LOG)
    (run_dir / "endpoint.json").write_text(json.dumps(endpoint_data("720", run_dir)))
    fake.states["720"] = ["RUNNING"]
    fake.down_until = clock.now + 100.0  # the first six asks fail, 18 s each
    events = []
    result = ops.wait_for("720", poll_s=1.0, on_event=events.append, outage_s=300.0)
    assert result.outcome == "live"
    silent = [e for e in events if e.kind == "slurm-silent"]
    assert len(silent) == 1 and "connect failure" in silent[0].text and silent[0].job is None  # said once
    failed = [c for c in fake.calls if c[:3] == ["scontrol", "show", "job"]]
    assert len(failed) >= 7  # asked again until it answered


def test_wait_gives_up_after_the_outage_window_with_exit_75_not_bad_input(fake, tmp_path, clock):
    make_job(tmp_path, "721")
    fake.states["721"] = ["RUNNING"]
    fake.down_until = clock.now + 10_000.0
    t0 = clock.now
    res = invoke("wait", "721", "--slurm-outage", "60", "--progress", "plain")
    assert res.exit_code == 75, res.output
    assert "Slurm did not answer (" in res.stderr and "retrying" in res.stderr  # said while retrying
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("env_layers: error: Slurm did not answer for ") and "connect failure" in last
    assert "bad input" not in res.stderr and "no such job" not in res.stderr
    assert 60.0 <= clock.now - t0 <= 60.0 + 18.0 + 1.0  # one ask past the window at most


def test_wait_outage_window_comes_from_the_environment(fake, tmp_path, clock, monkeypatch):
    from envlayers.cli import ops_cmds
    from envlayers import job

    assert ops_cmds.OUTAGE_ENV == job.OUTAGE_ENV
    make_job(tmp_path, "722")
    fake.states["722"] = ["RUNNING"]
    fake.down_until = clock.now + 10_000.0
    monkeypatch.setenv(job.OUTAGE_ENV, "30")
    t0 = clock.now
    res = invoke("wait", "722", "--progress", "none")
    assert res.exit_code == 75, res.output
    assert 30.0 <= clock.now - t0 <= 30.0 + 18.0 + 1.0


def test_an_outage_mid_watch_past_the_window_ends_with_exit_75(fake, tmp_path, clock):
    make_job(tmp_path, "723")
    fake.states["723"] = ["RUNNING"]

    def stop_the_controller(job, n):
        if n == 3 and fake.down_until is None:
            fake.down_until = clock.now + 10_000.0

    fake.on_poll = stop_the_controller
    res = invoke("wait", "723", "--slurm-outage", "45", "--progress", "plain")
    assert res.exit_code == 75, res.output
    assert "Slurm did not answer for " in res.stderr and "connect failure" in res.stderr


def test_status_rides_out_an_outage_at_its_first_look(fake, tmp_path, clock):
    make_job(tmp_path, "724")
    fake.states["724"] = ["RUNNING"]
    fake.down_until = clock.now + 50.0
    res = invoke("status", "724", "--no-probe", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["state"] == "RUNNING"
    assert res.stderr.count("Slurm did not answer (") == 1 and "retrying for up to 300s" in res.stderr


@pytest.mark.parametrize("args", [pytest.param(["724"], id="one-job"), pytest.param([], id="the-list")])
def test_status_gives_up_after_the_outage_window_with_exit_75(fake, tmp_path, clock, args):
    make_job(tmp_path, "724")
    fake.states["724"] = ["RUNNING"]
    fake.down_until = clock.now + 10_000.0
    res = invoke("status", *args, "--slurm-outage", "20")
    assert res.exit_code == 75, res.output
    assert "Slurm did not answer for " in res.stderr and "--slurm-outage" in res.stderr


def test_commands_that_do_not_retry_still_call_an_outage_exit_75(fake, tmp_path, clock):
    make_job(tmp_path, "725")
    fake.states["725"] = ["RUNNING"]
    fake.down_until = clock.now + 10_000.0
    res = invoke("logs", "725")
    assert res.exit_code == 75, res.output
    assert "Unable to contact slurm controller" in res.stderr


# ------------------------------------------------------------------------------------------ a rank that exited

@pytest.mark.parametrize("exits, state", [
    pytest.param({1: 137}, "RUNNING", id="rank-1-killed-while-running"),
    pytest.param({0: 0}, "RUNNING", id="rank-0-exited-0"),
    pytest.param({0: 1, 1: 0}, "COMPLETING", id="completing"),
])
def test_wait_is_not_live_while_a_rank_has_exited_and_says_which(fake, tmp_path, exits, state):
    run_dir = make_job(tmp_path, "710", log_lines=VLLM_LOG, exits=exits)
    (run_dir / "endpoint.json").write_text(json.dumps(endpoint_data("710", run_dir)))
    fake.states["710"] = [state]
    res = invoke("wait", "710", "--timeout", "2", "--poll", "0.5", "--progress", "plain")
    assert res.exit_code == 3, res.output
    first = next(iter(exits.items()))
    assert f"rank {first[0]} exited with code {first[1]}" in res.stderr
    data = json.loads(invoke("wait", "710", "--timeout", "1", "--json", "--progress", "none").stdout)
    assert data["live"] is False and data["outcome"] == "timeout" and data["endpoint"] is None
    assert data["rank_exits"] == {str(r): c for r, c in exits.items()}


def test_wait_with_a_fake_clock_never_reports_live_past_an_exit_file(fake, tmp_path, clock):
    run_dir = make_job(tmp_path, "711", exits={1: 9})
    (run_dir / "endpoint.json").write_text(json.dumps(endpoint_data("711", run_dir)))
    fake.states["711"] = ["RUNNING", "RUNNING", "RUNNING", "FAILED"]
    events = []
    result = ops.wait_for("711", poll_s=1.0, on_event=events.append, clock=clock.watch())
    assert result.outcome == "ended" and result.rank_exits == {1: 9}
    states = [e for e in events if e.kind == "state"]
    assert states and all(e.rank_exits == {1: 9} for e in states)
    assert max(clock.slept) == 0.25 and sum(clock.slept) >= 3.0  # polled with the fake clock only


# ------------------------------------------------------------------------------------------ requeue

def test_scontrol_restarts_parsed():
    assert slurm.parse_scontrol_job(scontrol_line("1", restarts=2)).restarts == 2
    assert slurm.parse_scontrol_job("JobId=1 JobState=RUNNING").restarts is None


@pytest.mark.parametrize("recorded, restarts, pending, expect", [
    pytest.param(0, 0, False, False, id="first-run"),
    pytest.param(None, 0, False, False, id="first-run-before-launch-json"),
    pytest.param(0, 1, False, True, id="requeued-running-old-launch-json"),
    pytest.param(None, 1, False, True, id="requeued-running-no-launch-json-yet"),
    pytest.param(1, 1, False, False, id="requeued-new-run-wrote-launch-json"),
    pytest.param(1, 1, True, True, id="pending-again"),
    pytest.param(0, None, False, False, id="slurm-did-not-say"),
])
def test_top_is_previous(recorded, restarts, pending, expect):
    assert rundir.top_is_previous(recorded, restarts, pending) is expect


def test_job_output_of_a_requeued_job_reports_the_last_run_only():
    r = rundir.parse_job_output("ENVLAYERS-STAGE: run_dir=/r/9\nENVLAYERS-STAGE: rank 0 up on n1\n"
                                "ENVLAYERS-STAGE: endpoint live after 3.0s\nENVLAYERS-ERROR: old\n"
                                "ENVLAYERS-STAGE: run_dir=/r/9\nENVLAYERS-WARN: new\n")
    assert r.runs_seen == 2 and r.ranks_up == {} and not r.live and r.errors == [] and r.warnings == ["new"]
    assert r.run_dir == "/r/9"


RUN0_OUT = ["ENVLAYERS-STAGE: rank 0 up on n1", "ENVLAYERS-STAGE: all 1 ranks started",
            "ENVLAYERS-STAGE: endpoint live after 12.0s", readiness.BANNER, "base URL: http://n1:8000/v1", "",
            "ENVLAYERS-ERROR: rank 0 on n1 exited with code 143 after the endpoint was live"]


def requeued_job(tmp_path: Path, job_id: str) -> Path:
    """A run dir as the first run of a job left it when Slurm requeued it (node failure): files at the top."""
    run_dir = make_job(tmp_path, job_id, out_lines=RUN0_OUT, log_lines=VLLM_LOG, exits={0: 143},
                       launch={"job_id": job_id, "engine": "vllm", "served_model_name": "hpcagent-bench-vllm",
                               "restart": 0})
    (run_dir / "endpoint.json").write_text(json.dumps(endpoint_data(job_id, run_dir, restart=0)))
    return run_dir


def start_again(tmp_path: Path, run_dir: Path, job_id: str, restart: int) -> None:
    """What the job side does when a requeued job starts again: the top-level entries move to run-<n>/."""
    n = next(i for i in range(100) if not (run_dir / f"run-{i}").exists())
    (run_dir / f"run-{n}").mkdir()
    for entry in list(run_dir.iterdir()):
        if not entry.name.startswith("run-"):
            entry.rename(run_dir / f"run-{n}" / entry.name)
    (run_dir / "launch.json").write_text(json.dumps({"job_id": job_id, "engine": "vllm", "restart": restart,
                                                     "served_model_name": "hpcagent-bench-vllm"}))
    with (tmp_path / f"serve-only-{job_id}.out").open("a") as fh:
        fh.write(f"ENVLAYERS-STAGE: run_dir={run_dir}\nENVLAYERS-STAGE: rank 0 up on n2\n")


def test_status_of_a_requeued_pending_job_shows_nothing_old_as_current(fake, tmp_path):
    run_dir = requeued_job(tmp_path, "720")
    fake.states["720"] = ["PENDING"]
    fake.extra["720"] = {"restarts": 1, "reason": "BeginTime"}
    res = invoke("status", "720")
    out = res.stdout
    assert res.exit_code == 0 and out.startswith("job 720: PENDING (BeginTime)\n"), out
    assert "  run:         requeued (restart 1); waiting for Slurm to start it again\n" in out
    for old in ("endpoint:", "ranks:", "rank exits:", "phase:", "http://n1:8000", "exited with code 143",
                "launcher:"):
        assert old not in out.replace("earlier:", ""), (old, out)
    assert "  earlier:     top of the run dir (not moved yet): restart 0, had been live, rank exits 0 -> 143" in out
    data = json.loads(invoke("status", "720", "--json", "--no-probe").stdout)
    assert data["requeued"] and data["restart"] == 1 and data["endpoint"] is None and data["rank_exits"] == {}
    assert data["launcher"]["ranks_up"] == {} and data["phase"] is None
    assert [(r["folder"], r["restart"], r["live"]) for r in data["earlier_runs"]] == [(None, 0, True)]
    assert data["earlier_runs"][0]["path"] == str(run_dir)


def test_wait_on_a_requeued_job_keeps_waiting_then_follows_the_new_run(fake, tmp_path):
    run_dir = requeued_job(tmp_path, "721")
    fake.states["721"] = ["PENDING", "PENDING", "PENDING", "RUNNING"]
    fake.extra["721"] = {"restarts": 1, "reason": "BeginTime"}

    def new_run(job, n):
        if n == 5:
            start_again(tmp_path, run_dir, "721", restart=1)
        if n == 7:
            data = endpoint_data("721", run_dir, restart=1)
            data.update(base_urls=["http://n2:8000/v1"], base_url="http://n2:8000/v1")
            (run_dir / "endpoint.json").write_text(json.dumps(data))

    fake.on_poll = new_run
    res = invoke("wait", "721", "--poll", "0.5", "--progress", "plain", "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["outcome"] == "live" and data["endpoint"]["base_urls"] == ["http://n2:8000/v1"]
    assert data["restart"] == 1 and data["rank_exits"] == {}
    assert "requeued (restart 1); waiting for Slurm to start it again" in res.stderr
    assert "exited with code 143" not in res.stderr  # the previous run's error is not this run's


def test_wait_on_a_requeued_pending_job_times_out_instead_of_ending(fake, tmp_path):
    requeued_job(tmp_path, "722")
    fake.states["722"] = ["PENDING"]
    fake.extra["722"] = {"restarts": 1, "reason": "BeginTime"}
    res = invoke("wait", "722", "--timeout", "3", "--poll", "0.5")
    assert res.exit_code == 3, res.output
    assert ("job 722 not live after 3s: PENDING (BeginTime), requeued (restart 1); waiting for Slurm to start it "
            "again") in res.stderr
    assert "had been live" not in res.stderr


def test_logs_of_a_requeued_job_name_the_previous_runs_log(fake, tmp_path):
    run_dir = requeued_job(tmp_path, "723")
    fake.states["723"] = ["PENDING"]
    fake.extra["723"] = {"restarts": 1, "reason": "BeginTime"}
    res = invoke("logs", "723")
    assert res.exit_code == 2
    assert ("job 723 was requeued (restart 1): the current run has not written server-0.log yet; the previous "
            f"run's: {run_dir}/server-0.log (moved to run-0/ when the job starts again)") in res.stderr
    start_again(tmp_path, run_dir, "723", restart=1)
    fake.states["723"] = ["RUNNING"]
    res = invoke("logs", "723")
    assert res.exit_code == 2
    assert f"no server-0.log in {run_dir}; the previous run's: run-0/server-0.log" in res.stderr
    assert "--follow` waits for it" in res.stderr


def test_status_after_the_requeued_job_started_again(fake, tmp_path):
    run_dir = requeued_job(tmp_path, "724")
    start_again(tmp_path, run_dir, "724", restart=1)
    fake.states["724"] = ["RUNNING"]
    fake.extra["724"] = {"restarts": 1, "nodelist": "n2"}
    out = invoke("status", "724", "--no-probe").stdout
    assert "  run:         restart 1 (its files are at the top of the run dir)\n" in out
    assert "ranks:       1/1 up (0 on n2)" in out and "n1" not in out.split("earlier:")[0]
    assert "url:         not live yet" in out and "rank exits:" not in out
    assert "  earlier:     run-0/: restart 0, had been live, rank exits 0 -> 143, launcher ended without reporting" \
        in out


# ------------------------------------------------------------------------------------------ how the launcher ended

@pytest.mark.parametrize("state, exit_code, launch_end, launch, kind, expect", [
    pytest.param("FAILED", "0:9", None, True, "died",
                 "the launcher died without reporting (killed?); Slurm reports FAILED exit 0:9", id="killed"),
    pytest.param("FAILED", "1:0", {"restart": 0, "code": 1, "reason": "rank 0 exited with code 3",
                                   "ended_at": "2026-12-02T10:00:00"}, True, "reported",
                 "the launcher reported: rank 0 exited with code 3 (code 1)", id="reported"),
    pytest.param("CANCELLED", "0:15", None, False, "never started",
                 "the launcher of this run never started; Slurm reports CANCELLED exit 0:15", id="never-started"),
    pytest.param("RUNNING", "0:0", None, True, "running", None, id="running"),
])
def test_status_says_how_the_launcher_ended(fake, tmp_path, state, exit_code, launch_end, launch, kind, expect):
    run_dir = make_job(tmp_path, "730", launch={"engine": "vllm", "restart": 0} if launch else None)
    if launch_end is not None:
        (run_dir / "launch-end.json").write_text(json.dumps(launch_end))
    fake.states["730"] = [state]
    fake.extra["730"] = {"exit_code": exit_code}
    out = invoke("status", "730", "--no-probe").stdout
    data = json.loads(invoke("status", "730", "--json", "--no-probe").stdout)["launcher_end"]
    assert data["launcher"] == kind and data["slurm_state"] == state and data["slurm_exit"] == exit_code
    if expect is None:
        assert "launcher:" not in out
    else:
        assert f"  launcher:    {expect}\n" in out, out


def test_wait_on_a_job_whose_launcher_died_says_so(fake, tmp_path):
    make_job(tmp_path, "731", launch={"engine": "vllm"}, log_lines=VLLM_LOG[:2])
    fake.states["731"] = ["RUNNING", "FAILED"]
    fake.extra["731"] = {"exit_code": "0:9"}
    res = invoke("wait", "731", "--poll", "0.5")
    assert res.exit_code == 1
    assert "  the launcher died without reporting (killed?); Slurm reports FAILED exit 0:9" in res.stderr


def test_a_job_on_its_way_back_to_pending_is_requeued(fake, tmp_path):
    requeued_job(tmp_path, "725")
    fake.states["725"] = ["REQUEUED"]
    fake.extra["725"] = {"restarts": 1}
    res = invoke("wait", "725", "--timeout", "1", "--poll", "0.5", "--progress", "plain")
    assert res.exit_code == 3
    assert "job 725: REQUEUED, requeued (restart 1); waiting for Slurm to start it again" in res.stderr


def test_status_of_a_forgotten_job_whose_launcher_left_no_end_record(fake, tmp_path):
    make_job(tmp_path, "732", launch={"engine": "vllm"})  # Slurm knows nothing of 732 any more
    out = invoke("status", "732").stdout
    assert "  launcher:    the launcher died without reporting (killed?); Slurm no longer lists the job\n" in out


def test_logs_follow_waits_for_the_log_then_follows_it_on_the_fake_clock(fake, tmp_path, clock):
    run_dir = make_job(tmp_path, "505")
    fake.states["505"] = ["RUNNING", "RUNNING", "RUNNING", "RUNNING", "COMPLETED"]

    def grow(job, n):
        if n == 3:
            (run_dir / "server-0.log").write_text(VLLM_LOG[0] + "\n")
        if n == 4:
            with (run_dir / "server-0.log").open("a") as fh:
                fh.write(VLLM_LOG[1])  # the last line without its newline: printed once the job ended

    fake.on_poll = grow
    res = invoke("logs", "505", "--follow", "--json")
    assert res.exit_code == 0, res.output
    assert [json.loads(line)["line"] for line in res.stdout.splitlines()] == VLLM_LOG[:2]
    assert clock.slept and set(clock.slept) <= {0.25, 1.0}  # the watcher's steps, on the fake clock


def test_wait_on_a_restarted_job_ignores_the_previous_runs_endpoint(fake, tmp_path):
    run_dir = requeued_job(tmp_path, "726")
    (run_dir / "rank-0.exit").unlink()  # only endpoint.json and launch.json (restart 0) left at the top
    fake.states["726"] = ["RUNNING"]
    fake.extra["726"] = {"restarts": 1, "nodelist": "n2"}
    res = invoke("wait", "726", "--timeout", "2", "--poll", "0.5", "--json", "--progress", "plain")
    assert res.exit_code == 3, res.output
    data = json.loads(res.stdout)
    assert data["live"] is False and data["endpoint"] is None and data["requeued"] and data["phase"] is None
    assert "job 726: RUNNING on n2, restart 1, waiting for the launcher of the new run" in res.stderr


def test_a_launcher_that_could_not_write_its_end_is_told_from_one_that_died(fake, tmp_path, capsys):
    # the launcher's own writer meets a write the OS refuses (launch-end.json is a folder here: "Is a
    # directory"), says its end in the job output, and status reads it back from there
    from datetime import datetime

    from envlayers.launch.launcher import write_end

    run_dir = make_job(tmp_path, "733", launch={"engine": "vllm", "restart": 0})
    (run_dir / "launch-end.json").mkdir()
    (run_dir / "launch-end.json" / "x").write_text("")
    write_end(run_dir, 0, 143, "live then signal 15")
    said = capsys.readouterr().out
    assert said == (f"ENVLAYERS-ERROR: the launcher ended with code 143 but could not record it in "
                    f"{run_dir}/launch-end.json (Is a directory): live then signal 15\n")
    with (tmp_path / "serve-only-733.out").open("a") as fh:
        fh.write(said)
    # the meter's last record before the disk filled: not final, so counted up to Slurm's end time
    start = datetime.fromisoformat("2026-12-02T09:00:01").timestamp()
    (run_dir / "accounting.json").write_text(json.dumps(
        {"job_start": start, "gpus": 8, "nodes": 1, "live_at": start + 60, "final": False, "ended_at": None,
         "split": {"gpus": 8, "allocated_s": 120.0, "running": True, "allocated_gpu_hours": 0.27,
                   "seconds": {"rank_start": 120.0}, "gpu_hours": {"rank_start": 0.27}}}))
    fake.states["733"] = ["CANCELLED"]
    fake.extra["733"] = {"exit_code": "0:15"}
    data = json.loads(invoke("status", "733", "--json", "--no-probe").stdout)
    end = data["launcher_end"]
    assert end["launcher"] == "unrecorded" and end["code"] == 143 and end["write_error"] == "Is a directory"
    assert end["reason"] == "live then signal 15" and end["path"] == f"{run_dir}/launch-end.json"
    assert data["accounting"]["end_from"] == "slurm" and data["accounting"]["split"]["allocated_s"] == 4 * 3600
    out = invoke("status", "733", "--no-probe").stdout
    assert ("  launcher:    the launcher ended (code 143: live then signal 15) but could not write its records: "
            "Is a directory\n") in out, out
    assert "died without reporting" not in out
    assert "allocated (8 GPUs x 4h" in out and "so far" not in out, out
    assert "(the launcher's final record is missing: counted up to Slurm's end time)" in out


def test_the_launchers_record_writer_says_a_refused_write_once_and_goes_on(tmp_path):
    said = []
    writer = rundir.RecordWriter(said.append)
    blocked = tmp_path / "accounting.json"
    blocked.mkdir()
    (blocked / "x").write_text("")
    assert writer.write(blocked, "{}") is False and writer.write(blocked, "{}") is False
    assert said == [f"ENVLAYERS-WARN: cannot write {blocked}: Is a directory; the job goes on without this record "
                    "(free space there, or point SCRATCH or RUN_ROOT at a writable file system next time)"]
    assert [p.name for p in tmp_path.iterdir()] == ["accounting.json"]  # no temp file left
    (blocked / "x").unlink()
    blocked.rmdir()
    assert writer.write(blocked, "{}") is True and blocked.read_text() == "{}"
    assert len(said) == 1


def test_status_of_a_job_that_could_not_create_its_run_directory_names_it_and_why(fake, tmp_path):
    # the job output is what the real job script's block prints (real bash) for a run folder through a file
    from launchtools import run_dir_block

    (tmp_path / "file").write_text("")
    block = run_dir_block(tmp_path)
    env = {"PATH": os.environ["PATH"], "RUN_ROOT": str(tmp_path / "file" / "runs"), "SLURM_JOB_ID": "734",
           "ENVLAYERS_SERVE_ENV": "X=1\n"}
    said = subprocess.run(["bash", str(block)], capture_output=True, text=True, timeout=10, env=env).stdout
    (tmp_path / "serve-only-734.out").write_text("ENVLAYERS-STAGE: job 734 started on n1 with nodes n1\n" + said)
    fake.states["734"] = ["FAILED"]
    fake.extra["734"] = {"exit_code": "1:0"}
    out = invoke("status", "734", "--no-probe").stdout
    run_dir = tmp_path / "file" / "runs" / "734"
    assert f"  run dir:     {run_dir} (not writable: Not a directory)\n" in out, out
    assert f"  error:       cannot write the run directory {run_dir}: Not a directory (creating it); " in out
    assert "not created yet" not in out
    data = json.loads(invoke("status", "734", "--json", "--no-probe").stdout)
    assert data["launcher"]["run_dir_error"] == {"path": str(run_dir), "error": "Not a directory",
                                                 "doing": "creating it"}
