"""The corpus harness itself: a clean error passes, a crash does not."""

from __future__ import annotations

import pytest

from malformed_tools import assert_clean_error, run_cli


def test_unknown_target_is_a_clean_error(repo_copy):
    proc = run_cli("--root", str(repo_copy), "render", "experiment:no-such-model")
    assert_clean_error(proc, "no-such-model")


def test_harness_rejects_a_traceback():
    fake = type("P", (), {"returncode": 2, "stdout": "", "stderr": "Traceback (most recent call last):\n"})
    with pytest.raises(AssertionError):
        assert_clean_error(fake)
