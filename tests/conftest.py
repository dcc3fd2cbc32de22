"""Suite-wide settings: a private XDG cache folder, so no test (nor an engine stand-in) reads or fills the
user's ~/.cache."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True, scope="session")
def _private_cache_home(tmp_path_factory):
    old = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))
    yield
    if old is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = old
