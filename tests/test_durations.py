"""durations.py: Slurm's timestamps, the operator's span, and the two forms for people (Slurm's durations
themselves are tested with slurm.py's parsers, tests/test_slurm.py)."""

from __future__ import annotations

import re
from datetime import datetime

import pytest
from hypothesis import given, strategies as st

from envlayers import durations, slurm
from srcscan import lines_matching


@pytest.mark.parametrize("text, want", [
    pytest.param("2026-12-02T09:52:00", datetime(2026, 12, 2, 9, 52).timestamp(), id="slurm"),
    pytest.param(" 2026-12-02T09:52:00\n", datetime(2026, 12, 2, 9, 52).timestamp(), id="blanks"),
    pytest.param("2026-11-25", datetime(2026, 11, 25).timestamp(), id="date"),
    pytest.param("Unknown", None, id="unknown"), pytest.param("None", None, id="none"),
    pytest.param("", None, id="empty"), pytest.param(None, None, id="absent"),
    pytest.param("yesterday", None, id="words"), pytest.param("2026-13-01T00:00:00", None, id="month-13"),
])
def test_parse_time(text, want):
    assert durations.parse_time(text) == want


@given(st.integers(min_value=0, max_value=4_000_000_000))
def test_format_time_is_what_parse_time_reads(epoch):
    text = durations.format_time(epoch)
    assert len(text) == 19 and text[10] == "T"
    # local time: an hour that a clock change repeats may read back an hour off, never more
    assert abs(durations.parse_time(text) - epoch) in (0, 3600)


@pytest.mark.parametrize("text, want", [
    ("7d", 7 * 86400), ("12h", 12 * 3600), ("30m", 1800), ("2w", 14 * 86400), ("45s", 45), ("1.5h", 5400),
    (" 7d ", 7 * 86400), ("7", None), ("d", None), ("7 d", None), ("-7d", None), ("7D", None), ("7y", None),
    ("2026-11-25", None),
])
def test_parse_span_reads_its_grammar_only(text, want):
    assert durations.parse_span(text) == want


def test_the_span_grammar_names_every_unit():
    for unit in "smhdw":
        assert f" {unit}" in durations.SPAN_GRAMMAR or f"{unit}," in durations.SPAN_GRAMMAR
        assert durations.parse_span(f"1{unit}") is not None


def test_compact():
    assert [durations.compact(s) for s in (None, 0, -3, 59.6, 75, 3725, 90061)] == \
        ["-", "0s", "0s", "1m00s", "1m15s", "1h02m05s", "25h01m01s"]


def test_slurm_uses_the_one_writer_and_reader():
    assert slurm.format_time_limit is durations.format_time_limit
    assert slurm.parse_duration is durations.parse_duration
    argv = slurm.window_argv("serve-only", datetime(2026, 12, 2, 9, 52).timestamp(), None)
    assert "--starttime=2026-12-02T09:52:00" in argv
    jobs = slurm.parse_window("7|alice|COMPLETED|2026-12-02T09:52:00|Unknown|00:10:00|1|billing=1,gres/gpu=4\n")
    assert jobs[0].start == datetime(2026, 12, 2, 9, 52).timestamp() and jobs[0].end is None


# Slurm's timestamps are read and written here only
_BY_HAND = re.compile(r"fromisoformat\(|%Y-%m-%dT|_SINCE_RE|\[smhdw\]")
_ALLOWED = {"durations.py"}


def test_no_module_reads_slurm_times_by_hand():
    assert lines_matching(_BY_HAND, _ALLOWED, ()) == []


@pytest.mark.parametrize("line", ["then = datetime.fromisoformat(iso)", 'strftime("%Y-%m-%dT%H:%M:%S")',
                                  'SINCE = re.compile(r"^(\\d+)([smhdw])$")'])
def test_the_time_check_sees_a_time_read_by_hand(line):
    assert _BY_HAND.search(line)
