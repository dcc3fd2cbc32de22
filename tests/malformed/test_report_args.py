"""Bad input to `report`: one line, the option named, a hint, exit 2; a broken accounting.json is skipped
and said, never a traceback."""

from __future__ import annotations

import pytest
from malformed_tools import assert_clean_error, run_cli


@pytest.mark.parametrize("args, needles", [
    pytest.param(["--since", "3x"], ["--since", "not a duration or a date", "hint: e.g. --since 7d"], id="since-junk"),
    pytest.param(["--since", ""], ["--since", "not a duration or a date"], id="since-empty"),
    pytest.param(["--idle-stop", "0"], ["--idle-stop", "not a positive number"], id="idle-stop-zero"),
    pytest.param(["--idle-stop", "nan"], ["--idle-stop", "not a positive number"], id="idle-stop-nan"),
])
def test_bad_report_options(tmp_path, args, needles):
    assert_clean_error(run_cli("report", "--no-sacct", "--run-root", str(tmp_path), *args), *needles)


@pytest.mark.parametrize("content", [
    pytest.param('{"job_start": "yesterday", "gpus": 8}', id="start-not-a-number"),
    pytest.param('{"job_start": 1, "gpus": "eight"}', id="gpus-not-a-number"),
    pytest.param('{"job_start": 1, "phases": [1, 2]}', id="phases-not-a-map"),
    pytest.param("[" * 100_000, id="nested-100000-deep"),
    pytest.param('{"job_id": "12", "gpus": 8, "job_start": 17', id="truncated"),
    pytest.param("[1,2,3]", id="a-list"),
    pytest.param(bytes(range(256)) * 8, id="random-bytes"),
    pytest.param('{"job_start": NaN, "gpus": 8, "ended_at": 100}', id="start-nan"),
    pytest.param('{"job_start": 1, "gpus": -4, "ended_at": 3601}', id="gpus-negative"),
    pytest.param('{"job_start": 1, "gpus": 8, "ended_at": Infinity}', id="end-infinite"),
    pytest.param("fifo", id="a-fifo"),
])
def test_a_broken_accounting_json_is_skipped_and_said(tmp_path, content):
    """One bad file among good ones: the good run is reported, the bad one named with its reason, no total
    is nan or infinite, and the JSON report is strict JSON."""
    import json
    import os
    import re

    good = {"job_id": "11", "gpus": 8, "nodes": 1, "served": "m", "job_start": 1000.0, "ended_at": 4600.0}
    (tmp_path / "11").mkdir()
    (tmp_path / "11" / "accounting.json").write_text(json.dumps(good))
    (tmp_path / "12").mkdir()
    bad = tmp_path / "12" / "accounting.json"
    if content == "fifo":
        os.mkfifo(bad)  # a reader would wait for ever for a writer
    elif isinstance(content, bytes):
        bad.write_bytes(content)
    else:
        bad.write_text(content)
    proc = run_cli("report", "--no-sacct", "--since", "36500d", "--run-root", str(tmp_path))
    assert proc.returncode == 0 and "Traceback" not in proc.stderr and proc.stderr == "", proc.stderr
    assert f"skipped {bad}: not an accounting record (" in proc.stdout
    assert "1 job run(s) with an accounting record" in proc.stdout and "m: 1 run(s), 8.00 GPU-hours" in proc.stdout
    totals = "\n".join(ln for ln in proc.stdout.splitlines() if not ln.startswith("  skipped "))
    assert not re.search(r"\b(nan|inf)\b", totals, re.I), proc.stdout
    data = json.loads(run_cli("report", "--no-sacct", "--since", "36500d", "--run-root", str(tmp_path), "--json").stdout,
                      parse_constant=lambda c: pytest.fail(f"{c} in the JSON report"))
    assert [j["job_id"] for j in data["jobs"]] == ["11"] and len(data["skipped"]) == 1
