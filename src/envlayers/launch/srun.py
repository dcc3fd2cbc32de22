"""The srun step that starts the ranks: its argv, for the job (``launch.prepare``) and as the dry run prints it.

Its own module so that the dry run, which prints the line, does not import the launch plan's classes.
"""

from __future__ import annotations


def srun_argv(nodes: int, cpus_per_task: str, edf: str | None, ranks_sh: str) -> list[str]:
    """The srun line that starts one rank per node: every CPU of the node for the rank, the job ends
    when a rank fails (--kill-on-bad-exit), and the EDF when the ranks run in a container."""
    n = str(nodes)
    argv = ["srun", f"--nodes={n}", f"--ntasks={n}", "--ntasks-per-node=1", f"--cpus-per-task={cpus_per_task}",
            "--kill-on-bad-exit=1"]
    if edf:
        argv.append(f"--environment={edf}")
    return argv + ["bash", ranks_sh]


def srun_dry_line(nodes: int, edf: str | None) -> str:
    """:func:`srun_argv` as the dry run prints it: the CPU count and the run directory are what the job
    fills in (``${SLURM_CPUS_ON_NODE}``, ``${RUN_DIR}``)."""
    from ..engines import quote

    return " ".join(quote(w) for w in srun_argv(nodes, "${SLURM_CPUS_ON_NODE}", edf, "${RUN_DIR}/ranks.sh"))
