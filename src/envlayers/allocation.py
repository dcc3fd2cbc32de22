"""Running the serve-only job inside an allocation someone else made: does that allocation fit the plan?

``cluster/serve-only.sbatch`` is named like a batch script, so operators ``sbatch`` it. Inside such a
job (``SLURM_JOB_ID`` set) the wrapper renders the same job script ``env_layers serve`` would submit and
runs it as this job, provided the allocation is the one the plan asks for: the node count, the GPUs per
node and the partition. Otherwise the job ends at once with one line naming the right command.

Pure: the allocation is read from the environment Slurm gives a batch job (sbatch(1), "OUTPUT
ENVIRONMENT VARIABLES"), and the verdict is computed from it and the plan.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from . import shell

WRAPPER = "cluster/serve-only.sbatch"
# the variables that say which catalog target and options the operator chose (passed on in the hint)
_CHOICE_VARS = ("MODEL", "EXPERIMENT", "SERVE_TIME", "SERVE_ENV_FILE", "SERVE_BASE_ENV")


@dataclass(frozen=True)
class Allocation:
    job_id: str
    nodes: int | None  # SLURM_JOB_NUM_NODES (SLURM_NNODES)
    gpus_per_node: int | None  # GPUs this node was given; None when Slurm says nothing about GPUs
    partition: str | None  # SLURM_JOB_PARTITION

    def describe(self) -> str:
        gpus = "no GPUs" if not self.gpus_per_node else f"{self.gpus_per_node} GPU(s) per node"
        return (f"{_nodes(self.nodes)}, {gpus}, partition {self.partition or '?'}")


def _nodes(n: int | None) -> str:
    return "? node(s)" if n is None else f"{n} node(s)"


def _int(text: str | None) -> int | None:
    text = (text or "").strip()
    return int(text) if text.isdigit() else None


def _gpu_count(text: str | None) -> int | None:
    """'4', 'gpu:4', 'mi300a:4' or 'gpu:mi300a:4' -> 4 (the first entry of a comma list)."""
    if not text:
        return None
    first = text.split(",")[0].strip()
    m = re.fullmatch(r"(?:[A-Za-z0-9_.-]+:)*(\d+)", first)
    return int(m.group(1)) if m else None


def _device_list(text: str | None) -> int | None:
    """'0,1,2,3' -> 4; '' or 'NoDevFiles' -> 0."""
    if text is None:
        return None
    items = [x for x in text.split(",") if x.strip() and x.strip() != "NoDevFiles"]
    return len(items)


def from_environ(environ: dict[str, str]) -> Allocation | None:
    """The allocation of the batch job this runs in, or ``None`` outside one."""
    job_id = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
    if not job_id:
        return None
    nodes = _int(environ.get("SLURM_JOB_NUM_NODES")) or _int(environ.get("SLURM_NNODES"))
    # What this node got: the count Slurm sets for the step's node, else the GPU ids of the job, else what
    # was asked for (--gpus-per-node); a job that asked for no GPUs has none of them.
    gpus = _int(environ.get("SLURM_GPUS_ON_NODE"))
    if gpus is None:
        gpus = _device_list(environ.get("SLURM_JOB_GPUS"))
    if gpus is None:
        gpus = _gpu_count(environ.get("SLURM_GPUS_PER_NODE"))
    return Allocation(job_id, nodes, gpus, environ.get("SLURM_JOB_PARTITION") or None)


def misfits(alloc: Allocation, nodes: int, gpus_per_node: int, partition: str | None) -> list[str]:
    """What the allocation gets wrong for a plan of ``nodes`` x ``gpus_per_node`` on ``partition``."""
    out = []
    if alloc.nodes != nodes:
        out.append(f"{_nodes(alloc.nodes)}, not {nodes}")
    if (alloc.gpus_per_node or 0) != gpus_per_node:
        out.append(f"{alloc.gpus_per_node or 0} GPU(s) per node, not {gpus_per_node}")
    allowed = [p for p in (partition or "").split(",") if p]  # the layers may name a list (sbatch -p a,b)
    if allowed and alloc.partition not in allowed:
        out.append(f"partition {alloc.partition or '?'}, not {' or '.join(allowed)}")
    return out


def wrong_way_line(target: str, alloc: Allocation, problems: list[str], nodes: int, gpus_per_node: int,
                   partition: str | None, environ: dict[str, str]) -> str:
    """The one line a job that does not fit ends with: what is wrong and the command that works."""
    return (f"serve-only.sbatch: job {alloc.job_id} does not fit {target} ({'; '.join(problems)}): it needs "
            f"{nodes} node(s) with {gpus_per_node} GPU(s) each{f' on partition {partition}' if partition else ''}; "
            f"run it without sbatch, and it submits that job itself: {right_command(environ)}")


def right_command(environ: dict[str, str]) -> str:
    """``MODEL=glm53 cluster/serve-only.sbatch``: the operator's choices, then the wrapper, no sbatch."""
    choices = [f"{k}={shell.word(environ[k])}" for k in _CHOICE_VARS if environ.get(k)]
    return " ".join(choices + [WRAPPER])
