"""What Slurm says when ranks did not start: ``ENVLAYERS-DIAG:`` lines said before the job ends.

A launch whose ranks never started (Slurm did not place the step, a node went down, srun was refused)
otherwise ends with the launcher's own view only. These lines add Slurm's: which ranks are missing and
on which node each was planned, the state of each of the job's steps, and each node's state and the
reason Slurm or an operator gave for it (``scontrol show step`` / ``scontrol show node``), so the job
output alone says whether to look at the nodes, the step or the run directory.

``diag_lines`` is pure; ``slurm_diag`` asks Slurm (bounded: a controller that does not answer is said
in one line, never a hang or a traceback).
"""

from __future__ import annotations

from typing import Callable, Sequence

from .. import slurm
from ..errors import SlurmError
from ..joblines import DIAG

PREFIX = DIAG.prefix
QUERY_TIMEOUT_S = 10.0


def diag_lines(job_id: str, missing: Sequence[tuple[int, str]], node_names: Sequence[str],
               steps: Sequence[slurm.StepInfo] | None, states: dict[str, slurm.NodeState] | None,
               unavailable: str | None = None) -> list[str]:
    """The lines for ``missing`` ``(rank, planned node)`` of ``job_id`` on the allocation's nodes
    ``node_names``, from the steps and node states Slurm gave (None: it could not say)."""
    lines = []
    if missing:
        lines.append(PREFIX + "ranks missing: " + ", ".join(f"rank {r} (planned on {node})" for r, node in missing))
    if unavailable is not None:
        lines.append(PREFIX + f"Slurm could not be asked: {unavailable}")
        return lines
    if steps is None:
        lines.append(PREFIX + f"steps of job {job_id}: scontrol show step could not list them")
    else:
        ours = [s for s in steps if not s.step_id.endswith((".batch", ".extern"))]
        if not ours:
            lines.append(PREFIX + f"steps of job {job_id}: Slurm lists no server step (none was started, "
                         "or it has already ended)")
        for step in ours:
            tasks = f", {step.tasks} task(s)" if step.tasks is not None else ""
            lines.append(PREFIX + f"step {step.step_id}: {step.state} on {step.nodelist or '-'}{tasks}")
    for name in node_names:
        state = (states or {}).get(name)
        if state is None:
            lines.append(PREFIX + f"node {name}: Slurm did not show it")
        else:
            reason = f" (reason: {state.reason})" if state.reason else ""
            lines.append(PREFIX + f"node {name}: {state.state}{reason}")
    return lines


def slurm_diag(job_id: str, missing: Sequence[tuple[int, str]], node_names: Sequence[str],
               run: Callable = slurm.run) -> list[str]:
    """Ask Slurm about the job's steps and nodes, and return :func:`diag_lines`."""
    try:
        steps = slurm.job_steps(job_id, run=run, timeout_s=QUERY_TIMEOUT_S)
        states = slurm.node_states(node_names, run=run, timeout_s=QUERY_TIMEOUT_S)
    except SlurmError as err:
        return diag_lines(job_id, missing, node_names, None, None, unavailable=str(err))
    return diag_lines(job_id, missing, node_names, steps, states)
