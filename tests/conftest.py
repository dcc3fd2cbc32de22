"""Suite-wide settings and fixtures: a private XDG cache folder, so no test (nor an engine stand-in) reads or
fills the user's ~/.cache; ``clock``, the fake clock the operator commands (ops) read; ``fake``, the fake
Slurm they ask (slurmtools.FakeSlurm), in tmp_path as the working directory with no run root set.

The helpers the tests share live in modules beside this file, never in a test module (docs/testing.md):
clocktools (the fake clock), slurmtools (the fake Slurm), rundirtools (run directories), nettools (ports),
launchtools (the in-job launcher's plan and supervision loop), pooltools (the elastic pool), standintools
(stand-in engines), extratools (skipping for an optional extra), podmantools, sshdtools, realvllm, hubcache,
timing; tests/slurm/labtools and labruns for the lab."""

from __future__ import annotations

import importlib
import os

import pytest

from clocktools import Clock
from slurmtools import FakeSlurm


@pytest.fixture(autouse=True, scope="session")
def _private_cache_home(tmp_path_factory):
    old = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))
    yield
    if old is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = old


@pytest.fixture
def clock(monkeypatch):
    """The fake clock, as the Clock of ops' wait, logs and stop and of the job lookup (envlayers.job)."""
    fc = Clock()
    for module in ("ops.wait", "ops.logs", "ops.stop", "job"):
        monkeypatch.setattr(importlib.import_module(f"envlayers.{module}"), "Clock", fc.watch)
    return fc


@pytest.fixture
def fake(tmp_path, monkeypatch, clock):
    """The fake Slurm as slurm.run, on the fake clock; tmp_path is the working directory; no run root is set."""
    from envlayers import slurm

    fs = FakeSlurm(tmp_path)
    fs.clock = clock
    monkeypatch.setattr(slurm, "run", fs)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SCRATCH", raising=False)
    monkeypatch.delenv("RUN_ROOT", raising=False)
    monkeypatch.delenv("ENVLAYERS_RUN_ROOT", raising=False)
    return fs
