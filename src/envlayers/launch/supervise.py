"""The supervision loop: watch the ranks until the job ends, and end it at the first sign of trouble.

Watches five things: each rank's first log line (started, and on which node: once every rank
started, the nodes they report must be the allocation's), each rank's exit file, the srun step, what
the engine's own log says of its engine core (``engines.logsigns``: vLLM reports a dead engine core
seconds before its server exits), and the readiness probe: ``/v1/models`` lists the served name, then a one-token completion comes back (live
means it generates). A rank that exits, the step dying, a rank that never starts within the
rank-start budget, a startup whose logs stopped growing (``STARTUP_STALL_S``), or a readiness budget
spent raises :class:`LaunchFailure`, naming the rank to
blame: the one that failed first, not one that srun stopped because of it. Once every readiness
target answers, ``on_live`` is called once and the loop keeps watching until a signal ends it.

Once live it also ticks the optional hooks: ``survivors`` (launch.replicas: a replica's exit drops
that replica instead of ending the job), ``health`` (launch.health: a rank silent on ``/health``) and
``successor`` (launch.successor: the handover to a successor job).

The clock, the sleep, the probe and the step are injected, so the loop runs in tests without
Slurm, root or real time.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Callable, Protocol

from ..engines.logsigns import core_died
from ..errors import StepSignalled
from ..joblines import ALL_STARTED, DIAG, RANK_UP
from ..tail import Tail
from ..rundir import rank_exit_name, rank_signal_name, server_log_name
from .prepare import LaunchFailure, LaunchPlan

POLL_S = 0.25
PROBE_EVERY_S = 0.5
EXIT_SETTLE_S = 1.5
# exits that are usually srun stopping a rank because another one failed (SIGINT, SIGTERM, a clean
# stop); SIGKILL (137) is not among them: that is how the kernel's OOM killer ends a rank
STOPPED_CODES = frozenset({"0", "130", "143"})
SIGNALS = {"HUP": 1, "INT": 2, "TERM": 15}  # what ranks.sh writes in rank-<rank>.signal
GENERATE_TIMEOUT_S = 300.0  # one one-token completion before readiness (asked again while the budget lasts)
NOT_YET = (429, 503)
STALL_TAIL_LINES = 400  # refusals that mean "busy, ask again", not "cannot generate"
# a rank whose engine core died, in a plan of several ranks: a peer's exit landing this soon is blamed instead
# (the peer that died first can take the others' engine cores with it)
CORE_DEATH_SETTLE_S = 0.5
TAIL_READ_BYTES = 4 << 20  # at most this much of a rank's log is read per tick (the rest on the next ones)
TAIL_LINE_BYTES = 64 << 10  # an unfinished line longer than this is cut to its end


def by_signal(code: str) -> bool:
    """An exit by a signal other than srun's or scancel's stop (SIGKILL, SIGSEGV, SIGABRT, ...). Such a rank did
    not die of a peer's failure (a peer's failure ends a rank by an exception, or by srun's SIGTERM after it),
    so it is blamed at once, without EXIT_SETTLE_S."""
    return code.isdigit() and 128 < int(code) < 128 + 65 and code not in STOPPED_CODES


class Step(Protocol):
    def poll(self) -> int | None: ...


class _Generation:
    """One one-token completion, in a thread of its own (``background``) or inline (tests)."""

    def __init__(self, call: Callable, started: float, background: bool = True):
        self.started = started
        self.result = None
        self.done = False
        if background:
            threading.Thread(target=self._run, args=(call,), daemon=True, name="envlayers-generate").start()
        else:
            self._run(call)

    def _run(self, call: Callable) -> None:
        try:
            self.result = call()
        except Exception as err:  # a bug in the call must not read as a hang
            from ..readiness import Probe

            self.result = Probe("", False, None, f"no answer: {type(err).__name__}: {err}")
        finally:
            self.done = True

    def retry(self) -> bool:
        """Ended without an answer, or with one that says "not yet": ask again."""
        return self.done and not self.result.ok and self.result.status in (None, *NOT_YET)


class Supervisor:
    def __init__(self, lp: LaunchPlan, step: Step, *, probe: Callable, on_live: Callable[[float], None],
                 say: Callable[[str], None], api_key: str | None = None,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 t0: float | None = None, meter=None, survivors=None, health=None, successor=None,
                 generate: Callable | None = None, background: bool = True,
                 diag: Callable[[list[int]], list[str]] | None = None):
        self.meter = meter  # launch.meter.Meter: phase times, request counters, idle release (None: off)
        self.lp, self.step, self.probe, self.on_live, self.say = lp, step, probe, on_live, say
        self.api_key, self.clock, self.sleep = api_key, clock, sleep
        self.t0 = clock() if t0 is None else t0
        self.started: set[int] = set()
        self.rank_nodes: dict[int, str] = {}  # the node each rank's first line reports (SLURMD_NODENAME)
        self.first_exit_at: float | None = None
        self.live = False
        self.ready: set[int] = set()
        self.listed: set[int] = set()  # /v1/models lists the served name
        # readiness.generates (None: live once the name is listed); its calls, per rank
        self.generate, self.background = generate, background
        self.generations: dict[int, _Generation] = {}
        self.log_sizes: list[int] = []  # the ranks' log sizes at the last growth (the stall detector)
        self.grew_at: float | None = None
        self.last_probe: dict[int, str] = {}
        # hooks for an endpoint that lasts: launch.replicas.Survivors (a replica may die alone once live) and
        # launch.health.HealthWatch (a serving rank that stops answering /health once live),
        # launch.successor.Chain (hands over to a successor job once that one is live)
        self.survivors, self.health, self.successor = survivors, health, successor
        self.router = None  # launch.router.Router (ROUTER=smg): set by the launcher
        self.pool = None  # launch.pool.Pool (MAX_REPLICAS): set by the launcher once the router is live
        # launch.slurmdiag: what Slurm says of the missing ranks' step and nodes (ENVLAYERS-DIAG lines)
        self.diag = diag
        # engines.logsigns: each rank's log read as it grows; the ranks whose engine core died (when, what it said).
        # Not in the gateway shape: there rank 0's log carries every Serve replica's output, and a replica's
        # engine dying is the gateway's to handle (gateway_app.py replaces it)
        self.tails: dict[int, Tail] = {}
        self.core_deaths: dict[int, tuple[float, str]] = {}
        self.watch_cores = lp.plan.shape != "gateway"

    @property
    def run_dir(self) -> Path:
        return self.lp.run_dir

    def check_ranks(self) -> None:
        """Note the ranks that started; raise when a rank has exited (after letting the others' exit
        codes land for up to EXIT_SETTLE_S, so the first failure is blamed; at once for a rank killed by a
        signal, see :func:`by_signal`)."""
        n = self.lp.ranks
        for rank in range(n):
            if rank in self.started:
                continue
            try:
                with open(self.run_dir / server_log_name(rank), encoding="utf-8", errors="replace") as fh:
                    first = fh.readline()
            except FileNotFoundError:
                continue
            up = RANK_UP.match_line(first)
            if up is not None and int(up["rank"]) == rank:
                self.started.add(rank)
                self.rank_nodes[rank] = up["host"]
                self.say(first.strip())
                if len(self.started) == n:
                    self.check_span()
                    self.say(ALL_STARTED.line(n=n))
        exits = []
        for rank in range(n):
            exit_file = self.run_dir / rank_exit_name(rank)
            try:
                code = exit_file.read_text().strip() or "?"
                exits.append((code in STOPPED_CODES, exit_file.stat().st_mtime_ns, rank, code))
            except FileNotFoundError:
                continue
        if not exits:
            return
        if self.live and self.survivors is not None:  # replicas: one exit is not the job's end
            for _, _, rank, code in sorted(exits, key=lambda e: e[2]):
                self.survivors.lost(rank, f"exited with code {code} after the endpoint was live")
                if self.health is not None:
                    self.health.forget(rank)
            return
        now = self.clock()
        if self.first_exit_at is None:
            self.first_exit_at = now
        killed = any(by_signal(code) for _, _, _, code in exits)
        if len(exits) < n and not killed and now - self.first_exit_at < EXIT_SETTLE_S:
            return  # srun stops the other ranks on a bad exit: let their codes land too
        # the rank that failed first, not one that srun stopped because of it
        _, _, rank, code = min(exits)
        when = "after" if self.live else "before"
        signalled = [self.signal_of(r) for _, _, r, _ in exits]
        if all(signalled):  # every rank that ended was told to by a signal to the step: no rank failed
            name = signalled[0]
            codes = ", ".join(f"rank {r} code {c}" for _, _, r, c in sorted(exits, key=lambda e: e[2]))
            raise StepSignalled(f"the server step received SIG{name} {when} the endpoint was live (scancel "
                                f"--signal, or Slurm); the ranks stopped ({codes})",
                                signum=SIGNALS.get(name, 15), live=self.live)
        others = ", ".join(f"rank {r} code {c}" for _, _, r, c in sorted(exits, key=lambda e: e[2]) if r != rank)
        raise LaunchFailure(f"rank {rank} on {self.lp.nodes[rank].name} exited with code {code} {when} the endpoint "
                            f"was live" + (f" (then: {others})" if others else ""), rank=rank)

    def check_cores(self, now: float) -> None:
        """A rank whose log says its engine core died will not serve again: end the job (or, once live,
        drop that replica) now, not seconds later when its server has finished its cleanup and exits. In a
        plan of several ranks a peer's exit seen within CORE_DEATH_SETTLE_S is blamed instead (check_ranks)."""
        if not self.watch_cores:
            return
        dropped = self.survivors.dead if self.survivors is not None else {}
        for rank in sorted(self.started):
            if rank in self.core_deaths or rank in dropped:
                continue
            tail = self.tails.get(rank)
            if tail is None:
                tail = self.tails[rank] = Tail(self.run_dir / server_log_name(rank), chunk=TAIL_READ_BYTES,
                                               max_line=TAIL_LINE_BYTES)
            said = next((line for line in tail.lines() if core_died(self.lp.engine, line)), None)
            if said is None:
                continue
            said = said.strip()
            said = said if len(said) <= 200 else said[:197] + "..."
            self.core_deaths[rank] = (now, said)
            if self.live and self.survivors is not None:
                self.survivors.lost(rank, f"lost its engine core after the endpoint was live (its log: {said})")
                if self.health is not None:
                    self.health.forget(rank)
        if not self.core_deaths or (self.live and self.survivors is not None) or self.first_exit_at is not None:
            return
        at, rank = min((at, rank) for rank, (at, _) in self.core_deaths.items())
        if self.lp.ranks > 1 and now - at < CORE_DEATH_SETTLE_S:
            return
        when = "after" if self.live else "before"
        raise LaunchFailure(f"rank {rank} on {self.lp.nodes[rank].name} lost its engine core {when} the endpoint was "
                            f"live (its log: {self.core_deaths[rank][1]})", rank=rank)

    def signal_of(self, rank: int) -> str | None:
        """The signal rank ``rank``'s script received and passed on (``rank-<rank>.signal``), if any."""
        try:
            name = (self.run_dir / rank_signal_name(rank)).read_text().strip()
        except OSError:
            return None
        return name if name in SIGNALS else None

    def check_span(self) -> None:
        """Every node of the allocation runs a rank: the nodes the ranks report are the allocation's
        (``scontrol show hostnames $SLURM_JOB_NODELIST``). A node without a rank would sit idle for the
        whole walltime while another one holds two ranks that fight over its GPUs."""
        def short(name: str) -> str:
            return name.split(".", 1)[0]

        reported = {short(node) for node in self.rank_nodes.values()}
        missing = [node.name for node in self.lp.nodes if short(node.name) not in reported]
        if missing:
            seen = ", ".join(f"rank {r} on {self.rank_nodes[r]}" for r in sorted(self.rank_nodes))
            raise LaunchFailure(f"the server step does not span the allocation: no rank runs on "
                                f"{', '.join(missing)} (the ranks report: {seen}); srun placed more than one rank "
                                "on a node: look for SLURM_*/SRUN_* variables or site defaults that override "
                                "--ntasks-per-node=1")

    def slurm_says(self, missing: list[int]) -> tuple[str, ...]:
        """What Slurm says of the ranks that did not start (``diag``), said before the job ends."""
        if self.diag is None:
            return ()
        try:
            return tuple(self.diag(missing))
        except Exception as err:  # the diagnosis must never hide the failure it explains
            return (DIAG.line(f"asking Slurm failed: {type(err).__name__}: {err}"),)

    def step_ended(self, code: int) -> None:
        deadline = self.clock() + EXIT_SETTLE_S + 0.5
        while self.clock() < deadline:
            self.check_ranks()  # raises once the ranks' exit codes have landed
            self.sleep(0.1)
        n = self.lp.ranks
        if len(self.started) < n:
            raise LaunchFailure(f"srun step exited with code {code} before all ranks started "
                                f"({len(self.started)} of {n}): a bind mount or cache path "
                                "missing inside the container, or the EDF not found",
                                lines=self.slurm_says(sorted(set(range(n)) - self.started)))
        raise LaunchFailure(f"srun step exited with code {code}")

    def probe_once(self, elapsed: float) -> None:
        targets = self.lp.targets
        for t in targets:
            if t.rank in self.ready:
                continue
            if t.rank not in self.listed:
                result = self.probe(t.probe_url, self.lp.served, self.api_key, timeout_s=2.0)
                self.last_probe[t.rank] = result.detail
                if not result.ok:
                    continue
                self.listed.add(t.rank)
            if self.generate is None:
                self.ready.add(t.rank)
            else:
                self.check_generation(t, elapsed)
        if len(self.ready) == len(targets):
            self.live = True
            if self.health is not None:
                self.health.start()
            self.on_live(elapsed)
        elif elapsed > self.lp.budget_s:
            waiting = sorted(set(self.last_probe) - self.ready)
            raise LaunchFailure(f"endpoint not live after {self.lp.budget_s}s (readiness budget): "
                                f"{len(self.ready)} of {len(targets)} answered; last probe of rank "
                                f"{waiting[0]}: {self.last_probe[waiting[0]]}", rank=waiting[0])

    def check_stall(self, now: float) -> None:
        """Before live, once every rank started: the ranks' logs must keep growing. When none grew for
        STARTUP_STALL_S (a multi-node rendezvous that never completes, a rank waiting on a peer that
        stopped), the launch ends naming each rank's phase and last line, instead of idling to the end
        of the readiness budget."""
        sizes = []
        for rank in range(self.lp.ranks):
            try:
                sizes.append((self.run_dir / server_log_name(rank)).stat().st_size)
            except OSError:
                sizes.append(-1)
        if sizes != self.log_sizes or self.grew_at is None:
            self.log_sizes, self.grew_at = sizes, now
            return
        if now - self.grew_at < self.lp.stall_s:
            return
        ranks = "; ".join(self.rank_state(rank) for rank in range(self.lp.ranks))
        raise LaunchFailure(f"startup stalled: no rank's log grew for {self.lp.stall_s}s (STARTUP_STALL_S) before the "
                            f"endpoint was live: {ranks}", rank=0)

    def rank_state(self, rank: int) -> str:
        """``rank R (phase): last line`` from the rank's log."""
        from ..phases import parse_phases, strip_ansi
        from ..tail import last_lines

        try:
            lines = last_lines(self.run_dir / server_log_name(rank), STALL_TAIL_LINES)
        except OSError:
            return f"rank {rank}: no log"
        last_phase = parse_phases(lines).last
        last = next((strip_ansi(line).strip() for line in reversed(lines) if line.strip()), "")
        last = last if len(last) <= 160 else last[:157] + "..."
        return f"rank {rank} ({last_phase.label if last_phase else 'started'}): {last}"

    def check_generation(self, t, elapsed: float) -> None:
        """Live means it generates: once ``t`` lists the served name, a one-token completion must come back.
        An HTTP refusal (other than 429/503, which say "not yet") ends the launch; no answer yet (a first
        forward pass that compiles kernels can take minutes) is asked again, within the readiness budget."""
        check = self.generations.get(t.rank)
        if check is None or check.retry():
            timeout_s = max(1.0, min(GENERATE_TIMEOUT_S, self.lp.budget_s - elapsed))
            check = self.generations[t.rank] = _Generation(
                lambda: self.generate(t.probe_url, self.lp.served, self.api_key, timeout_s=timeout_s),
                self.clock(), background=self.background)
        if not check.done:
            self.last_probe[t.rank] = (f"lists {self.lp.served!r}; a one-token completion has not answered for "
                                       f"{self.clock() - check.started:.0f}s")
            return
        result = check.result
        if result.ok:
            self.ready.add(t.rank)
            return
        self.last_probe[t.rank] = f"lists {self.lp.served!r}; a one-token completion: {result.detail}"
        if result.status is not None and result.status not in NOT_YET:
            raise LaunchFailure(f"rank {t.rank} on {self.lp.nodes[t.rank].name} lists {self.lp.served!r} but cannot "
                                f"generate: a one-token completion answered {result.detail}", rank=t.rank)

    def run(self) -> None:
        """Loop until a failure (raised) or a signal (raised by the launcher's handler)."""
        n = self.lp.ranks
        next_probe = self.t0
        while True:
            self.check_ranks()
            code = self.step.poll()
            if code is not None:
                self.step_ended(code)
            now = self.clock()
            self.check_cores(now)
            elapsed = now - self.t0
            if len(self.started) < n and elapsed > self.lp.rank_start_s:
                missing = sorted(set(range(n)) - self.started)
                raise LaunchFailure(f"only {len(self.started)} of {n} ranks started within "
                                    f"{self.lp.rank_start_s}s (missing: {', '.join(map(str, missing))}): Slurm did "
                                    "not place them, or the run directory is not shared between nodes",
                                    lines=self.slurm_says(missing))
            if not self.live and len(self.started) == n and self.lp.stall_s:
                self.check_stall(now)
            if not self.live and now >= next_probe:
                next_probe = now + PROBE_EVERY_S
                self.probe_once(elapsed)
            # --- meter (launch/meter.py): phase times, request counters; raises IdleStop ---
            if self.meter is not None:
                self.meter.tick(now, len(self.started), self.live)
            # --- end meter ---
            if self.live and self.health is not None:
                self.check_health()
            if self.live and self.router is not None:
                self.router.tick()  # launch/router.py: the router gone ends the job
            if self.live and self.pool is not None:
                self.pool.tick()  # launch/pool.py: grows and shrinks the router's pool
            if self.live and self.successor is not None:
                self.successor.tick()  # raises HandedOver once the successor is live and drained
            self.sleep(POLL_S)

    def check_health(self) -> None:
        """A serving rank silent for HEALTH_FAIL_AFTER_S, or stuck for PROGRESS_STALL_AFTER_S: a lost
        replica, or the end of the job."""
        for rank, what in self.health.tick():
            if self.survivors is not None:
                self.survivors.lost(rank, what)
            else:
                raise LaunchFailure(f"rank {rank} on {self.lp.nodes[rank].name} {what}", rank=rank)
