"""The elastic pool's decisions (``MAX_REPLICAS``): readings in, grow and shrink decisions out.

Pure: no process, no file, no network, no clock of its own (every call gets ``now``). ``launch.pool``
reads the engines' and the router's ``/metrics``, feeds :class:`QueueWait` and :class:`PoolPolicy`,
and carries out what they decide.

The queue wait is what a request waits in an engine's queue before it runs. Each engine's reading
gives the requests waiting now and its queue-time histogram's sum and count (vLLM
``vllm:request_queue_time_seconds_sum`` and ``_count``, SGLang ``sglang:queue_time_seconds_sum`` and
``_count``): between two readings the requests that left the queue waited ``d(sum) / d(count)`` on
average. While requests wait and none left the queue, the wait grows with the time between the readings.
The pool's wait is the worst of its engines'.

:class:`PoolPolicy` grows by one replica once the wait stayed above ``SCALE_UP_WAIT_S`` for
``SCALE_UP_WINDOW_S``: never above ``MAX_REPLICAS``, never while a grown replica is still on its way,
never when the walltime left is shorter than a replica's start-up (the longest seen so far, at first
the job's own). A replica it added and that got no request for ``IDLE_STOP_AFTER_S`` is released;
the replicas the job started with never are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from .idle import parse_prometheus

# each engine's queue: (waiting gauge, queue-time histogram's sum, its count)
QUEUE_METRICS: dict[str, tuple[str, str, str]] = {
    "vllm": ("vllm:num_requests_waiting", "vllm:request_queue_time_seconds_sum",
             "vllm:request_queue_time_seconds_count"),
    "sglang": ("sglang:num_queue_reqs", "sglang:queue_time_seconds_sum", "sglang:queue_time_seconds_count"),
}


@dataclass(frozen=True)
class QueueReading:
    """One engine's queue: requests waiting now; the queue-time histogram's sum and count (None: none)."""

    waiting: float
    wait_sum_s: float | None = None
    wait_count: float | None = None


def read_queue(engine: str, text: str) -> QueueReading | None:
    """An engine's queue from its Prometheus text; None when it has no waiting gauge."""
    names = QUEUE_METRICS.get(engine)
    if names is None:
        return None
    values = parse_prometheus(text)
    gauge, total, count = names
    if gauge not in values:
        return None
    s, c = values.get(total), values.get(count)
    return QueueReading(values[gauge], s, c) if s is not None and c is not None else QueueReading(values[gauge])


class QueueWait:
    """The pool's queue wait from successive readings of its engines (keyed by worker URL)."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[float, QueueReading, float]] = {}  # worker -> (time, reading, its wait)

    def feed(self, now: float, readings: Mapping[str, QueueReading | None]) -> float | None:
        """The worst wait over ``readings`` (None when no engine could be read); workers not in
        ``readings`` are forgotten (they left the pool)."""
        waits = []
        for worker in list(self._last):
            if worker not in readings:
                del self._last[worker]
        for worker, reading in readings.items():
            if reading is None:
                continue
            before = self._last.get(worker)
            wait = 0.0
            if before is not None:
                t0, r0, w0 = before
                left = (reading.wait_count - r0.wait_count
                        if reading.wait_count is not None and r0.wait_count is not None else 0.0)
                if left > 0:
                    wait = max(0.0, (reading.wait_sum_s - r0.wait_sum_s) / left)
                elif reading.waiting > 0:  # nobody left the queue: those in it waited on
                    wait = w0 + max(0.0, now - t0)
            self._last[worker] = (now, reading, wait)
            waits.append(wait)
        return max(waits) if waits else None


@dataclass(frozen=True)
class Bounds:
    """The keys that bound the pool: the replicas the job started with, ``MAX_REPLICAS``,
    ``SCALE_UP_WAIT_S``, ``SCALE_UP_WINDOW_S`` and ``IDLE_STOP_AFTER_S`` (None: added replicas stay)."""

    started: int
    max_replicas: int
    wait_s: float
    window_s: float
    idle_s: float | None


@dataclass(frozen=True)
class Decision:
    """``grow`` (``job`` None) or ``shrink`` (``job``: the added replica's job), and why, in words."""

    action: str
    job: str | None
    why: str


@dataclass
class PoolPolicy:
    """The pool's state: replicas added (live), one on its way, the pressure window, start-up times."""

    bounds: Bounds
    startup_s: float  # the job's own time to live: the first guess at a replica's start-up
    added: list[str] = field(default_factory=list)
    pending: str | None = None
    pressure_since: float | None = None

    @property
    def size(self) -> int:
        """Replicas serving or on their way: the started ones, the added ones and a pending one."""
        return self.bounds.started + len(self.added) + (self.pending is not None)

    def decide(self, now: float, wait_s: float | None, time_left_s: float | None,
               idle_for: Mapping[str, float]) -> list[Decision]:
        """This reading's decisions: ``wait_s`` the pool's queue wait (None: unreadable, no pressure),
        ``time_left_s`` the job's walltime left (None: unlimited), ``idle_for`` each added replica's
        seconds without a request."""
        out = self._shrink(idle_for)
        b = self.bounds
        if wait_s is None or wait_s <= b.wait_s:
            self.pressure_since = None
            return out
        if self.pressure_since is None:
            self.pressure_since = now
        lasted = now - self.pressure_since
        if lasted < b.window_s or self.pending is not None or out:
            return out
        if self.size >= b.max_replicas:
            return out
        if time_left_s is not None and time_left_s <= self.startup_s:
            return out
        self.pressure_since = None  # a fresh window for the next replica
        return out + [Decision("grow", None, f"requests waited {wait_s:.1f}s in an engine's queue (above "
                                             f"SCALE_UP_WAIT_S={b.wait_s:g}) for {lasted:.0f}s (SCALE_UP_WINDOW_S="
                                             f"{b.window_s:g}); {self.size} of MAX_REPLICAS={b.max_replicas} "
                                             "replicas serve")]

    def _shrink(self, idle_for: Mapping[str, float]) -> list[Decision]:
        idle_s = self.bounds.idle_s
        if idle_s is None:
            return []
        return [Decision("shrink", job, f"no request for {idle_for[job]:.0f}s (IDLE_STOP_AFTER_S={idle_s:g})")
                for job in self.added if idle_for.get(job, 0.0) >= idle_s]

    # what launch.pool tells the policy back
    def submitted(self, job: str) -> None:
        self.pending = job

    def joined(self, job: str, startup_s: float) -> None:
        """The pending replica serves behind the router; its start-up took ``startup_s``."""
        if self.pending == job:
            self.pending = None
        if job not in self.added:
            self.added.append(job)
        self.startup_s = max(self.startup_s, startup_s)
        self.pressure_since = None  # the pool is bigger: measure it afresh

    def failed(self, job: str) -> None:
        """The pending replica never joined (refused, ended, or too slow)."""
        if self.pending == job:
            self.pending = None

    def released(self, job: str) -> None:
        if job in self.added:
            self.added.remove(job)

