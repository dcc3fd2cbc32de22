"""ranks.sh: the per-node script the srun step runs, rendered from templates/ranks.sh.j2 (scripttext.py).

Every value (each argv word, each variable assigned on the command) goes into the script in single
quotes, so it reaches the engine byte for byte: a ``${HOME}``, a ``$(...)`` or a backtick inside a
value stays text. The launcher substitutes what it knows (the master address) before rendering;
the only thing the script fills in at run time is the API key, from the rank's ``SERVER_API_KEY``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Sequence

from ..engines import RankCommand
from ..rundir import SCRIPT_NAMES
from ..joblines import RANK_UP
from ..scripttext import Code, dq, render


def rank_script(commands: Iterable[RankCommand], run_dir: Path,
                wrappers: Sequence[tuple[str, Sequence[str]]] | None = None) -> str:
    """The text of ranks.sh: SLURM_PROCID picks the rank's command; its exit code lands in rank-<r>.exit
    (the names of the files it writes: ``rundir.SCRIPT_NAMES``).
    ``wrappers`` (a container runtime, runtimes/): per rank, a shell line envlayers built (run first)
    and the words that go before the engine's argv (``podman run ... IMAGE``)."""
    arms = [{"rank": rank, "env": sorted(cmd.env.items()), "argv": list(cmd.argv), "key_env": cmd.key_env,
             "key_flag": cmd.key_flag, "prelude": Code(wrappers[rank][0]) if wrappers else None,
             "wrap": list(wrappers[rank][1]) if wrappers else []}
            for rank, cmd in enumerate(commands)]
    return render("ranks.sh.j2", arms=arms, run_dir=str(run_dir), files=SCRIPT_NAMES, rank_up=RANK_UP_ECHO)


# a rank's first line, which the launcher waits for (joblines.RANK_UP); the shell fills rank and host
RANK_UP_ECHO = Code(RANK_UP.shell({"rank": "${rank}", "host": "${SLURMD_NODENAME:-$(hostname)}"}, dq))
