"""SERVE_TIME against the real local Slurm lab: a time limit longer than the partition's MaxTime (as
``scontrol show partition`` reports it) is refused before anything is submitted, naming that MaxTime;
one within it is submitted as before.

The lab's partitions have no MaxTime (``MaxTime=INFINITE``, so every other test's ``--time`` fits); this
test gives mi300 one with ``scontrol update`` and puts the partition's own value back afterwards, also when
the test fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys

import pytest
from labtools import parse_scontrol_oneliner

from labruns import BIN, REPO, SBATCH, STANDIN, lab_ack

pytestmark = pytest.mark.slurm


@contextlib.contextmanager
def partition_max_time(lab, partition: str, max_time: str):
    line = lab.run(["scontrol", "show", "partition", "-o", partition]).stdout
    before = parse_scontrol_oneliner(line)["MaxTime"]
    lab.run(["scontrol", "update", f"PartitionName={partition}", f"MaxTime={max_time}"])
    try:
        yield
    finally:
        lab.run(["scontrol", "update", f"PartitionName={partition}", f"MaxTime={before}"])
        after = parse_scontrol_oneliner(lab.run(["scontrol", "show", "partition", "-o", partition]).stdout)
        assert after["MaxTime"] == before


def queued(lab) -> set[str]:
    return set(lab.run(["squeue", "-h", "-o", "%i"]).stdout.split())


def test_a_time_limit_past_the_partitions_maxtime_is_refused_before_submission(slurm_lab, tmp_path):
    with partition_max_time(slurm_lab, "mi300", "1-00:00:00"):
        env = _submission_env(slurm_lab, tmp_path, SERVE_TIME="2-00:00:00")
        before = queued(slurm_lab)
        refused = subprocess.run([str(SBATCH), "--json"], cwd=tmp_path, env=env, capture_output=True, text=True,
                                 timeout=120)
        assert queued(slurm_lab) == before  # nothing was submitted
        assert refused.returncode == 2, (refused.stdout, refused.stderr)
        lines = refused.stderr.strip().splitlines()
        assert len(lines) == 1, refused.stderr
        assert lines[0].startswith("env_layers: error: SERVE_TIME: time limit 2-00:00:00 is longer than "
                                   "partition mi300's MaxTime, 1-00:00:00;"), lines[0]
        assert "hint: ask for at most SERVE_TIME=1-00:00:00" in lines[0]

        # within the MaxTime: submitted as before (and cancelled after the test by the lab fixture)
        env["SERVE_TIME"] = "1-00:00:00"
        took = subprocess.run([str(SBATCH), "--json"], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=120)
        assert took.returncode == 0, took.stderr
        job_id = json.loads(took.stdout)["job_id"]
        slurm_lab.track(job_id)
        assert slurm_lab.job_info(job_id)["TimeLimit"] == "1-00:00:00"


def _submission_env(lab, tmp_path, **env: str) -> dict[str, str]:
    """What test_ops_e2e.Job submits with (the stand-in engine, the submit directory), plus ``env``."""
    (tmp_path / "mine.env").write_text("CONTAINER_RUNTIME=none\n" + lab_ack(""))
    full = {**os.environ, **lab.env, "SCRATCH": str(tmp_path / "scratch"), "MODEL": "qwen38",
            "SERVE_ENV_FILE": str(tmp_path / "mine.env"), "STANDIN_LOAD_SECONDS": "1",
            "PATH": f"{STANDIN / 'bin'}:{BIN}:{lab.env.get('PATH', os.environ['PATH'])}",
            "PYTHON": sys.executable,
            "PYTHONPATH": os.pathsep.join([str(STANDIN / "pypath"), str(REPO / "src")]), **env}
    for key in ("ENVLAYERS_ROOT", "RUN_ROOT", "ENVLAYERS_RUN_ROOT", "SBATCH_PARTITION"):
        full.pop(key, None)
    return full
