"""The engines' request counters, read from ``/metrics`` for idle release and the GPU-hour split.

:class:`RequestCounters` sums every serving rank's counters (``launch.idle.read_counters``) into one
:class:`~envlayers.launch.idle.Counters`; in the gateway shape the gateway's one ``/metrics`` holds every
replica's samples, each labelled ``replica="<i>"``, read per replica so the total never goes back. The
launcher's own requests (the health watch's one-token completions) are left out.
"""

from __future__ import annotations

import re
from typing import Callable

from ..urls import server_root
from .idle import Counters, read_counters
from .prepare import LaunchPlan

_REPLICA_RE = re.compile(r'^[A-Za-z_:][A-Za-z0-9_:]*\{replica="([^"]*)"')  # the gateway's label, first
# the gateway's /metrics waits up to gateway_app.READ_TIMEOUT_S (3 s) for a slow replica's reader, then
# answers with that replica named in a comment: the meter waits for that answer rather than lose the reading
GATEWAY_FETCH_TIMEOUT_S = 5.0


def fetch_metrics(url: str, api_key: str | None, timeout_s: float = 2.0) -> str | None:
    """GET a /metrics URL; None when it does not answer 200."""
    from .. import httpclient

    answer = httpclient.get(url, timeout_s, api_key=api_key, accept=None, limit=4 << 20, error_limit=0)
    return answer.text() if answer.status == 200 else None


def metrics_urls(lp: LaunchPlan) -> list[str]:
    return [server_root(t.probe_url) + "/metrics" for t in lp.targets]


class RequestCounters:
    """The request counters of the whole endpoint, one reading per :meth:`sample`."""

    def __init__(self, lp: LaunchPlan, *, api_key: str | None = None,
                 fetch: Callable[..., str | None] = fetch_metrics, own=None):
        self.lp, self.api_key, self.fetch = lp, api_key, fetch
        self.own = own  # launch.health.OwnRequests: the launcher's own requests, left out of the counters
        self.engine = lp.engine  # an engine idle.METRIC_NAMES does not know reads as "counters unreadable"
        self._finished_seen = 0.0  # the most finished requests of clients reported so far
        self._replicas: dict[str, Counters] = {}  # the gateway: each replica's last counters
        self._finished_before = 0.0  # the gateway: requests finished by replicas replaced since

    def sample(self) -> Counters | None:
        """The request counters summed over every serving rank; None when one of them cannot be read."""
        if not self.lp.metrics:
            return None
        total = None
        gateway = self.lp.plan.shape == "gateway"
        for url in metrics_urls(self.lp):
            if gateway:
                text = self.fetch(url, self.api_key, timeout_s=GATEWAY_FETCH_TIMEOUT_S)
            else:
                text = self.fetch(url, self.api_key)
            if text is not None and gateway:
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
