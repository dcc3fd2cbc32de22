"""The job script's own checks on the real local Slurm cluster: an unbound reference ends the job with
an ENVLAYERS-ERROR before srun, and hostile values reach the job byte-exact without running."""

from __future__ import annotations

import pytest

from envlayers.shell import single_quote
from labruns import KEYLESS, REPO, STANDIN, Run

pytestmark = pytest.mark.slurm
# this checkout's envlayers, not whichever the console script was installed from
PYTHONPATH = f"{REPO / 'src'}:{STANDIN / 'pypath'}"


def test_unbound_reference_ends_the_job_with_an_envlayers_error_before_srun(slurm_lab, tmp_path):
    run = Run(slurm_lab, tmp_path, layer="HF_HOME=$ENVLAYERS_E2E_NOT_SET/hf\n" + KEYLESS, PYTHONPATH=PYTHONPATH)
    run.env.pop("ENVLAYERS_E2E_NOT_SET", None)
    dry = run.sbatch(submit=False).stdout
    assert "# warning: HF_HOME (" in dry and "references $ENVLAYERS_E2E_NOT_SET, which is not set here" in dry
    run.submit()
    assert run.state(timeout_s=60) == "FAILED"
    text = run.out.read_text()
    assert (f"ENVLAYERS-ERROR: HF_HOME ({tmp_path / 'mine.env'}:2) references $ENVLAYERS_E2E_NOT_SET, which is "
            "not set in the job; fix: export ENVLAYERS_E2E_NOT_SET") in text
    assert "unbound variable" not in text
    assert not (tmp_path / "engines.jsonl").exists()  # nothing was started


def test_hostile_values_reach_the_job_byte_exact_and_run_nothing(slurm_lab, tmp_path):
    canary = tmp_path / "canary"
    value = f"$(touch {canary})`touch {canary}`'\"\nENVLAYERS_ENV\nENVLAYERS_JOB\n${{HOME}};touch {canary}"
    run = Run(slurm_lab, tmp_path, layer=KEYLESS + f"HOSTILE_VALUE={single_quote(value)}\n", SERVE_TIME="00:05:00",
              PYTHONPATH=PYTHONPATH)
    run.submit()
    run.wait_for("ENVLAYERS-STAGE: run_dir=", timeout_s=60)
    saved = (run.run_dir / "serve.env").read_text()
    slurm_lab.cancel(run.job_id)
    assert f"export HOSTILE_VALUE={single_quote(value)}\n" in saved
    assert not canary.exists()
