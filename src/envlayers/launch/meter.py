"""The supervision loop's meter: idle release, and the pass that drives the job's other measures.

:class:`Meter` is called once per pass of the supervision loop (``tick``) and owns idle release: once
live it reads the request counters (``launch.counters``) every ``SAMPLE_EVERY_S`` (a tenth of a shorter
``IDLE_STOP_AFTER_S``), feeds an :class:`~envlayers.launch.idle.IdleTracker`, prints the
``IDLE_WARN_AFTER_S`` warning and raises :class:`IdleStop` after ``IDLE_STOP_AFTER_S`` without a request.
The rest it hands on: the phase times and ``accounting.json`` to ``launch.timeline`` (written every
``WRITE_EVERY_S`` and at the end, so ``status`` shows the split while the job runs), and in the gateway
shape the gateway's own lines to ``launch.gatewaylog`` once live.
"""

from __future__ import annotations

import time
from typing import Callable, Mapping

from .. import keys as keytable
from ..joblines import STAGE, WARN
from ..rundir import IDLE_STOP_REASON, RecordWriter
from .counters import RequestCounters, fetch_metrics, metrics_urls
from .gatewaylog import GatewayRelay
from .idle import Counters, IdleTracker
from .prepare import LaunchPlan
from .timeline import Timeline

SAMPLE_EVERY_S = 5.0  # each sample is a GET /metrics per serving rank, and a line in vLLM's access log
MIN_SAMPLE_EVERY_S = 0.5
WRITE_EVERY_S = 10.0


class IdleStop(Exception):
    """No request for IDLE_STOP_AFTER_S: the job ends cleanly (exit 0)."""


def idle_seconds(keys: Mapping[str, str], key: str) -> float | None:
    """IDLE_STOP_AFTER_S / IDLE_WARN_AFTER_S: absent or empty = never; a positive number of seconds."""
    return keytable.value(keys, key)


class Meter:
    def __init__(self, lp: LaunchPlan, keys: Mapping[str, str], say: Callable[[str], None], *,
                 api_key: str | None = None, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time, fetch: Callable[..., str | None] = fetch_metrics,
                 job_start: float | None = None, own=None):
        self.lp, self.say = lp, say
        self.stop_after_s = idle_seconds(keys, "IDLE_STOP_AFTER_S")
        self.warn_after_s = idle_seconds(keys, "IDLE_WARN_AFTER_S")
        self.counters = RequestCounters(lp, api_key=api_key, fetch=fetch, own=own)
        # a write the OS refuses is said once, and the job goes on
        self.timeline = Timeline(lp, RecordWriter(say), clock=clock, wall=wall, job_start=job_start)
        self.relay: GatewayRelay | None = None  # the gateway shape, once live
        self.router = None  # launch.router.Router (ROUTER=smg): set by the launcher
        self.tracker: IdleTracker | None = None
        self.next_sample = 0.0
        self.next_write = 0.0
        # a tenth of a short IDLE_STOP_AFTER_S, so that the stop is never late by more than that
        self.sample_every_s = max(MIN_SAMPLE_EVERY_S, min(SAMPLE_EVERY_S, (self.stop_after_s or 1e9) / 10))

    def sample(self) -> Counters | None:
        if self.router is not None:  # ROUTER: every client request once, none of ours
            return self.router.counters()
        return self.counters.sample()

    def tick(self, now: float, started: int, live: bool) -> None:
        """One pass of the loop: ``started`` ranks have printed their first line; ``live``: every
        readiness target answered. Raises IdleStop."""
        if started >= self.lp.ranks:
            self.timeline.ranks_started(now)
        if not live:
            self.timeline.read_phases(now)
            if now >= self.next_write:  # status shows the way to live while it lasts
                self.next_write = now + WRITE_EVERY_S
                self.write(final=False)
            return
        if self.tracker is None:
            self.timeline.went_live(now)
            self.tracker = IdleTracker(now, self.stop_after_s, self.warn_after_s)
            self.next_sample = now
            if self.lp.plan.shape == "gateway":  # from where the phase reader stopped
                self.relay = GatewayRelay(self.timeline.log, self.say)
            self._first_sample(now)
            return
        if self.relay is not None:
            self.relay.relay()
        if now >= self.next_sample:
            self.next_sample = now + self.sample_every_s
            self._idle(now)
        if now >= self.next_write:
            self.next_write = now + WRITE_EVERY_S
            self.write(final=False)

    def _idle(self, now: float) -> None:
        for decision in self.tracker.feed(now, self.sample()):
            idle = self.tracker.idle_for(now)
            if decision == "warn":
                left = (f"; the job ends in {self.stop_after_s - idle:.0f}s (IDLE_STOP_AFTER_S="
                        f"{self.stop_after_s:g})" if self.stop_after_s else "")
                self.say(WARN.line(f"no request served for {idle:.0f}s (IDLE_WARN_AFTER_S="
                                   f"{self.warn_after_s:g}){left}"))
            elif decision == "stop":
                self.say(STAGE.line(f"idle stop: no request served for {idle:.0f}s "
                                    f"(IDLE_STOP_AFTER_S={self.stop_after_s:g}); ending the job cleanly"))
                raise IdleStop(f"{IDLE_STOP_REASON}: no request for {idle:.0f}s (IDLE_STOP_AFTER_S="
                               f"{self.stop_after_s:g})")

    def _first_sample(self, now: float) -> None:
        first = self.sample()
        self.tracker.feed(now, first)
        if first is None:
            why = ("SGLang runs without --enable-metrics (SGLANG_ENABLE_METRICS is off)" if not self.lp.metrics
                   else f"no request counters at {', '.join(self._counter_urls())}")
            what = "idle release is off" if self.stop_after_s or self.warn_after_s else "serving and idle time unknown"
            self.say(WARN.line(f"cannot read the engine's request counters ({why}): {what}"))
        elif self.stop_after_s or self.warn_after_s:
            bits = [f"stop after {self.stop_after_s:g}s" if self.stop_after_s else None,
                    f"warn after {self.warn_after_s:g}s" if self.warn_after_s else None]
            self.say(STAGE.line(f"idle release: {', '.join(b for b in bits if b)} without a request "
                                f"(request counters from {', '.join(self._counter_urls())})"))

    def _counter_urls(self) -> list[str]:
        if self.router is not None:
            return [self.router.record()["metrics_url"] + " (the router's)"]
        return metrics_urls(self.lp)

    def write(self, *, final: bool, end_wall: float | None = None, died_wall: float | None = None,
              how: str | None = None) -> None:
        """accounting.json (``launch.timeline``), with the idle tracker's live time once live."""
        self.timeline.write(self.tracker, self.stop_after_s, final=final, end_wall=end_wall, died_wall=died_wall,
                            how=how)
