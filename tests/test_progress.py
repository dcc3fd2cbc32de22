"""wait's progress never skips (every phase in order, every rank followed, the pending reason and Slurm's
expected start), on the fake Slurm and the fake clock (``fake`` and ``clock`` from conftest.py); and the one
job-id parser."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import pytest

import slurmtools
from envlayers import jobid
from envlayers.ops.progress import RunPhases, serving_ranks
from envlayers.rundir import JobFiles
from rundirtools import VLLM_LOG, endpoint_data, invoke, make_job

SGLANG_RANK = [  # what every rank of an SGLang pipeline prints; only rank 0 gets "fired up"
    "[2026-12-02 10:00:01 PP{r} TP0] Load weight begin. avail mem=116.20 GB",
    "[2026-12-02 10:00:09 PP{r} TP0] Load weight end. elapsed=1.6 s, avail mem=83.20 GB, mem usage=33.00 GB.",
    "[2026-12-02 10:00:12 PP{r} TP0] KV Cache is allocated. #tokens: 847311, K size: 40.2 GB",
    "[2026-12-02 10:00:13 PP{r} TP0] Capture cuda graph begin. This can take up to several minutes.",
]
FIRED_UP = "[2026-12-02 10:00:20] The server is fired up and ready to roll!"


def plain_lines(stderr: str) -> list[str]:
    return [line.split("] ", 1)[1].rsplit(" [", 1)[0] for line in stderr.splitlines() if line.startswith("[")]


def test_everything_reached_between_two_looks_is_shown_in_order_then_live(fake, tmp_path):
    """The launcher's 'all 1 ranks started', every phase and the end, all written before wait's first look."""
    run_dir = make_job(tmp_path, "120", out_lines=["ENVLAYERS-STAGE: rank 0 up on n1",
                                                   "ENVLAYERS-STAGE: all 1 ranks started"], log_lines=VLLM_LOG)
    (run_dir / "endpoint.json").write_text(json.dumps(endpoint_data("120", run_dir)))
    fake.states["120"] = ["RUNNING"]
    res = invoke("wait", "120", "--poll", "0.05", "--progress", "plain")
    assert res.exit_code == 0, res.output
    seen = [line.split(", ", 1)[1] for line in plain_lines(res.stderr)]
    assert seen == [
        "all 1 ranks started, waiting for the server log",
        "phase: loading weights (model=Qwen/Qwen3-8B)",
        "phase: weights loaded (mem_usage_gib=15.27, elapsed_s=7.9)",
        "phase: KV cache allocated (kv_cache_gib=24, tokens=344669)",
        "phase: capturing graphs",
        "phase: ready",
        "endpoint live, phase: ready",
    ]


@pytest.mark.parametrize("shape, ranks, ready_line", [
    pytest.param("pipeline", 4, "phase: ready", id="pipeline-ready-is-rank-0s"),
    pytest.param("replicas", 3, "phase: ready 3/3 ranks", id="replicas-every-rank-serves"),
])
def test_every_rank_is_followed(fake, tmp_path, shape, ranks, ready_line):
    """One more log line per Slurm poll, rank by rank: each rank reaching a phase is a line of its own."""
    run_dir = make_job(tmp_path, "121", out_lines=[f"ENVLAYERS-TOPOLOGY: shape={shape} nodes={ranks}",
                                                   *[f"ENVLAYERS-STAGE: rank {r} up on n{r}" for r in range(ranks)],
                                                   f"ENVLAYERS-STAGE: all {ranks} ranks started"],
                       launch={"shape": shape, "nodes": [f"n{r}" for r in range(ranks)]})
    script = [(r, line.format(r=r)) for line in SGLANG_RANK for r in range(ranks)]
    script += [(r, FIRED_UP) for r in (range(ranks) if shape == "replicas" else [0])]
    fake.states["121"] = ["RUNNING"]

    def grow(job, n):
        if n - 1 < len(script):
            rank, line = script[n - 1]
            with (run_dir / f"server-{rank}.log").open("a") as fh:
                fh.write(line + "\n")
        elif n - 1 == len(script):
            (run_dir / "endpoint.json").write_text(json.dumps(endpoint_data("121", run_dir)))

    fake.on_poll = grow
    res = invoke("wait", "121", "--poll", "0.05", "--progress", "plain")
    assert res.exit_code == 0, res.output
    seen = [line.split(", ", 1)[1] for line in plain_lines(res.stderr) if ", phase: " in line or "live" in line]
    expect = [f"phase: {label} {k}/{ranks} ranks" for label in
              ("loading weights", "weights loaded", "KV cache allocated", "capturing graphs") for k in range(1, ranks + 1)]
    if shape == "replicas":
        expect += [f"phase: ready {k}/{ranks} ranks" for k in range(1, ranks + 1)]
    else:
        expect += ["phase: ready"]
    expect += [f"endpoint live, {ready_line}"]
    assert seen == expect


def test_a_phase_passed_between_looks_on_one_rank_of_many_is_still_shown(tmp_path):
    """Rank 1 jumps from nothing to KV cache in one look: 'weights loaded' is still its own step, first."""
    run = tmp_path / "run"
    run.mkdir()
    files = JobFiles("1", None, run)
    phases = RunPhases(files)
    (run / "server-0.log").write_text(SGLANG_RANK[0].format(r=0) + "\n")
    (run / "server-1.log").write_text("")
    phases.read()
    assert [s.text() for s in phases.steps(2)] == ["loading weights 1/2 ranks"]
    (run / "server-1.log").write_text("\n".join(line.format(r=1) for line in SGLANG_RANK[:3]) + "\n")
    phases.read()
    assert [s.text() for s in phases.steps(2)] == ["weights loaded 1/2 ranks", "KV cache allocated 1/2 ranks"]
    assert phases.steps(2) == []  # nothing new: nothing shown twice


@pytest.mark.parametrize("shape, total, expect", [
    pytest.param("replicas", 3, {0, 1, 2}, id="replicas"),
    pytest.param("pipeline", 4, {0}, id="pipeline"),
    pytest.param("single", 1, {0}, id="single"),
    pytest.param(None, 2, None, id="unknown"),
])
def test_serving_ranks(shape, total, expect):
    assert serving_ranks(shape, total) == expect


def with_start(monkeypatch, start: str) -> None:
    real = slurmtools.scontrol_line

    def line(*args, **kw):
        return real(*args, **kw).replace("StartTime=2026-12-02T09:00:01", f"StartTime={start}")

    monkeypatch.setattr(slurmtools, "scontrol_line", line)


@pytest.mark.parametrize("start, shown", [
    pytest.param("in-1h", True, id="expected-start-ahead"),
    pytest.param("Unknown", False, id="no-estimate"),
    pytest.param("2020-01-01T00:00:00", False, id="estimate-in-the-past"),
])
def test_pending_shows_slurms_reason_and_expected_start(fake, tmp_path, monkeypatch, start, shown):
    when = (datetime.now() + timedelta(hours=1)).replace(microsecond=0).isoformat() if start == "in-1h" else start
    with_start(monkeypatch, when)
    fake.states["130"] = ["PENDING"]
    fake.extra["130"] = {"reason": "Priority"}
    res = invoke("wait", "130", "--timeout", "0", "--progress", "plain")
    assert res.exit_code == 3
    line = plain_lines(res.stderr)[0]
    if shown:
        assert line.startswith(f"job 130: PENDING (Priority), expected start {when} (in ")
        assert f"expected start {when}" in invoke("status", "130").stdout
        assert json.loads(invoke("wait", "130", "--timeout", "0", "--json").stdout)["expected_start"] == when
    else:
        assert line == "job 130: PENDING (Priority)"


# ------------------------------------------------------------------------------------------ job ids

@pytest.mark.parametrize("text, expect", [
    pytest.param("1234", "1234", id="plain"),
    pytest.param(" 1234\n", "1234", id="blanks"),
    pytest.param("1234.0", "1234", id="step"),
    pytest.param("1234.batch", "1234", id="batch-step"),
    pytest.param("1234.extern", "1234", id="extern-step"),
])
def test_job_id_forms_accepted(text, expect):
    assert jobid.parse_job_id(text) == expect


@pytest.mark.parametrize("text, message", [
    pytest.param("1234_5", "is an array task id", id="array"),
    pytest.param("12a", "is not a Slurm job id", id="word"),
    pytest.param("-1", "is not a Slurm job id", id="negative"),
    pytest.param("1234.", "is not a Slurm job id", id="dangling-dot"),
    pytest.param("", "is not a Slurm job id", id="empty"),
])
def test_job_id_forms_refused(text, message):
    with pytest.raises(jobid.EnvLayersError) as err:
        jobid.parse_job_id(text)
    assert message in str(err.value) and "hint:" in str(err.value) and str(err.value).startswith("JOBID: ")


COMMANDS = [
    pytest.param(["wait"], id="wait"), pytest.param(["status"], id="status"), pytest.param(["logs"], id="logs"),
    pytest.param(["stop"], id="stop"), pytest.param(["verify"], id="verify"), pytest.param(["diagnose"], id="diagnose"),
    pytest.param(["connect"], id="connect"), pytest.param(["ping"], id="ping"), pytest.param(["release"], id="release"),
    pytest.param(["tunnel", "--to", "u@gw", "--remote-port", "9000"], id="tunnel"),
]


@pytest.mark.parametrize("cmd", COMMANDS)
@pytest.mark.parametrize("form, message", [
    pytest.param("999", "no job 999: Slurm does not know it and there is no serve-only-999.out here", id="unknown"),
    pytest.param("999.0", "no job 999: Slurm does not know it and there is no serve-only-999.out here",
                 id="unknown-step"),
    pytest.param("999_1", "JOBID: '999_1' is an array task id", id="array"),
])
def test_every_command_says_the_same_for_a_job_it_cannot_find(fake, cmd, form, message):
    res = invoke(*cmd, form)
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "hint:" in lines[0], lines


@pytest.mark.parametrize("cmd", [c for c in COMMANDS if c.id in ("wait", "status", "logs", "stop")])
def test_every_job_command_takes_a_step_id_for_its_job(fake, tmp_path, cmd):
    make_job(tmp_path, "140", log_lines=VLLM_LOG, out_lines=["ENVLAYERS-STAGE: rank 0 up on n1"])
    fake.states["140"] = ["COMPLETED"]
    res = invoke(*cmd, "140.batch", "--json")
    assert res.exit_code in (0, 1), res.output
    assert json.loads(res.stdout)["job_id"] == "140"


# ------------------------------------------------------------------------------------------ one vocabulary

@pytest.mark.parametrize("files", [
    pytest.param("endpoint", id="live-endpoint-json"),
    pytest.param("launch", id="never-live-launch-json"),
    pytest.param("serve-env", id="old-launch-json-without-model-serve-env"),
])
def test_a_job_names_its_target_model_id_and_served_name_the_same_way_live_or_failed(fake, tmp_path, files):
    launch = {"target": "experiment:glm53", "engine": "sglang", "served_model_name": "hpcagent-bench-vllm",
              "shape": "pipeline", "nodes": ["n1"]}
    if files != "serve-env":
        launch["model"] = "zai-org/GLM-5.3"
    run_dir = make_job(tmp_path, "150", launch=launch, log_lines=["[2026-12-02 10:00:01 TP0] Load weight begin."])
    (run_dir / "serve.env").write_text("export INFERENCE_MODEL='zai-org/GLM-5.3'\n"
                                       "export VLLM_SERVED_MODEL='hpcagent-bench-vllm'\n")
    if files == "endpoint":
        data = endpoint_data("150", run_dir)
        data.update(model="zai-org/GLM-5.3", engine="sglang")
        (run_dir / "endpoint.json").write_text(json.dumps(data))
    fake.states["150"] = ["RUNNING" if files == "endpoint" else "FAILED"]
    record = json.loads(invoke("status", "150", "--json", "--no-probe").stdout)
    assert (record["target"], record["model_id"], record["served_name"]) == (
        "experiment:glm53", "zai-org/GLM-5.3", "hpcagent-bench-vllm")
    text = invoke("status", "150", "--no-probe").stdout
    assert "  target:      experiment:glm53\n  model id:    zai-org/GLM-5.3 (sglang)\n" \
           "  served name: hpcagent-bench-vllm\n" in text
    waited = json.loads(invoke("wait", "150", "--timeout", "0", "--json").stdout)
    assert {k: waited[k] for k in ("target", "model_id", "served_name")} == {
        k: record[k] for k in ("target", "model_id", "served_name")}


def test_a_terminal_gets_one_live_line_a_pipe_one_line_per_change(fake, tmp_path):
    run_dir = make_job(tmp_path, "160", out_lines=["ENVLAYERS-STAGE: rank 0 up on n1",
                                                   "ENVLAYERS-STAGE: all 1 ranks started"], log_lines=VLLM_LOG)
    (run_dir / "endpoint.json").write_text(json.dumps(endpoint_data("160", run_dir)))
    fake.states["160"] = ["RUNNING"]
    tty = invoke("wait", "160", "--poll", "0.05", "--progress", "tty").stderr
    plain = invoke("wait", "160", "--poll", "0.05", "--progress", "plain").stderr
    assert tty.count("\n") == 1 and tty.endswith("\n")  # one line, rewritten in place, ended once
    assert tty.count("\r\x1b[K") == len(plain.splitlines()) == 7  # each change drawn over the last
    assert tty.rstrip("\n").rsplit("\r\x1b[K", 1)[1].startswith("job 160: RUNNING on n1, endpoint live")
