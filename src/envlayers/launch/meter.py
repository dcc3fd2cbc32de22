"""The supervision loop's meter: when each startup phase began, whether requests are served, idle release.

The side-effect half of ``launch.idle`` and ``envlayers.accounting``: :class:`Meter` is called once per
pass of the supervision loop (``tick``). Before the endpoint is live it notes the wall-clock time at
which every rank had started and at which rank 0's log entered each startup phase. Once live it reads
the engines' ``/metrics`` every ``SAMPLE_EVERY_S`` (a tenth of a shorter ``IDLE_STOP_AFTER_S``), feeds an :class:`~envlayers.launch.idle.IdleTracker`,
prints the ``IDLE_WARN_AFTER_S`` warning and raises :class:`IdleStop` after ``IDLE_STOP_AFTER_S``
without a request. In the gateway shape it also says, once live, the gateway's own lines from rank 0's
log (a replica died, was replaced, too few are healthy). It keeps ``accounting.json`` in the run directory up to date (atomically, every
``WRITE_EVERY_S`` and at the end) so ``status`` shows the split while the job runs.
"""

from __future__ import annotations

import json
import re
import time
from typing import Callable, Mapping

from .. import keys as keytable
from ..rundir import RecordWriter
from .gatewaystate import GatewayState
from .idle import Counters, IdleTracker, read_counters
from .prepare import LaunchPlan

SAMPLE_EVERY_S = 5.0  # each sample is a GET /metrics per serving rank, and a line in vLLM's access log
MIN_SAMPLE_EVERY_S = 0.5
WRITE_EVERY_S = 10.0
_REPLICA_RE = re.compile(r'^[A-Za-z_:][A-Za-z0-9_:]*\{replica="([^"]*)"')  # the gateway's label, first
GATEWAY_LINES = tuple(f"ENVLAYERS-{kind}: gateway: " for kind in ("ERROR", "WARN", "STAGE"))


class IdleStop(Exception):
    """No request for IDLE_STOP_AFTER_S: the job ends cleanly (exit 0)."""


def idle_seconds(keys: Mapping[str, str], key: str) -> float | None:
    """IDLE_STOP_AFTER_S / IDLE_WARN_AFTER_S: absent or empty = never; a positive number of seconds."""
    return keytable.value(keys, key)


# the gateway's /metrics waits up to gateway_app.READ_TIMEOUT_S (3 s) for a slow replica's reader, then
# answers with that replica named in a comment: the meter waits for that answer rather than lose the reading
GATEWAY_FETCH_TIMEOUT_S = 5.0


def fetch_metrics(url: str, api_key: str | None, timeout_s: float = 2.0) -> str | None:
    """GET a /metrics URL; None when it does not answer 200."""
    from .. import httpclient

    try:
        answer = httpclient.get(url, timeout_s, api_key=api_key, accept=None, limit=4 << 20, error_limit=0)
    except httpclient.HttpError:
        return None
    return answer.text() if answer.status == 200 else None


def metrics_urls(lp: LaunchPlan) -> list[str]:
    return [(t.probe_url[:-3] if t.probe_url.endswith("/v1") else t.probe_url.rstrip("/")) + "/metrics"
            for t in lp.targets]


class Meter:
    def __init__(self, lp: LaunchPlan, keys: Mapping[str, str], say: Callable[[str], None], *,
                 api_key: str | None = None, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time, fetch: Callable[..., str | None] = fetch_metrics,
                 job_start: float | None = None, own=None):
        self.lp, self.say, self.api_key, self.clock, self.wall, self.fetch = lp, say, api_key, clock, wall, fetch
        self.own = own  # launch.health.OwnRequests: the launcher's own requests, left out of the counters
        self.router = None  # launch.router.Router (ROUTER=smg): set by the launcher
        self._finished_seen = 0.0  # the most finished requests of clients reported so far
        self.stop_after_s = idle_seconds(keys, "IDLE_STOP_AFTER_S")
        self.warn_after_s = idle_seconds(keys, "IDLE_WARN_AFTER_S")
        self.offset = wall() - clock()  # monotonic -> wall clock
        self.job_start = job_start if job_start is not None else wall()
        self.ranks_up_at: float | None = None
        self.phases: dict[str, float] = {}
        self.tracker: IdleTracker | None = None
        self.live_at: float | None = None
        self.next_sample = 0.0
        self.next_write = 0.0
        self._phase_tracker = None
        self._log_pos = 0
        self._partial = b""  # the gateway's log after live: an unfinished last line
        self._replicas: dict[str, Counters] = {}  # the gateway: each replica's last counters
        self._finished_before = 0.0  # the gateway: requests finished by replicas replaced since
        self._gateway_state = GatewayState()  # the gateway: replicas healthy and their events, for status
        self._gateway_scanned = False  # the gateway: the lines before live were read for that record
        # a tenth of a short IDLE_STOP_AFTER_S, so that the stop is never late by more than that
        self.sample_every_s = max(MIN_SAMPLE_EVERY_S, min(SAMPLE_EVERY_S, (self.stop_after_s or 1e9) / 10))
        self.engine = lp.engine  # an engine idle.METRIC_NAMES does not know reads as "counters unreadable"
        self.records = RecordWriter(say)  # a write the OS refuses is said once, and the job goes on

    @property
    def gpus(self) -> int:
        return self.lp.plan.nodes * self.lp.plan.gpus_per_node

    def _w(self, mono: float) -> float:
        return round(mono + self.offset, 3)

    def _phases(self, now: float) -> None:
        from ..phases import PhaseTracker

        if self._phase_tracker is None:
            self._phase_tracker = PhaseTracker()
        try:
            with open(self.lp.run_dir / "server-0.log", "rb") as fh:
                fh.seek(self._log_pos)
                chunk = fh.read(1 << 20)
        except FileNotFoundError:
            return
        self._log_pos += len(chunk)
        for phase in self._phase_tracker.feed_bytes(chunk):
            self.phases.setdefault(phase.name, self._w(now))

    def tick(self, now: float, started: int, live: bool) -> None:
        """One pass of the loop: ``started`` ranks have printed their first line; ``live``: every
        readiness target answered. Raises IdleStop."""
        if self.ranks_up_at is None and started >= self.lp.ranks:
            self.ranks_up_at = self._w(now)
        if not live:
            self._phases(now)
            if now >= self.next_write:  # status shows the way to live while it lasts
                self.next_write = now + WRITE_EVERY_S
                self.write(final=False)
            return
        if self.tracker is None:
            self._phases(now)
            self.live_at = self._w(now)
            self.tracker = IdleTracker(now, self.stop_after_s, self.warn_after_s)
            self.next_sample = now
            self._first_sample(now)
            return
        if self.lp.plan.shape == "gateway":
            self._relay_gateway()
        if now >= self.next_sample:
            self.next_sample = now + self.sample_every_s
            for decision in self.tracker.feed(now, self.sample()):
                idle = self.tracker.idle_for(now)
                if decision == "warn":
                    left = (f"; the job ends in {self.stop_after_s - idle:.0f}s (IDLE_STOP_AFTER_S="
                            f"{self.stop_after_s:g})" if self.stop_after_s else "")
                    self.say(f"ENVLAYERS-WARN: no request served for {idle:.0f}s (IDLE_WARN_AFTER_S="
                             f"{self.warn_after_s:g}){left}")
                elif decision == "stop":
                    self.say(f"ENVLAYERS-STAGE: idle stop: no request served for {idle:.0f}s "
                             f"(IDLE_STOP_AFTER_S={self.stop_after_s:g}); ending the job cleanly")
                    raise IdleStop(f"idle stop: no request for {idle:.0f}s (IDLE_STOP_AFTER_S="
                                   f"{self.stop_after_s:g})")
        if now >= self.next_write:
            self.next_write = now + WRITE_EVERY_S
            self.write(final=False)

    def _relay_gateway(self) -> None:
        """Once live, the gateway's own lines in rank 0's log (a replica died, was replaced; too few
        healthy) are said in the job output too, as they come. The record status shows starts from the
        lines before live too (the ready line says how many replicas serve), which are not said again."""
        changed = False
        try:
            with open(self.lp.run_dir / "server-0.log", "rb") as fh:
                if not self._gateway_scanned:  # once: what was said before live
                    self._gateway_scanned = True
                    # the hand-over from the phase reader: it may have stopped inside a line, whose start is
                    # kept as the unfinished line, so the line is said whole once its end comes
                    *before, self._partial = fh.read(self._log_pos).split(b"\n")
                    for raw in before:
                        changed = self._gateway_state.feed(raw.decode("utf-8", "replace").rstrip()) or changed
                fh.seek(self._log_pos)
                chunk = fh.read(1 << 20)
        except FileNotFoundError:
            return
        self._log_pos += len(chunk)
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        for raw in lines:
            line = raw.decode("utf-8", "replace").rstrip()
            if line.startswith(GATEWAY_LINES):
                self.say(line)
                changed = self._gateway_state.feed(line) or changed
        if changed:  # status and wait show it from endpoint.json, which the launcher wrote once live
            path = self.lp.run_dir / "endpoint.json"
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                return
            data["gateway"] = self._gateway_state.record
            self.records.write(path, json.dumps(data, indent=2) + "\n")

    def sample(self) -> Counters | None:
        """The request counters summed over every serving rank; None when one of them cannot be read. The
        gateway's one /metrics holds every replica's samples, each labelled ``replica``: see :meth:`_gateway`."""
        if self.router is not None:  # ROUTER: every client request once, none of ours
            return self.router.counters()
        if not self.lp.metrics:
            return None
        total = None
        for url in metrics_urls(self.lp):
            if self.lp.plan.shape == "gateway":
                text = self.fetch(url, self.api_key, timeout_s=GATEWAY_FETCH_TIMEOUT_S)
            else:
                text = self.fetch(url, self.api_key)
            if text is not None and self.lp.plan.shape == "gateway":
                counters = self._gateway(text)
            else:
                counters = read_counters(self.engine, text) if text is not None else None
            if counters is None:
                return None
            total = counters if total is None else Counters(total.finished + counters.finished,
                                                            total.in_flight + counters.in_flight)
        return self._clients_only(total)

    def _clients_only(self, total: Counters | None) -> Counters | None:
        """``total`` without the launcher's own requests (the health watch's one-token completions). Ours are
        counted before they are sent, so a reading taken while one is in flight shows fewer finished
        requests than the last: the finished count reported never goes back (nor counts one of ours)."""
        if total is None or self.own is None:
            return total
        with self.own.lock:
            sent, in_flight = self.own.sent, self.own.in_flight
        self._finished_seen = max(self._finished_seen, total.finished - sent)
        return Counters(self._finished_seen, max(0.0, total.in_flight - in_flight))

    def _gateway(self, text: str) -> Counters | None:
        """The gateway's counters, read per replica so the total never goes back: a replica that did not
        answer counts with what it last said, and one whose counter restarted (Serve replaced it, with a
        new server) keeps what the old one had finished."""
        per: dict[str, list[str]] = {}
        for line in text.splitlines():
            m = _REPLICA_RE.match(line)
            if m:
                per.setdefault(m.group(1), []).append(line)
        seen = {r: read_counters(self.engine, "\n".join(lines)) for r, lines in per.items()}
        seen = {r: c for r, c in seen.items() if c is not None}
        if not seen and not self._replicas:
            return None
        for r, c in seen.items():
            before = self._replicas.get(r)
            if before is not None and c.finished < before.finished:  # a new server behind this label
                self._finished_before += before.finished
            self._replicas[r] = c
        finished = self._finished_before + sum(c.finished for c in self._replicas.values())
        return Counters(finished, sum(c.in_flight for r, c in self._replicas.items() if r in seen))

    def _first_sample(self, now: float) -> None:
        first = self.sample()
        self.tracker.feed(now, first)
        if first is None:
            why = ("SGLang runs without --enable-metrics (SGLANG_ENABLE_METRICS is off)" if not self.lp.metrics
                   else f"no request counters at {', '.join(self._counter_urls())}")
            what = "idle release is off" if self.stop_after_s or self.warn_after_s else "serving and idle time unknown"
            self.say(f"ENVLAYERS-WARN: cannot read the engine's request counters ({why}): {what}")
        elif self.stop_after_s or self.warn_after_s:
            bits = [f"stop after {self.stop_after_s:g}s" if self.stop_after_s else None,
                    f"warn after {self.warn_after_s:g}s" if self.warn_after_s else None]
            self.say(f"ENVLAYERS-STAGE: idle release: {', '.join(b for b in bits if b)} without a request "
                     f"(request counters from {', '.join(self._counter_urls())})")

    def _counter_urls(self) -> list[str]:
        if self.router is not None:
            return [self.router.record()["metrics_url"] + " (the router's)"]
        return metrics_urls(self.lp)

    def timeline(self, end_wall: float | None = None, died_wall: float | None = None) -> dict:
        t = self.tracker
        return {
            "job_id": self.lp.job_id, "restart": self.lp.restart, "gpus": self.gpus, "nodes": self.lp.plan.nodes,
            "shape": self.lp.plan.shape, "engine": self.lp.engine, "model": self.lp.model, "served": self.lp.served,
            "job_start": round(self.job_start, 3), "ranks_up_at": self.ranks_up_at, "phases": self.phases,
            "live_at": self.live_at,
            "last_request_at": self._w(t.last_request_at) if t and t.last_request_at is not None else None,
            "live": t.to_dict() if t else None, "idle_stop_after_s": self.stop_after_s,
            "died_at": died_wall, "ended_at": end_wall,
        }

    def write(self, *, final: bool, end_wall: float | None = None, died_wall: float | None = None,
              how: str | None = None) -> None:
        """accounting.json: the timeline and its split in GPU-hours (``envlayers.accounting``)."""
        from ..accounting import split

        tl = self.timeline(end_wall, died_wall)
        tl["final"] = final
        tl["how"] = how
        tl["split"] = split(tl, now=self.wall())
        self.records.write(self.lp.run_dir / "accounting.json", json.dumps(tl, indent=2) + "\n")


def job_start_time(environ: Mapping[str, str]) -> float | None:
    """SLURM_JOB_START_TIME (epoch seconds; set by Slurm in the job's environment), else None."""
    raw = environ.get("SLURM_JOB_START_TIME", "")
    return float(raw) if raw.strip().isdigit() else None

