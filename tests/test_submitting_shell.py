"""The submitting shell: what a command line sets reaches the job only when it is an option of the
submission; a launch key no layer sets, and an SBATCH_* the job's command line overrides, get one word."""

from __future__ import annotations

import os
from pathlib import Path

from envlayers.jobscript import prepare

REPO = Path(__file__).resolve().parents[1]


def test_the_submitting_shell_rule(tmp_path):
    """Launch keys from the shell that no layer sets are dropped with a word; CHECK_WEIGHTS is the
    submission's own; SBATCH_* the command line overrides get a word naming the key that works."""
    environ = {"HOME": str(tmp_path), "PATH": os.environ["PATH"], "IDLE_STOP_AFTER_S": "1800",
               "SBATCH_PARTITION": "debug", "SBATCH_TIMELIMIT": "1:00:00", "SBATCH_ACCOUNT": "proj",
               "SERVER_API_KEY": "a-client-key"}  # a client's key: not a setting the job misses
    job = prepare(REPO, "qwen38", python="/usr/bin/python3", environ=environ)
    said = [w for w in job.warnings if "submitting shell" in w]
    assert len(said) == 3, job.warnings
    assert said[0].startswith("IDLE_STOP_AFTER_S from the submitting shell does not reach the job")
    assert "put IDLE_STOP_AFTER_S=<value> in a SERVE_ENV_FILE layer" in said[0] and "1800" not in said[0]
    assert said[1].startswith("SBATCH_PARTITION from the submitting shell is overridden by the job's "
                              "--partition=mi300: set SLURM_PARTITION in a SERVE_ENV_FILE layer instead "
                              "(experiments/sites/mi300a.env:")
    assert said[2].startswith("SBATCH_TIMELIMIT from the submitting shell is overridden by the job's --time=")
    # the weights refusal's own hint works from the shell: an empty cache on SCRATCH refuses, CHECK_WEIGHTS=0 not
    environ["SCRATCH"] = str(tmp_path / "scratch")
    job = prepare(REPO, "qwen38", python="/usr/bin/python3", environ=environ)
    assert any("or set CHECK_WEIGHTS=0 when they come another way" in b for b in job.blockers), job.blockers
    job = prepare(REPO, "qwen38", python="/usr/bin/python3", environ={**environ, "CHECK_WEIGHTS": "0"})
    assert not any("CHECK_WEIGHTS" in line for line in job.blockers + job.warnings), job.blockers + job.warnings
