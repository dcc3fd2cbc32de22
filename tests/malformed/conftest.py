"""The malformed-input corpus: bad input of every kind gets a clear one-line error, never a crash.

Each ``test_<area>.py`` here feeds one area's bad inputs to the real command line (a subprocess, as a
user would run it) through :func:`run_cli` and checks the outcome with :func:`assert_clean_error`:
exit 2, no traceback, no "internal error" (exit 70), and a first line that names where and what.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from malformed_tools import REPO


@pytest.fixture
def repo_copy(tmp_path: Path) -> Path:
    """A throw-away copy of the catalog (experiments/, containers/) to break on purpose."""
    import shutil

    for part in ("experiments", "containers"):
        shutil.copytree(REPO / part, tmp_path / part)
    return tmp_path
