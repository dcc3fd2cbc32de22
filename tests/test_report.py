"""`report` without a cluster: run directories in tmp_path and sacct output recorded from the accounting lab
(`cluster/slurm-lab --accounting`; jobs 1000 and 1001 are verbatim, 1002 and 1003 follow the same format
for a running and a cancelled job of other users)."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
from extratools import needs_extra

from envlayers.ops.report import build_report, parse_since
from envlayers.slurm import parse_window
from slurmtools import answering as fake_sacct

SACCT = (Path(__file__).parent / "data" / "report" / "sacct-accounting-lab.txt").read_text()
NOW = datetime.fromisoformat("2026-12-02T19:00:00").timestamp()


def record(root: Path, job_id: str, start: float, *, model="glm53", gpus=8, end_after=3600.0, last=600.0,
           serving=300.0) -> Path:
    d = root / job_id
    d.mkdir(parents=True)
    tl = {"job_id": job_id, "gpus": gpus, "nodes": 2, "shape": "pipeline", "served": model, "job_start": start,
          "ranks_up_at": start + 10, "phases": {"loading": start + 20, "weights-loaded": start + 80},
          "live_at": start + 100, "last_request_at": start + last,
          "live": {"serving_s": serving, "counters_readable": True}, "ended_at": start + end_after,
          "idle_stop_after_s": None, "died_at": None}
    (d / "accounting.json").write_text(json.dumps(tl))
    return d


def test_parse_sacct_recorded_output():
    jobs = {j.job_id: j for j in parse_window(SACCT)}
    assert (jobs["1001"].gpus, jobs["1001"].elapsed_s, jobs["1001"].state) == (4, 2, "COMPLETED")
    assert jobs["1000"].gpus is None  # no gres/gpu in AllocTRES: the lab before AccountingStorageTRES=gres/gpu
    assert jobs["1002"].end is None and jobs["1002"].nodes == 2 and jobs["1003"].state == "CANCELLED"


def test_report_joins_run_dirs_and_sacct(tmp_path):
    start = datetime.fromisoformat("2026-12-02T18:27:11").timestamp()
    record(tmp_path, "1001", start)
    run = fake_sacct(SACCT)
    rep = build_report([tmp_path], NOW - 86400, None, now=NOW, run=run, suggest_stop_s=600)
    assert run.argvs[0][:4] == ["sacct", "-X", "-P", "-n"] and "--name=serve-only" in run.argvs[0]
    assert "--allusers" in run.argvs[0]
    assert rep.slurm_accounting == "sacct"
    assert [(j["job_id"], j["slurm_state"], j["user"]) for j in rep.jobs] == [("1001", "COMPLETED", "root")]
    missing = {m["job_id"]: m for m in rep.missing}
    assert sorted(missing) == ["1000", "1002", "1003"]
    assert missing["1000"]["gpu_hours"] is None and missing["1003"]["gpu_hours"] == pytest.approx(4 * 60 / 3600, abs=1e-4)
    g = rep.by_model[0]
    assert g["model"] == "glm53" and g["allocated_gpu_hours"] == pytest.approx(8.0)
    assert g["gpu_hours"]["idle_after_last_request"] == pytest.approx(8 * 3000 / 3600, abs=1e-3)
    assert rep.largest_waste.startswith("glm53: 83% of 8.00 GPU-hours idle after the last request; "
                                        "IDLE_STOP_AFTER_S=600 would have saved 5.33 GPU-hours")


@pytest.mark.parametrize("user, want", [pytest.param("alice", [], id="other-user"),
                                        pytest.param("root", ["1001"], id="owner")])
def test_report_user_filter(tmp_path, user, want):
    record(tmp_path, "1001", NOW - 7200)
    run = fake_sacct(SACCT)
    rep = build_report([tmp_path], NOW - 86400, user, now=NOW, run=run)
    assert [j["job_id"] for j in rep.jobs] == want
    assert f"--user={user}" in run.argvs[0] and "--allusers" not in run.argvs[0]


def test_report_without_slurm_accounting_says_why(tmp_path):
    record(tmp_path, "7", NOW - 7200)
    record(tmp_path, "8", NOW - 30 * 86400)  # outside the window
    rep = build_report([tmp_path], NOW - 86400, None, now=NOW,
                       run=fake_sacct("", 1, "sacct: error: Slurm accounting storage is disabled\n"))
    assert rep.slurm_accounting == "sacct: error: Slurm accounting storage is disabled"
    assert [j["job_id"] for j in rep.jobs] == ["7"] and rep.missing == []


@pytest.mark.parametrize("text, want", [
    pytest.param("7d", NOW - 7 * 86400, id="days"), pytest.param("12h", NOW - 12 * 3600, id="hours"),
    pytest.param("2026-12-01", datetime.fromisoformat("2026-12-01").timestamp(), id="date"),
])
def test_parse_since(text, want):
    assert parse_since(text, NOW) == want


def _report(tmp_path, *extra: str) -> subprocess.CompletedProcess:
    root = tmp_path / "runs"
    if not root.exists():
        record(root, "5", NOW - 7200)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    return subprocess.run([sys.executable, "-m", "envlayers", "report", "--since", "3650d", "--run-root", str(root),
                           "--no-sacct", *extra], capture_output=True, text=True, env=env, timeout=60)


def test_cli_report_text_and_json(tmp_path):
    proc = _report(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Slurm accounting not available (not asked: --no-sacct)" in proc.stdout
    assert "glm53: 1 run(s), 8.00 GPU-hours allocated" in proc.stdout
    data = json.loads(_report(tmp_path, "--json").stdout)
    assert [j["job_id"] for j in data["jobs"]] == ["5"] and data["slurm_accounting"] == "not asked: --no-sacct"


def test_cli_report_chart(tmp_path):
    needs_extra("matplotlib", "report")
    chart = tmp_path / "split.png"
    proc = _report(tmp_path, "--chart", str(chart))
    assert proc.returncode == 0, proc.stderr
    assert f"chart: {chart}" in proc.stdout and chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


BAD_RECORDS = {
    "deep": ("[" * 100_000, "not JSON: nested too deep"),
    "truncated": ('{"job_id": "9", "gpus": 8, "job_st', "not JSON: "),
    "list": ("[1,2,3]", "a JSON list, not an object"),
    "random": (bytes(range(256)) * 4, "not JSON: not UTF-8"),
    "nan": (None, "job_start is nan, not a time in seconds"),
    "negative-gpus": (None, "gpus is -4, not a whole number from 0 to 1000000"),
}


def test_every_bad_record_is_skipped_by_name_and_the_totals_stay_finite(tmp_path):
    """Ten good runs and one of every bad kind: ten runs reported, each bad file named under skipped with its
    reason, every total finite (a NaN start gave 'nan GPU-hours', gpus -4 gave '-inf', '['*100000 an internal
    error, a truncated file, [1,2,3] and random bytes silently dropped a run)."""
    import math

    for i in range(10):
        record(tmp_path, str(100 + i), NOW - 7200)
    for name, (content, _) in BAD_RECORDS.items():
        d = record(tmp_path, name, NOW - 7200)
        f = d / "accounting.json"
        if name == "nan":
            f.write_text(f.read_text().replace(f'"job_start": {NOW - 7200}', '"job_start": NaN'))
        elif name == "negative-gpus":
            f.write_text(f.read_text().replace('"gpus": 8', '"gpus": -4'))
        elif isinstance(content, bytes):
            f.write_bytes(content)
        else:
            f.write_text(content)
    rep = build_report([tmp_path], NOW - 86400, None, now=NOW, use_sacct=False)
    assert sorted(j["job_id"] for j in rep.jobs) == [str(100 + i) for i in range(10)]
    assert len(rep.skipped) == len(BAD_RECORDS)
    for name, (_, why) in BAD_RECORDS.items():
        line = next(s for s in rep.skipped if s.startswith(f"{tmp_path / name / 'accounting.json'}: "))
        assert f"not an accounting record ({why}" in line, line
    for g in rep.by_model + rep.by_shape:
        assert all(math.isfinite(v) for v in [g["allocated_gpu_hours"], *g["gpu_hours"].values(),
                                               *g["share"].values(), g["idle_stop_would_save"]])
    assert rep.by_model[0]["allocated_gpu_hours"] == pytest.approx(10 * 8 * 3600 / 3600)
    json.dumps(rep.to_dict(), allow_nan=False)  # strict JSON: no NaN, no Infinity


def test_report_groups_by_site_when_the_runs_name_theirs(tmp_path):
    start = datetime.fromisoformat("2026-12-02T18:27:11").timestamp()
    for job, site in (("1001", "mi300a"), ("1002", "h100"), ("1003", "h100")):
        d = record(tmp_path, job, start)
        (d / "launch.json").write_text(json.dumps({"job_id": job, "target": "experiment:glm53", "site": site}))
    rep = build_report([tmp_path], NOW - 86400, None, now=NOW, use_sacct=False)
    assert [(g["site"], g["jobs"]) for g in rep.by_site] == [("h100", 2), ("mi300a", 1)]
    assert {j["job_id"]: j["site"] for j in rep.jobs} == {"1001": "mi300a", "1002": "h100", "1003": "h100"}
    bare = tmp_path / "bare"
    record(bare, "1004", start)  # no launch.json site: no site grouping at all
    assert build_report([bare], NOW - 86400, None, now=NOW, use_sacct=False).by_site == []


def test_by_model_names_the_catalog_model_not_the_served_name_every_model_shares(tmp_path):
    start = datetime.fromisoformat("2026-12-02T18:27:11").timestamp()
    for job, target in (("1001", "experiment:glm53"), ("1002", "experiment:qwen38"), ("1003", "replicas:qwen38")):
        d = record(tmp_path, job, start, model="hpcagent-bench-vllm")  # the one served name of the catalog
        (d / "launch.json").write_text(json.dumps({"job_id": job, "target": target, "model": "x/y"}))
    d = record(tmp_path, "1004", start, model="hpcagent-bench-vllm")
    (d / "launch.json").write_text(json.dumps({"job_id": "1004", "model": "org/own-model"}))  # no target
    rep = build_report([tmp_path], NOW - 86400, None, now=NOW, use_sacct=False)
    assert sorted((g["model"], g["jobs"]) for g in rep.by_model) == [("glm53", 1), ("org/own-model", 1), ("qwen38", 2)]


def test_a_serve_base_env_run_is_grouped_by_the_model_it_loaded(tmp_path):
    start = datetime.fromisoformat("2026-12-02T18:27:11").timestamp()
    d = record(tmp_path, "1005", start, model="hpcagent-bench-vllm")
    (d / "launch.json").write_text(json.dumps({"job_id": "1005", "target": "base-env:mine.env", "model": "org/m"}))
    rep = build_report([tmp_path], NOW - 86400, None, now=NOW, use_sacct=False)
    assert [g["model"] for g in rep.by_model] == ["org/m"]
