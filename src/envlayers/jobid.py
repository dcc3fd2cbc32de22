"""The one reading of a job id every command takes (wait, status, logs, stop, diagnose, verify, ...), and
the one error for a job that cannot be found.

Accepted: the number ``sbatch`` printed (``1234``), and a step of it as ``scontrol``/``sacct``/``squeue -s``
print one (``1234.0``, ``1234.batch``, ``1234.extern``), which means the job itself. Refused, with a hint:
an array task (``1234_5``: an endpoint job is never an array; the task's own id is what the commands
need), job 0 (Slurm numbers jobs from 1; ``scontrol show job 0`` lists them all), an empty id, anything else.
Surrounding blanks and leading zeros are ignored. Pure: no Slurm call.
"""

from __future__ import annotations

import re

from .errors import EnvLayersError

WHERE = "JOBID"
FORMS = "1234 (the number sbatch printed) or a step of it (1234.0, 1234.batch)"
_STEP_RE = re.compile(r"^(\d+)(?:\.(?:\d+|batch|extern|interactive))?$")
_ARRAY_RE = re.compile(r"^(\d+)_(\d+|\[.*\])$")
MAX_JOB_ID = 2**32 - 1  # Slurm job ids are 32-bit


def _clip(text: str) -> str:
    return text if len(text) <= 40 else text[:37] + "..."


def looks_like_job_id(text: str) -> bool:
    """Whether ``text`` is meant as a job id (a file or URL argument never is): any form above, array too."""
    text = str(text).strip()
    return bool(_STEP_RE.match(text) or _ARRAY_RE.match(text))


def parse_job_id(text: str) -> str:
    """The job id ``text`` names, as Slurm's plain number (without leading zeros); an ``EnvLayersError``
    (exit 2) otherwise. ``0`` is no job: Slurm numbers jobs from 1, and ``scontrol show job 0`` lists every
    job, so a command given 0 would act on whichever Slurm lists first."""
    raw = str(text)
    text = raw.strip()
    if not text:
        raise EnvLayersError(f"{_clip(raw)!r} is not a Slurm job id: it is empty", where=WHERE,
                             hint=f"give {FORMS}, e.g. `env_layers wait 12345`")
    m = _STEP_RE.match(text)
    if m and 0 < int(m.group(1)) <= MAX_JOB_ID:
        return str(int(m.group(1)))
    if m and int(m.group(1)) == 0:
        raise EnvLayersError(f"{_clip(raw)!r} is not a Slurm job id: Slurm numbers jobs from 1 (asked for job 0, "
                             "Slurm lists every job)", where=WHERE, hint=f"give {FORMS}")
    if m:
        raise EnvLayersError(f"{_clip(raw)!r} is not a Slurm job id: more than {MAX_JOB_ID}", where=WHERE,
                             hint=f"give {FORMS}")
    if _ARRAY_RE.match(text):
        raise EnvLayersError(f"{_clip(raw)!r} is an array task id; an endpoint job is not an array", where=WHERE,
                             hint=f"give the task's own job id: `squeue -h -j {text} -o %A`")
    raise EnvLayersError(f"{_clip(raw)!r} is not a Slurm job id", where=WHERE,
                         hint=f"give {FORMS}, e.g. `env_layers wait 12345`")


def not_found(job_id: str, give_dir: str = "--run-dir DIR") -> EnvLayersError:
    """What every command says for a job id neither Slurm nor the files here know. ``give_dir``: how the
    command that asks takes a run directory instead (diagnose takes it as an argument, not an option)."""
    return EnvLayersError(
        f"no job {job_id}: Slurm does not know it and there is no serve-only-{job_id}.out here",
        hint="`env_layers status` lists your endpoint jobs; without accounting Slurm forgets a finished job "
             f"after MinJobAge: run from the submit directory, or give its run directory ({give_dir})")


__all__ = ["FORMS", "WHERE", "looks_like_job_id", "not_found", "parse_job_id"]
