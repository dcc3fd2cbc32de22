"""The elastic pool (``MAX_REPLICAS``, ``ROUTER=smg``): replica jobs that join the router under load and leave it idle.

Once the router is live, :class:`Pool` reads every replica's ``/metrics`` (the queue: requests waiting
and the queue-time histogram) and the router's (the requests it routed to each worker) every few
seconds, hands them to ``launch.poolpolicy`` and carries out what it decides, each step one
``ENVLAYERS-POOL:`` line:

- grow: submit one replica job, the job script of this run (``job.sh``) again with ``--nodes=1``, the
  partition, account, QOS, reservation and working directory Slurm says this job runs with (as a
  successor keeps them, ``launch.successor``), a time limit no longer than this job's walltime left,
  and this job's per-job API key; once its ``endpoint.json`` says it is live, add it to smg
  (``POST /workers``) and wait until smg calls it healthy;
- shrink: take an added replica idle for ``IDLE_STOP_AFTER_S`` out of smg first (``DELETE /workers/{id}``),
  then cancel its job.

When this job ends, in any way, :meth:`Pool.stop` cancels every replica job it submitted. A replica job
runs the same launcher with ``ENVLAYERS_POOL_OF=<this job>``: :func:`member_keys` makes it one replica
on its one node (no router, no pool, no successor, no idle stop of its own), and :class:`Member` ends it
once this job's launcher recorded its end, or once Slurm says this job ended (a launcher killed
without ``stop`` leaves no replica behind for longer than :data:`STATE_EVERY_S`).

``pool.json`` in this job's run directory records every replica job (submitted, live, released, its
end) and every decision; ``env_layers report`` adds the replica jobs' GPU-hours to this job's, and
``endpoint.json`` lists them under ``pool``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable, Mapping

from .. import joblines
from .. import keys as keytable
from .. import shell, slurm
from ..rundir import (API_KEY, ENDPOINT, JOB_SH, POOL, EndpointRecord, PoolDecision, PoolJob, PoolRecord, end_recorded,
                      read_endpoint, write_json)
from ..urls import server_root
from .poolpolicy import Bounds, PoolPolicy, QueueWait, read_queue
from .successor import CHAIN_KEY_FILE, CHAIN_VARIABLES, HandedOver

POOL_OF_ENV = "ENVLAYERS_POOL_OF"  # set in a replica job's environment: the job whose pool it joins
SAMPLE_EVERY_S = 5.0
MIN_SAMPLE_EVERY_S = 1.0
STATE_EVERY_S = 15.0  # how often a pending replica job's Slurm state is asked
JOIN_TIMEOUT_S = 120.0  # from its endpoint.json until smg calls it healthy
# keys a replica job leaves out: it is one replica on one node, with no router, pool, chain or idle stop
MEMBER_DROPS = ("ROUTER", "MAX_REPLICAS", "SUCCESSORS", "MIN_REPLICAS", "IDLE_STOP_AFTER_S", "IDLE_WARN_AFTER_S")


def member_keys(keys: Mapping[str, str]) -> dict[str, str]:
    """A replica job's launch keys: this job's, as one replica on one node."""
    out = {k: v for k, v in keys.items() if k not in MEMBER_DROPS}
    out["INFERENCE_NODES"] = "1"
    if "NUMBER_OF_INSTANCES" in out:
        out["NUMBER_OF_INSTANCES"] = "1"
    return out


class Member:
    """Inside a replica job: ends it (as an orderly handover) once the pool's job recorded its end, or once
    Slurm says that job ended (its launcher killed before it could record anything)."""

    def __init__(self, parent: str, run_dir: Path, say: Callable[[str], None], *,
                 state: Callable[[str], str | None] | None = None, clock: Callable[[], float] = time.monotonic):
        self.parent, self.run_dir, self.say = parent, run_dir, say
        self.state = state if state is not None else _state
        self.clock = clock
        self.next_ask = clock() + STATE_EVERY_S

    def went_live(self, startup_s: float) -> None:
        self.say(joblines.POOL.line(f"replica job of job {self.parent}'s pool, live after {startup_s:.1f}s; job "
                                    f"{self.parent}'s router adds it"))

    def tick(self) -> None:
        if end_recorded(self.run_dir.parent / self.parent):
            raise HandedOver(f"job {self.parent}, whose pool this replica served, ended")
        now = self.clock()
        if now < self.next_ask:
            return
        self.next_ask = now + STATE_EVERY_S
        state = self.state(self.parent)  # None: Slurm did not answer, ask again later
        if state is not None and state.split()[0] in _ENDED:
            raise HandedOver(f"job {self.parent}, whose pool this replica served, ended ({state} in Slurm)")


def _state(job_id: str) -> str | None:
    """The job's Slurm state word; ``"GONE"`` when Slurm no longer knows it, None when it did not answer."""
    try:
        info = slurm.job_info(job_id)
    except slurm.SlurmError:
        return None
    return "GONE" if info is None else (info.state or None)


_ENDED = frozenset({"GONE", *slurm.TERMINAL_STATES})  # GONE: Slurm no longer knows the job (_state)


class Pool:
    """The pool's replica jobs, beside the router on node 0 (see the module's docstring)."""

    def __init__(self, keys: Mapping[str, str], *, job_id: str, run_dir: Path, engine: str, router,
                 started: int, max_replicas: int, startup_s: float, time_left_s: float | None,
                 environ: Mapping[str, str], api_key: str | None, say: Callable[[str], None],
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 run: Callable | None = None, fields: Callable[[str], dict[str, str]] = slurm.job_fields_or_none,
                 state: Callable[[str], str | None] = _state, fetch: Callable[..., str | None] | None = None,
                 cancel: Callable[[str], None] | None = None, write: Callable = write_json):
        self.job_id, self.run_dir, self.engine, self.router = job_id, run_dir, engine, router
        self.environ, self.api_key, self.say = dict(environ), api_key, say
        self.clock, self.wall, self.fields, self.state, self.write = clock, wall, fields, state, write
        self.run = run or (lambda argv, env: slurm.run(argv, env=env, timeout_s=60))
        self.cancel = cancel or (lambda job: slurm.cancel(job))
        if fetch is None:
            from .counters import fetch_metrics as fetch
        self.fetch = fetch
        b = Bounds(started, max_replicas, keytable.value(keys, "SCALE_UP_WAIT_S"),
                   keytable.value(keys, "SCALE_UP_WINDOW_S"), keytable.value(keys, "IDLE_STOP_AFTER_S"))
        self.policy = PoolPolicy(b, startup_s)
        self.queue = QueueWait()
        now = clock()
        self.deadline = None if time_left_s is None else now + time_left_s
        self.every_s = max(MIN_SAMPLE_EVERY_S, min(SAMPLE_EVERY_S, b.window_s / 5))
        self.next_sample = now
        self.next_state = now
        self.jobs: dict[str, PoolJob] = {}  # job id -> its record in pool.json
        self.decisions: list[PoolDecision] = []
        self.last_count: dict[str, float] = {}  # added replica's job -> the router's count for it
        self.last_request: dict[str, float] = {}
        self.endpoint_seen: dict[str, float] = {}  # replica job -> when its endpoint.json was seen (clock)
        self.endpoint: EndpointRecord | None = None
        self._written: tuple | None = None
        self.say(joblines.POOL.line(
            f"elastic pool: {started} replica(s), up to MAX_REPLICAS={max_replicas} while "
            f"requests wait over SCALE_UP_WAIT_S={b.wait_s:g}s for SCALE_UP_WINDOW_S={b.window_s:g}s; "
            + (f"an added replica idle for IDLE_STOP_AFTER_S={b.idle_s:g}s is released" if b.idle_s
               else "added replicas stay (IDLE_STOP_AFTER_S is not set)")))
        self._write()

    # ------------------------------------------------------------------ the loop

    def went_live(self, endpoint: EndpointRecord) -> None:
        """The endpoint.json record the launcher wrote: the pool's replicas are listed there."""
        self.endpoint = endpoint
        self._written = None  # this record has no pool yet
        self._write()

    def time_left(self, now: float) -> float | None:
        return None if self.deadline is None else self.deadline - now

    def tick(self) -> None:
        now = self.clock()
        if now < self.next_sample:
            return
        self.next_sample = now + self.every_s
        if self.policy.pending is not None:
            self._pending(now)
        waits = {}
        for url in self.worker_urls():
            text = self.fetch(server_root(url) + "/metrics", self.api_key)
            waits[url] = read_queue(self.engine, text) if text is not None else None
        wait = self.queue.feed(now, waits)
        idle = self._idle(now)
        for d in self.policy.decide(now, wait, self.time_left(now), idle):
            self.decisions.append(PoolDecision(round(self.wall(), 3), d.action, d.job, d.why))
            if d.action == "grow":
                self.grow(d.why, now)
            else:
                self.shrink(d.job, d.why)
        self._write()

    def worker_urls(self) -> list[str]:
        """The replicas smg routes to: the job's own, and the added ones."""
        return [server_root(u) for u in self.router.workers] + [server_root(self.jobs[j].url)
                                                                 for j in self.policy.added]

    def _idle(self, now: float) -> dict[str, float]:
        """Each added replica's seconds without a request routed to it (the router's counts)."""
        from .router import worker_requests

        text = self.router.metrics()
        counts = worker_requests(text) if text is not None else {}
        out = {}
        for job in self.policy.added:
            count = counts.get(server_root(self.jobs[job].url))
            if count is not None and count != self.last_count.get(job):
                self.last_count[job] = count
                self.last_request[job] = now
            out[job] = now - self.last_request[job] if text is not None else 0.0
        return out

    # ------------------------------------------------------------------ grow

    def grow(self, why: str, now: float) -> None:
        left = self.time_left(now)
        limit = None if left is None else max(60, int(left))
        env = {k: v for k, v in self.environ.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}
        for name in CHAIN_VARIABLES:
            env.pop(name, None)
        env[POOL_OF_ENV] = self.job_id
        if (self.run_dir / API_KEY).is_file():  # a per-job key: the replica serves with the same one
            env[CHAIN_KEY_FILE] = str(self.run_dir / API_KEY)
        argv = slurm.pool_sbatch_argv(self.run_dir / JOB_SH, limit, slurm.resubmit_options(self.fields(self.job_id)))
        try:
            proc = self.run(argv, env)
            job = slurm.parse_parsable(proc.stdout) if proc.returncode == 0 else None
            said = None if job else ((proc.stderr or "").strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        except (OSError, slurm.SlurmError) as err:
            job, said = None, str(err)
        if job is None:
            self.say(joblines.POOL.line(f"grow refused: could not submit a replica job ({said}); {why}"))
            return
        self.policy.submitted(job)
        self.jobs[job] = PoolJob(job, submitted_at=round(self.wall(), 3))
        self.next_state = now + STATE_EVERY_S
        self._write()
        self.say(joblines.POOL.line(f"grow: {why}: submitted replica job {job} ({shell.words(argv)}"
                                    + ("; it keeps this job's API key)" if CHAIN_KEY_FILE in env else ")")))

    def _pending(self, now: float) -> None:
        job = self.policy.pending
        rec = self.jobs[job]
        if rec.url is None:
            ep = read_endpoint(self.run_dir.parent / job)
            urls = ep.base_urls if ep is not None else []
            if urls:
                rec.url, rec.node = urls[0], (ep.nodes or [None])[0]
                self.endpoint_seen[job] = now
                said = self.router.add_worker(urls[0])
                if said is not None:
                    return self._failed(job, f"smg did not take it: {said}")
                self.say(joblines.POOL.line(f"replica job {job} is live at {urls[0]} on {rec.node}; added to the "
                                            "router (POST /workers)"))
                return
            if now >= self.next_state:
                self.next_state = now + STATE_EVERY_S
                state = self.state(job)
                if state in _ENDED:
                    self._failed(job, f"it ended ({state}) before its endpoint was live; see its output")
            return
        listed = self.router.listed() or {}
        entry = listed.get(server_root(rec.url))
        if entry is not None and entry[1]:
            startup = round(self.wall() - rec.submitted_at, 1)
            rec.live_at = round(self.wall(), 3)
            self.policy.joined(job, startup)
            self.last_request[job] = now
            self._write()  # endpoint.json lists it before the line says so
            self.say(joblines.POOL.line(f"replica job {job} joined the router after {startup:.0f}s: {self.policy.size} "
                                        f"replicas serve (MAX_REPLICAS={self.policy.bounds.max_replicas})"))
        elif now - self.endpoint_seen[job] > JOIN_TIMEOUT_S:
            self._failed(job, f"smg did not call it healthy within {JOIN_TIMEOUT_S:.0f}s")

    def _failed(self, job: str, why: str) -> None:
        self.policy.failed(job)
        self.say(joblines.POOL.line(f"replica job {job} did not join: {why}; cancelling it"))
        self._end(job, f"did not join: {why}")

    # ------------------------------------------------------------------ shrink and the end

    def shrink(self, job: str, why: str) -> None:
        rec = self.jobs[job]
        said = self.router.remove_worker(rec.url)
        if said is not None:
            self.say(joblines.POOL.line(f"shrink of replica job {job} put off: the router did not let it go ({said})"))
            return
        self.policy.released(job)
        rec.released_at = round(self.wall(), 3)
        self._end(job, f"released: {why}")
        self._write()
        self.say(joblines.POOL.line(f"shrink: replica job {job} ({rec.url}) {why}: removed from the router, job "
                                    f"cancelled; {self.policy.size} replicas serve"))

    def _end(self, job: str, how: str) -> None:
        rec = self.jobs[job]
        rec.ended = how
        rec.ended_at = round(self.wall(), 3)
        try:
            self.cancel(job)
        except (OSError, slurm.SlurmError) as err:
            self.say(joblines.WARN.line(f"could not cancel replica job {job}: {err}"))

    def stop(self) -> None:
        """This job ends: cancel every replica job still running (the router already stopped)."""
        left = [j for j, rec in self.jobs.items() if rec.ended is None]
        for job in left:
            self._end(job, "the pool's job ended")
        if left:
            self.say(joblines.POOL.line(f"job {self.job_id} ends: cancelled its replica job(s) {', '.join(left)}"))
        self._write()

    # ------------------------------------------------------------------ records

    def record(self) -> PoolRecord:
        b = self.policy.bounds
        return PoolRecord(b.started, b.max_replicas, b.wait_s, b.window_s, b.idle_s, list(self.jobs.values()),
                          list(self.decisions))

    def _write(self) -> None:
        """pool.json, and the pool's replicas in endpoint.json, when they changed."""
        rec = self.record().to_dict()
        seen = (json.dumps(rec, sort_keys=True), self.endpoint is not None)  # text: the records change in place
        if seen == self._written:
            return
        self._written = seen
        try:
            self.write(self.run_dir / POOL, rec)
        except OSError:
            pass
        if self.endpoint is not None:
            self.endpoint.pool = {"max_replicas": self.policy.bounds.max_replicas,
                                  "replicas": [{"job": j, "url": self.jobs[j].url, "node": self.jobs[j].node}
                                               for j in self.policy.added]}
            if self.endpoint.router is not None:
                self.endpoint.router["workers"] = self.worker_urls()
            try:
                self.write(self.run_dir / ENDPOINT, self.endpoint.to_dict())
            except OSError:
                pass
