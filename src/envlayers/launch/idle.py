"""Idle detection: the engine's own request counters in, "warn" / "stop" decisions and busy/idle time out.

Pure: no clock, no network. :func:`parse_prometheus` reads the ``/metrics`` text both engines serve;
:func:`read_counters` picks the request counters of one engine out of it (the real metric names,
docs/operating.md "Idle release"):

- vLLM: ``vllm:request_success_total`` (finished requests, one series per finish reason: summed),
  ``vllm:num_requests_running`` and ``vllm:num_requests_waiting`` (in flight now);
- SGLang (served only with ``--enable-metrics``): ``sglang:num_requests_total``,
  ``sglang:num_running_reqs`` and ``sglang:num_queue_reqs``.

:class:`IdleTracker` is fed ``(time, Counters | None)`` samples after the endpoint went live. A sample
with requests in flight, or with more finished requests than the one before, is activity: it resets
the idle clock. ``None`` (the counters could not be read) is neither: the tracker never stops on
time it could not observe. The tracker also splits the live time into serving (requests in flight or
finished between two samples) and idle, for the GPU-hour accounting (``envlayers.accounting``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

# engine -> (finished-requests counters, in-flight gauges)
METRIC_NAMES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "vllm": (("vllm:request_success_total",), ("vllm:num_requests_running", "vllm:num_requests_waiting")),
    "sglang": (("sglang:num_requests_total",), ("sglang:num_running_reqs", "sglang:num_queue_reqs")),
}

# engine -> its generated-token counter, one that advances with every engine step (the health watch's
# progress clock, launch/health.py). vLLM's does; SGLang's sglang:generation_tokens_total counts a request's
# tokens only when it finishes (its tokenizer manager's observe_one_finished_request), so a long answer
# would look like a stall: SGLang is judged by /health and the one-token completion alone
GENERATED_TOKENS: dict[str, str] = {"vllm": "vllm:generation_tokens_total"}

_SAMPLE_RE = re.compile(r'^([A-Za-z_:][A-Za-z0-9_:]*)(\{(?:[^}"]|"(?:[^"\\]|\\.)*")*\})?\s+(\S+)')  # "}" may be in a value


def parse_prometheus(text: str) -> dict[str, float]:
    """Prometheus text exposition -> metric name -> value summed over its label sets (comments and
    malformed lines skipped; NaN values ignored)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE_RE.match(line)
        if not m:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        if math.isnan(value):
            continue
        out[m.group(1)] = out.get(m.group(1), 0.0) + value
    return out


@dataclass(frozen=True)
class Counters:
    """One reading of an engine's request counters: requests finished so far, requests in flight now."""

    finished: float
    in_flight: float


def read_counters(engine: str, text: str) -> Counters | None:
    """The request counters of ``engine`` in a ``/metrics`` text; ``None`` when the finished-requests
    counter is not there (an engine version that names it otherwise, metrics off)."""
    names = METRIC_NAMES.get(engine)
    if names is None:
        return None
    values = parse_prometheus(text)
    done = [values[n] for n in names[0] if n in values]
    if not done:
        return None
    return Counters(sum(done), sum(values.get(n, 0.0) for n in names[1]))


@dataclass
class IdleTracker:
    """Fed samples after the endpoint went live (``live_at``, same clock); says when to warn and stop.

    ``stop_after_s`` / ``warn_after_s``: ``None`` = never. :meth:`feed` returns the decisions the sample
    leads to: ``"warn"`` and ``"stop"`` once per idle stretch, when it reaches ``warn_after_s`` / ``stop_after_s``.
    """

    live_at: float
    stop_after_s: float | None = None
    warn_after_s: float | None = None
    last_activity: float = field(init=False)
    last_request_at: float | None = field(init=False, default=None)  # last sample that saw activity
    serving_s: float = field(init=False, default=0.0)
    idle_s: float = field(init=False, default=0.0)
    unobserved_s: float = field(init=False, default=0.0)  # time between samples that could not be read
    requests: float = field(init=False, default=0.0)
    readable: bool | None = field(init=False, default=None)  # None: no sample yet
    _prev: Counters | None = field(init=False, default=None)
    _prev_t: float = field(init=False)
    _warned: bool = field(init=False, default=False)
    _stopped: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        self.last_activity = self.live_at
        self._prev_t = self.live_at

    def idle_for(self, now: float) -> float:
        return max(0.0, now - self.last_activity)

    def feed(self, now: float, sample: Counters | None) -> list[str]:
        span = max(0.0, now - self._prev_t)
        self._prev_t = now
        if sample is None:
            self.unobserved_s += span
            if self.readable is None:
                self.readable = False
            self.last_activity += span  # time not observed is not counted as idle
            return []
        self.readable = True
        prev = self._prev
        self._prev = sample
        base = prev.finished if prev is not None else sample.finished  # the first sample is the baseline
        finished_now = sample.finished - base if sample.finished >= base else sample.finished  # a reset counter
        active = sample.in_flight > 0 or finished_now > 0
        self.requests += max(0.0, finished_now)
        if active:
            self.serving_s += span
            self.last_activity = now
            self.last_request_at = now
            self._warned = self._stopped = False
            return []
        self.idle_s += span
        idle = self.idle_for(now)
        out = []
        if self.warn_after_s is not None and not self._warned and idle >= self.warn_after_s:
            self._warned = True
            out.append("warn")
        if self.stop_after_s is not None and not self._stopped and idle >= self.stop_after_s:
            self._stopped = True
            out.append("stop")
        return out

    def to_dict(self) -> dict:
        return {"serving_s": round(self.serving_s, 3), "idle_s": round(self.idle_s, 3),
                "unobserved_s": round(self.unobserved_s, 3), "requests": int(self.requests),
                "counters_readable": self.readable}
