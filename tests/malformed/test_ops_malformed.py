"""Bad numbers and ranks for the operator commands (wait, stop, logs): one line, exit 2, never a hang.

Every run is bounded by a timeout: ``wait --timeout nan`` used to never return. The numbers are checked
before Slurm is asked anything, so these need no cluster."""

from __future__ import annotations

import pytest

from malformed_tools import assert_clean_error, run_cli

CASES = [
    pytest.param(["wait", "1", "--poll", "nan"], "--poll: 'nan'", id="wait-poll-nan"),
    pytest.param(["wait", "1", "--poll", "inf"], "--poll: 'inf'", id="wait-poll-inf"),
    pytest.param(["wait", "1", "--poll", "-1"], "--poll: '-1'", id="wait-poll-negative"),
    pytest.param(["wait", "1", "--poll", "0"], "more than 0", id="wait-poll-zero"),
    pytest.param(["wait", "1", "--poll", "1e9"], "at most 600", id="wait-poll-huge"),
    pytest.param(["wait", "1", "--poll", "fast"], "--poll: 'fast'", id="wait-poll-word"),
    pytest.param(["wait", "1", "--timeout-s", "nan"], "--timeout-s: 'nan'", id="wait-timeout-nan"),
    pytest.param(["wait", "1", "--timeout-s", "NaN"], "--timeout-s: 'NaN'", id="wait-timeout-nan-capitals"),
    pytest.param(["wait", "1", "--timeout-s", "inf"], "leave --timeout-s out", id="wait-timeout-inf"),
    pytest.param(["wait", "1", "--timeout-s", "-5"], "0 or more", id="wait-timeout-negative"),
    pytest.param(["wait", "1", "--timeout-s", ""], "--timeout-s: ''", id="wait-timeout-empty"),
    pytest.param(["stop", "1", "--timeout-s", "nan"], "--timeout-s: 'nan'", id="stop-timeout-nan"),
    pytest.param(["stop", "1", "--timeout-s", "-inf"], "--timeout-s: '-inf'", id="stop-timeout-minus-inf"),
    # the old spelling still works, and the error names the one spelling the help shows
    pytest.param(["wait", "1", "--timeout", "nan"], "--timeout-s: 'nan'", id="wait-timeout-old-spelling"),
    pytest.param(["logs", "1", "--tail", "-1"], "--tail: '-1'", id="logs-tail-negative"),
    pytest.param(["logs", "1", "--tail", "1.5"], "whole number", id="logs-tail-fraction"),
    pytest.param(["logs", "1", "--rank", "-2"], "a rank is 0 or more", id="logs-rank-negative"),
    pytest.param(["logs", "1", "--rank", "nan"], "--rank: 'nan'", id="logs-rank-word"),
]


@pytest.mark.parametrize("args, needle", CASES)
def test_bad_number_is_one_line_exit_2(args, needle, tmp_path):
    proc = run_cli(*args, cwd=tmp_path, timeout_s=20)
    assert_clean_error(proc, needle)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("env_layers: error: --") and "hint:" in lines[0], proc.stderr
