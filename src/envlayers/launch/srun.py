"""The srun step that starts the ranks, as the dry run prints it (the argv itself: ``slurm.ranks_step_argv``).

Its own module so that the dry run, which prints the line, does not import the launch plan's classes.
"""

from __future__ import annotations


def srun_dry_line(nodes: int, edf: str | None) -> str:
    """:func:`envlayers.slurm.ranks_step_argv` as the dry run prints it: the CPU count and the run directory
    are what the job fills in (``${SLURM_CPUS_ON_NODE}``, ``${RUN_DIR}``)."""
    from ..engines import quote
    from ..slurm import ranks_step_argv

    return " ".join(quote(w) for w in ranks_step_argv(nodes, "${SLURM_CPUS_ON_NODE}", edf, "${RUN_DIR}/ranks.sh"))
