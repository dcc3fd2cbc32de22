"""The health watch: once the endpoint is live, notice a serving rank that stopped answering ``/health``.

A server can hang without exiting (a deadlocked collective, a stuck scheduler): its process lives,
its port accepts, nothing answers. :class:`HealthWatch` probes every serving rank (in the job,
:func:`generating_health`: ``GET /health`` and a one-token completion, since vLLM's ``/health`` stays
200 while its engine core is stopped)
(vLLM: 200 when the engine is healthy; SGLang: rank 0 of a pipeline server, each replica in replicas
mode) every ``interval_s``, each probe with its own generous timeout, and reports a rank that gave no
healthy answer for ``fail_after_s`` (the launch key ``HEALTH_FAIL_AFTER_S``, docs/keys.md). What to do
about it (end the job, or drop a replica) is the supervision loop's call.

Probes run in background threads (at most one in flight per rank), so a slow answer never delays
the supervision loop; with ``background=False`` (the tests) they run inline. The clock and the
probe are injected.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable, Mapping

from .. import keys as keytable
from ..urls import api_base, server_root

INTERVAL_MAX_S = 30.0
TIMEOUT_MAX_S = 60.0


@dataclass(frozen=True)
class HealthSettings:
    fail_after_s: int  # 0: the watch is off
    interval_s: float
    timeout_s: float


def health_settings(keys: Mapping[str, str]) -> HealthSettings:
    """``HEALTH_FAIL_AFTER_S`` (default 600, ``0`` turns the watch off); the probe interval is a fifth of
    it, at most 30s, and each probe may take half of it, at most 60s. A value that is not a whole
    number of seconds is an error naming the key."""
    fail = keytable.value(keys, "HEALTH_FAIL_AFTER_S")
    return HealthSettings(fail, min(INTERVAL_MAX_S, max(1.0, fail / 5)), min(TIMEOUT_MAX_S, max(1.0, fail / 2)))


def health_url(base_url: str) -> str:
    """``http://host:port/v1`` -> ``http://host:port/health`` (both engines serve it at the root)."""
    return server_root(base_url) + "/health"


def get_health(url: str, timeout_s: float) -> tuple[bool, str]:
    """One ``GET /health``: (healthy, what was seen). Healthy is a 2xx answer."""
    from .. import httpclient

    try:
        answer = httpclient.get(url, timeout_s, accept=None, limit=0, error_limit=0)
    except httpclient.HttpError as err:
        if err.status is not None:
            return False, f"HTTP {err.status}"
        if err.timed_out:
            return False, f"no answer within {timeout_s:g}s"
        return False, f"no answer: {err.reason}"
    return 200 <= answer.status < 300, f"HTTP {answer.status}"


class OwnRequests:
    """The launcher's own requests to the engine (the health watch's one-token completions), counted so
    that the request counters idle release and the GPU-hour accounting read can leave them out."""

    def __init__(self):
        self.lock = threading.Lock()
        self.sent = 0  # counted before sending: a reading taken meanwhile never sees a request of ours as a client's
        self.in_flight = 0

    def begin(self) -> None:
        with self.lock:
            self.sent += 1
            self.in_flight += 1

    def end(self) -> None:
        with self.lock:
            self.in_flight -= 1


def generating_health(generate: Callable, served: str, api_key: str | None,
                      own: OwnRequests) -> Callable[[str, float], tuple[bool, str]]:
    """A health probe that also asks for one token: ``GET /health``, then (when healthy) a one-token
    completion at the same server's ``/v1``. vLLM answers ``/health`` from its API server, which stays
    up while its engine core is stopped or stuck (``/health`` then still says 200), so only a
    generation shows the engine can work. ``generate`` is ``readiness.generates``."""

    def get(url: str, timeout_s: float) -> tuple[bool, str]:
        ok, seen = get_health(url, timeout_s)
        if not ok:
            return ok, seen
        root = url[: -len("/health")] if url.endswith("/health") else url.rstrip("/")
        own.begin()
        try:
            result = generate(api_base(root), served, api_key, timeout_s=timeout_s)
        finally:
            own.end()
        if result.ok:
            return True, seen
        return False, f"/health {seen}, but a one-token completion: {result.detail}"

    return get


@dataclass
class RankHealth:
    url: str
    last_ok_at: float  # the clock at the last healthy answer (or when the watch began)
    last_seen: str = "not probed yet"
    in_flight: bool = False
    next_at: float = 0.0


class HealthWatch:
    """``tick()`` in the supervision loop; it returns the ranks that went ``fail_after_s`` without a
    healthy answer, each with a line saying what was last seen (each rank is reported once)."""

    def __init__(self, urls: Mapping[int, str], settings: HealthSettings, *, clock: Callable[[], float] = time.monotonic,
                 get: Callable[[str, float], tuple[bool, str]] = get_health, background: bool = True):
        self.settings, self.clock, self.get, self.background = settings, clock, get, background
        now = clock()
        self.ranks = {r: RankHealth(u, now, next_at=now) for r, u in urls.items()}
        self.lock = threading.Lock()

    def start(self) -> None:
        """The endpoint went live: every rank's silence counts from now."""
        now = self.clock()
        with self.lock:
            for h in self.ranks.values():
                h.last_ok_at, h.next_at = now, now

    @property
    def enabled(self) -> bool:
        return self.settings.fail_after_s > 0 and bool(self.ranks)

    def forget(self, rank: int) -> None:
        """Stop watching a rank (a replica already counted as dead)."""
        with self.lock:
            self.ranks.pop(rank, None)

    def _probe(self, rank: int, h: RankHealth) -> None:
        ok, seen = self.get(h.url, self.settings.timeout_s)
        with self.lock:
            h.in_flight = False
            h.last_seen = seen
            if ok:
                h.last_ok_at = self.clock()

    def tick(self) -> list[tuple[int, str]]:
        if not self.enabled:
            return []
        now = self.clock()
        hung = []
        with self.lock:
            due = [(r, h) for r, h in self.ranks.items() if not h.in_flight and now >= h.next_at]
            for _, h in due:
                h.in_flight = True
                h.next_at = now + self.settings.interval_s
        for r, h in due:
            if self.background:
                threading.Thread(target=self._probe, args=(r, h), daemon=True, name=f"health-{r}").start()
            else:
                self._probe(r, h)
        now = self.clock()
        with self.lock:
            for r, h in list(self.ranks.items()):
                silent = now - h.last_ok_at
                if silent >= self.settings.fail_after_s:
                    pending = " (a probe still waits for its answer)" if h.in_flight else ""
                    hung.append((r, f"no healthy answer from {h.url} for {silent:.0f}s "
                                    f"(HEALTH_FAIL_AFTER_S={self.settings.fail_after_s}); last seen: "
                                    f"{h.last_seen}{pending}"))
                    del self.ranks[r]
        return hung
