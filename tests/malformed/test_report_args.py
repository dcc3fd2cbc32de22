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
])
def test_a_broken_accounting_json_is_skipped_and_said(tmp_path, content):
    (tmp_path / "12").mkdir()
    (tmp_path / "12" / "accounting.json").write_text(content)
    proc = run_cli("report", "--no-sacct", "--since", "36500d", "--run-root", str(tmp_path))
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert f"skipped {tmp_path / '12' / 'accounting.json'}: not an accounting record" in proc.stdout
