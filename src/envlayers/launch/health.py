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

Progress: ``/health`` can answer 200 while the engine no longer generates (a stuck scheduler or engine
core behind a live API server). With ``stall_after_s`` (the launch key ``PROGRESS_STALL_AFTER_S``) the
rank's ``/metrics`` is read every interval too (apart from the probe, which may hang): while there is work to do (requests running or waiting, or the
watch's own one-token completion sent since the last reading) and the generated-token counter does not
advance for ``stall_after_s``, the rank is reported as stuck even though ``/health`` answers. An idle
engine has nothing to do, so the watch's one-token completion stands in for a client's request.
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
    fail_after_s: int  # 0: the /health clock is off
    interval_s: float
    timeout_s: float
    stall_after_s: int = 0  # 0: the progress clock is off


def health_settings(keys: Mapping[str, str]) -> HealthSettings:
    """``HEALTH_FAIL_AFTER_S`` (default 600) and ``PROGRESS_STALL_AFTER_S`` (default 300), ``0`` turning
    each off; the probe interval is a fifth of the shorter, at most 30s, and each probe may take half of
    ``HEALTH_FAIL_AFTER_S``, at most 60s. A value that is not a whole number of seconds is an error naming
    the key."""
    fail = keytable.value(keys, "HEALTH_FAIL_AFTER_S")
    stall = keytable.value(keys, "PROGRESS_STALL_AFTER_S")
    shortest = min([x for x in (fail, stall) if x] or [0])
    return HealthSettings(fail, min(INTERVAL_MAX_S, max(1.0, shortest / 5)),
                          min(TIMEOUT_MAX_S, max(1.0, (fail or stall) / 2)), stall)


def read_progress(engine: str, text: str) -> tuple[float, float] | None:
    """(generated tokens so far, requests running or waiting now) from a ``/metrics`` text; None when
    the engine's generated-token counter is not there."""
    from .idle import GENERATED_TOKENS, METRIC_NAMES, parse_prometheus

    name = GENERATED_TOKENS.get(engine)
    values = parse_prometheus(text)
    if name is None or name not in values:
        return None
    return values[name], sum(values.get(n, 0.0) for n in METRIC_NAMES[engine][1])


def health_url(base_url: str) -> str:
    """``http://host:port/v1`` -> ``http://host:port/health`` (both engines serve it at the root)."""
    return server_root(base_url) + "/health"


def _server_of(url: str) -> str:
    """A health URL (``http://host:port/health``, :func:`health_url`) -> the server's root."""
    return url[: -len("/health")] if url.endswith("/health") else server_root(url)


def get_health(url: str, timeout_s: float) -> tuple[bool, str]:
    """One ``GET /health``: (healthy, what was seen). Healthy is a 2xx answer."""
    from .. import httpclient

    answer = httpclient.get(url, timeout_s, accept=None, limit=0, error_limit=0)
    if answer.status is None and answer.timed_out:
        return False, f"no answer within {timeout_s:g}s"
    return answer.ok, answer.said()


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
        root = _server_of(url)
        own.begin()
        try:
            result = generate(api_base(root), served, api_key, timeout_s=timeout_s)
        finally:
            own.end()
        if result.ok:
            return True, seen
        return False, f"/health {seen}, but a one-token completion: {result.detail}"

    return get


def metrics_progress(engine: str, api_key: str | None) -> "Callable[[str, float], tuple[float, float] | None] | None":
    """The progress reader of :class:`HealthWatch` for ``engine``: a health URL's server's ``/metrics``
    through :func:`read_progress`; None for an engine without a per-step token counter (SGLang)."""
    from .idle import GENERATED_TOKENS

    if engine not in GENERATED_TOKENS:
        return None

    def read(url: str, timeout_s: float) -> tuple[float, float] | None:
        from .counters import fetch_metrics

        text = fetch_metrics(_server_of(url) + "/metrics", api_key, timeout_s=timeout_s)
        return read_progress(engine, text) if text is not None else None

    return read


@dataclass
class RankHealth:
    url: str
    last_ok_at: float  # the clock at the last healthy answer (or when the watch began)
    last_seen: str = "not probed yet"
    in_flight: bool = False
    next_at: float = 0.0
    tokens: float | None = None  # the generated-token counter at its last advance
    waiting: float = 0.0  # requests running or waiting at the last reading
    probed: bool = False  # a probe (one-token completion) was sent since the counter last advanced
    work_since: float | None = None  # since when there was work to do and no token came
    reading: bool = False  # a /metrics reading is in flight (apart from the probe, which may hang)
    read_at: float = 0.0


def note_progress(h: RankHealth, now: float, reading: tuple[float, float] | None) -> None:
    """Feed one ``/metrics`` reading (generated tokens, running or waiting) into ``h``'s progress clock.
    An advance (or a counter that went back: a restarted server) resets it; so does a reading with no
    work to do. None (unreadable) changes nothing."""
    if reading is None:
        return
    tokens, waiting = reading
    h.waiting = waiting
    if h.tokens is None or tokens != h.tokens:
        h.tokens, h.probed, h.work_since = tokens, False, None
    elif waiting > 0 or h.probed:
        if h.work_since is None:
            h.work_since = now
    else:
        h.work_since = None


class HealthWatch:
    """``tick()`` in the supervision loop; it returns the ranks that went ``fail_after_s`` without a
    healthy answer or ``stall_after_s`` with work and no token, each with a phrase saying what happened and
    what was last seen (each rank is reported once)."""

    def __init__(self, urls: Mapping[int, str], settings: HealthSettings, *, clock: Callable[[], float] = time.monotonic,
                 get: Callable[[str, float], tuple[bool, str]] = get_health, background: bool = True,
                 progress: Callable[[str, float], tuple[float, float] | None] | None = None):
        self.settings, self.clock, self.get, self.background = settings, clock, get, background
        # progress(health URL, timeout) -> read_progress of that server's /metrics; None: no progress clock
        self.progress = progress if settings.stall_after_s else None
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
        return (self.settings.fail_after_s > 0 or self.progress is not None) and bool(self.ranks)

    def forget(self, rank: int) -> None:
        """Stop watching a rank (a replica already counted as dead)."""
        with self.lock:
            self.ranks.pop(rank, None)

    def _read(self, rank: int, h: RankHealth) -> None:
        reading = self.progress(h.url, self.settings.timeout_s)
        with self.lock:
            h.reading = False
            note_progress(h, self.clock(), reading)

    def _probe(self, rank: int, h: RankHealth) -> None:
        with self.lock:
            h.probed = True  # the probe asks for a token: work for the progress clock
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
            reads = [(r, h) for r, h in self.ranks.items()
                     if self.progress is not None and not h.reading and now >= h.read_at]
            for _, h in reads:
                h.reading, h.read_at = True, now + self.settings.interval_s
            due = [(r, h) for r, h in self.ranks.items()
                   if self.settings.fail_after_s and not h.in_flight and now >= h.next_at]
            for _, h in due:
                h.in_flight = True
                h.next_at = now + self.settings.interval_s
        for work, call, name in ((reads, self._read, "progress"), (due, self._probe, "health")):
            for r, h in work:
                if self.background:
                    threading.Thread(target=call, args=(r, h), daemon=True, name=f"{name}-{r}").start()
                else:
                    call(r, h)
        now = self.clock()
        with self.lock:
            for r, h in list(self.ranks.items()):
                silent = now - h.last_ok_at
                if self.settings.fail_after_s and silent >= self.settings.fail_after_s:
                    pending = " (a probe still waits for its answer)" if h.in_flight else ""
                    hung.append((r, f"stopped answering /health after the endpoint was live: no healthy answer "
                                    f"from {h.url} for {silent:.0f}s (HEALTH_FAIL_AFTER_S="
                                    f"{self.settings.fail_after_s}); last seen: {h.last_seen}{pending}"))
                    del self.ranks[r]
                elif h.work_since is not None and now - h.work_since >= self.settings.stall_after_s:
                    work = [f"{h.waiting:g} request(s) running or waiting"] if h.waiting else []
                    work += ["the watch's one-token completion"] if h.probed else []
                    hung.append((r, f"stopped generating after the endpoint was live: {' and '.join(work)}, and "
                                    f"its generated-token counter stayed at {h.tokens:g} for "
                                    f"{now - h.work_since:.0f}s (PROGRESS_STALL_AFTER_S="
                                    f"{self.settings.stall_after_s}); the watch's last probe: {h.last_seen}"))
                    del self.ranks[r]
        return hung
