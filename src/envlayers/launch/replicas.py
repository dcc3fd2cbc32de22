"""Replicas that survive a peer: one srun step per replica, a dead replica dropped, its node given back.

In the replicas shape every rank is an independent server, so a replica that exits (or stops
answering ``/health``, see ``launch.health``) after the endpoint went live is reported and dropped
while the others keep serving. The job ends once fewer than ``MIN_REPLICAS`` (a launch key,
default 1) are alive. Before the endpoint is live any exit still ends the job: a replica that cannot
start usually shows a problem its peers share.

To let a replica die alone, each one runs in its own srun step pinned to its node
(:func:`envlayers.slurm.one_node_step_argv`; one step over all nodes would be ended by ``--kill-on-bad-exit``).
:class:`ReplicaSteps` holds them and answers the supervision loop like one step. Once a replica's
step is gone its node leaves the allocation (``scontrol update JobId=J NodeList=<the rest>``,
Slurm's way to shrink a running job), so it is no longer billed; the node the launcher runs on stays.
``endpoint.json`` keeps a ``replicas`` list (rank, node, base URL, alive, why it ended); its
``base_urls``/``addresses`` list the live replicas only.

Data-parallel and gateway shapes (where an engine allows a rank to leave) would plug in here: they
need their own step layout and the gateway told to stop routing to the dead rank.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable, Mapping, Sequence

from .. import slurm
from ..errors import LaunchFailure
from ..joblines import ERROR, STAGE, TAIL_HEADER, WARN
from ..procgroup import stop_group, stop_groups
from ..rundir import ENDPOINT, EndpointRecord, ReplicaRow, server_log_name, write_json
from .prepare import LaunchPlan

RESIZE_TRIES = 3


def survives(lp: LaunchPlan) -> bool:
    """Whether a rank of this plan may die alone (the replicas shape, more than one replica)."""
    return lp.plan.shape == "replicas" and lp.ranks > 1


class ReplicaSteps:
    """One srun step per replica, seen by the supervision loop as one step. Each step's environment
    carries ``ENVLAYERS_RANK`` (ranks.sh takes its rank from it: every step's task is ``SLURM_PROCID`` 0)."""

    def __init__(self, lp: LaunchPlan, env: Mapping[str, str], popen: Callable = subprocess.Popen):
        self.lp = lp
        self.procs: dict[int, subprocess.Popen] = {}
        for rank, node in enumerate(lp.nodes):
            self.procs[rank] = popen(slurm.one_node_step_argv(lp.srun, node.name), env={**env, "ENVLAYERS_RANK": str(rank)},
                                     start_new_session=True)
        self.survive = False  # set once live: from then on one step ending is not the job's end

    @property
    def pid(self) -> int:
        return self.procs[0].pid

    def poll(self) -> int | None:
        codes = [p.poll() for p in self.procs.values()]
        if not self.survive:
            return next((c for c in codes if c is not None), None)
        return codes[0] if codes and all(c is not None for c in codes) else None

    def end(self, rank: int, grace_s: float = 8.0) -> int | None:
        """Stop one replica's step (SIGTERM to its srun, then SIGKILL); its exit code."""
        return stop_group(self.procs[rank], signal.SIGTERM, grace_s)

    def stop(self, sig=signal.SIGTERM, grace_s: float = 8.0) -> None:
        stop_groups(self.procs.values(), sig, grace_s)


def release_node(job_id: str, keep: Sequence[str], run_dir: Path, run: Callable | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> str | None:
    """Shrink the running job to the nodes in ``keep`` (``scontrol update JobId=J NodeList=...``);
    ``None`` when done, else what Slurm said. After a job starts or changes size slurmctld refuses
    updates until the accounting database has given the job a new index ("the DB index is being
    set, try again in a bit"; each refusal takes slurmctld 5s): that is retried a few times. Without
    accounting storage (``AccountingStorageType=accounting_storage/none``) the index never comes, so
    a job shrinks once. Runs in the run directory, where scontrol leaves its resize scripts."""
    if run is None:
        run = lambda argv: slurm.run(argv, timeout_s=60, cwd=run_dir)  # noqa: E731
    said = "?"
    for attempt in range(RESIZE_TRIES):
        try:
            proc = run(slurm.shrink_argv(job_id, keep))
        except (OSError, slurm.SlurmError) as err:
            return f"scontrol failed: {err}"
        if proc.returncode == 0:
            return None
        lines = (proc.stderr or proc.stdout or "").strip().splitlines()
        said = lines[-1] if lines else f"scontrol exit {proc.returncode}"
        if "try again" not in said:
            break
        if attempt + 1 < RESIZE_TRIES:
            sleep(2.0)
    return said


class Survivors:
    """The replicas' state after live: who is alive, what to do when one is lost."""

    def __init__(self, lp: LaunchPlan, steps, minimum: int, *, say: Callable[[str], None],
                 tail: Callable[[Path], list[str]], release: Callable[[Sequence[str]], str | None],
                 write: Callable[[Path, Mapping], object] = write_json, background: Callable | None = None):
        self.lp, self.steps, self.minimum, self.say, self.tail = lp, steps, minimum, say, tail
        self.release, self.write = release, write
        # giving a node back waits on slurmctld (up to ~20s): by default in a thread, off the loop
        self.background = background or (lambda fn: threading.Thread(target=fn, daemon=True).start())
        self.lock = threading.Lock()
        self.dead: dict[int, str] = {}
        self.endpoint: EndpointRecord | None = None

    @property
    def alive(self) -> list[int]:
        return [r for r in range(self.lp.ranks) if r not in self.dead]

    def went_live(self, endpoint: EndpointRecord) -> None:
        """The endpoint.json record the launcher wrote: rewritten on every loss."""
        self.endpoint = endpoint
        if getattr(self.steps, "survive", None) is not None:
            self.steps.survive = True
        self.say(STAGE.line(f"replicas survive a peer: {len(self.alive)} alive, the job ends below "
                            f"MIN_REPLICAS={self.minimum}"))
        self._write()

    def lost(self, rank: int, why: str) -> None:
        """Report a lost replica (ENVLAYERS-ERROR and its log tail), stop its step, give its node back,
        rewrite endpoint.json; raise LaunchFailure when fewer than MIN_REPLICAS are left."""
        if rank in self.dead:
            return
        node = self.lp.nodes[rank].name
        self.dead[rank] = why
        self.say(ERROR.line(f"replica rank {rank} on {node} {why}"))
        log = self.lp.run_dir / server_log_name(rank)
        self.say(TAIL_HEADER.line(n=len(self.tail(log)), log=log))
        for line in self.tail(log):
            self.say(f"  | {line}")
        left = self.alive
        if len(left) < self.minimum:
            self._write()
            raise LaunchFailure(f"{len(left)} of {self.lp.ranks} replicas alive, fewer than "
                                f"MIN_REPLICAS={self.minimum}: ending the job")
        end = getattr(self.steps, "end", None)
        if end is not None:
            end(rank)
        self._give_back(rank)
        self._write()
        self.say(STAGE.line(f"{len(left)} of {self.lp.ranks} replicas alive, serving on: "
                            + ", ".join(f"rank {r} on {self.lp.nodes[r].name}" for r in left)))

    def _give_back(self, rank: int) -> None:
        node = self.lp.nodes[rank].name
        if rank == 0:
            self.say(STAGE.line(f"node {node} stays in the job: the launcher runs there"))
            return
        self.background(lambda: self._release(node))

    def _release(self, node: str) -> None:
        with self.lock:  # one resize at a time; each asks for the replicas alive at that moment
            keep = [self.lp.nodes[0].name] + [self.lp.nodes[r].name for r in self.alive if r != 0]
            said = self.release(keep)
        if said is None:
            self.say(STAGE.line(f"node {node} released back to Slurm (the job now holds "
                                f"{', '.join(keep)}; no longer billed for {node})"))
        else:
            self.say(WARN.line(f"could not release node {node} back to Slurm ({said}); it stays allocated "
                               "until the job ends"))

    def _write(self) -> None:
        if self.endpoint is None:
            return
        ep = self.endpoint
        urls = {t.rank: t for t in self.lp.targets}
        ep.replicas = [ReplicaRow(r, n.name, urls[r].url if r in urls else None, n.address, r not in self.dead,
                                  self.dead.get(r)) for r, n in enumerate(self.lp.nodes)]
        ep.min_replicas = self.minimum
        live = [t for t in self.lp.targets if t.rank not in self.dead]
        if ep.router is not None:  # the router's one URL stays the endpoint; the live replicas behind it
            ep.replica_urls = [t.url for t in live]
            ep.replica_addresses = [t.address for t in live]
        elif live:
            ep.base_urls = [t.url for t in live]  # base_url is the first of them
            ep.addresses = [t.address for t in live]
        self.write(self.lp.run_dir / ENDPOINT, ep.to_dict())

