"""Idle release without Slurm or root: the Prometheus parser on the engines' real metric names, the idle
tracker, and the supervision loop with its meter on a fake clock (an idle endpoint ends on time, a busy
one never does, a request in the last second resets the clock)."""

from __future__ import annotations

import json
import re

import pytest

from envlayers.launch.idle import Counters, IdleTracker, parse_prometheus, read_counters
from envlayers.launch.meter import IdleStop, Meter, idle_seconds
from envlayers.errors import KeyValueError
from envlayers.launch.prepare import LaunchFailure, prepare
from envlayers.readiness import Probe
from envlayers.launch.supervise import Supervisor
from clocktools import Clock
from launchtools import N1, SINGLE_SGLANG, SINGLE_VLLM, Step, Stop, alloc, started

VLLM_TEXT = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="q"} 2.0
vllm:num_requests_waiting{engine="0",model_name="q"} 1.0
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="q"} 7.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="q"} 3.0
vllm:request_success_total{engine="0",finished_reason="abort",model_name="q"} 0.0
vllm:generation_tokens_total{engine="0",model_name="q"} 1.2e+03
"""
SGLANG_TEXT = """# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="q"} 0.0
sglang:num_queue_reqs{model_name="q"} 0.0
sglang:num_requests_total{model_name="q"} 4.0
sglang:token_usage{model_name="q"} NaN
"""


@pytest.mark.parametrize("engine, text, want", [
    pytest.param("vllm", VLLM_TEXT, Counters(10.0, 3.0), id="vllm-sums-finish-reasons-running-waiting"),
    pytest.param("sglang", SGLANG_TEXT, Counters(4.0, 0.0), id="sglang-idle"),
    pytest.param("vllm", SGLANG_TEXT, None, id="wrong-engine-names-unreadable"),
    pytest.param("sglang", "<html>404</html>", None, id="not-prometheus"),
    pytest.param("tgi", VLLM_TEXT, None, id="unknown-engine"),
])
def test_read_counters_uses_the_engines_metric_names(engine, text, want):
    assert read_counters(engine, text) == want


def test_parse_prometheus_skips_comments_nan_and_junk():
    values = parse_prometheus(SGLANG_TEXT + "garbage line here\nx_total 2\nx_total{a=\"b\"} 3\n")
    assert values["x_total"] == 5.0 and "sglang:token_usage" not in values and "garbage" not in values


def feed_all(tracker: IdleTracker, samples) -> list[tuple[float, str]]:
    out = []
    for t, c in samples:
        out += [(t, d) for d in tracker.feed(t, c)]
    return out


IDLE = Counters(5, 0)


@pytest.mark.parametrize("samples, want", [
    pytest.param([(t, IDLE) for t in range(1, 20)], [(6, "warn"), (10, "stop")], id="idle-warns-then-stops"),
    pytest.param([(t, Counters(5 + t, 0)) for t in range(1, 20)], [], id="finishing-requests-never-idle"),
    pytest.param([(t, Counters(5, 1)) for t in range(1, 20)], [], id="one-long-request-in-flight-never-idle"),
    pytest.param([(t, None) for t in range(1, 20)], [], id="unreadable-never-stops"),
    pytest.param([(t, IDLE if t < 9 else Counters(6, 0)) for t in range(1, 25)],
                 [(6, "warn"), (15, "warn"), (19, "stop")],
                 id="a-request-in-the-last-second-resets-the-clock"),
])
def test_idle_tracker(samples, want):
    assert feed_all(IdleTracker(0.0, stop_after_s=10, warn_after_s=6), samples) == want


def test_idle_tracker_splits_live_time():
    tr = IdleTracker(0.0, stop_after_s=None)
    feed_all(tr, [(1, IDLE), (2, Counters(5, 1)), (3, Counters(7, 0)), (4, Counters(7, 0)), (5, None)])
    assert (tr.serving_s, tr.idle_s, tr.unobserved_s, tr.requests) == (2.0, 2.0, 1.0, 2.0)
    assert tr.last_request_at == 3


@pytest.mark.parametrize("raw, want", [
    pytest.param(None, None, id="absent-never"), pytest.param("", None, id="empty-never"),
    pytest.param("1800", 1800.0, id="seconds"), pytest.param("2.5", 2.5, id="fraction"),
])
def test_idle_seconds(raw, want):
    assert idle_seconds({} if raw is None else {"IDLE_STOP_AFTER_S": raw}, "IDLE_STOP_AFTER_S") == want


@pytest.mark.parametrize("raw", ["0", "-5", "30m", "nan"])
def test_idle_seconds_rejects_bad_values_naming_the_key(raw):
    with pytest.raises(KeyValueError, match=r"^IDLE_STOP_AFTER_S: must be a positive number of seconds, got .*; hint"):
        idle_seconds({"IDLE_STOP_AFTER_S": raw}, "IDLE_STOP_AFTER_S")


# --------------------------------------------------------------------------- the loop with its meter


class Engine:
    """A fake engine's /metrics: finished requests and in flight, changed by clock events."""

    def __init__(self, engine: str):
        self.engine, self.finished, self.in_flight, self.up = engine, 0, 0, True
        self.urls: list[str] = []

    def fetch(self, url, api_key, timeout_s=2.0):
        self.urls.append(url)
        if not self.up:
            return None
        if self.engine == "vllm":
            return (f'vllm:num_requests_running{{model_name="q"}} {self.in_flight}\n'
                    f'vllm:request_success_total{{finished_reason="stop",model_name="q"}} {self.finished}\n')
        return (f'sglang:num_running_reqs{{model_name="q"}} {self.in_flight}\n'
                f'sglang:num_requests_total{{model_name="q"}} {self.finished}\n')


def looped(tmp_path, keys, engine: Engine, events=(), until=None):
    """Run the loop (one rank, live at once) until IdleStop or ``until`` seconds; returns (said, clock, error)."""
    clock, step, said = Clock(), Step(), []
    lp = prepare(keys, alloc(tmp_path, nodes=(N1,)))
    meter = Meter(lp, keys, said.append, clock=clock, wall=lambda: clock.t + 1e9, fetch=engine.fetch)
    sup = Supervisor(lp, step, probe=lambda *a, **k: Probe(a[0], True, 200, "ok"), on_live=lambda s: None,
                     say=said.append, clock=clock, sleep=clock.sleep, meter=meter)
    started(tmp_path, 0)
    for t, fn in events:
        clock.at(t, fn)
    if until is not None:
        clock.at(until, lambda: (_ for _ in ()).throw(Stop()))
    err = None
    try:
        sup.run()
    except (IdleStop, Stop) as e:
        err = e
    return said, clock.t - 1000.0, err, meter


@pytest.mark.parametrize("base", [pytest.param(SINGLE_VLLM, id="vllm"), pytest.param(SINGLE_SGLANG, id="sglang")])
def test_an_idle_endpoint_ends_on_time(tmp_path, base):
    keys = {**base, "IDLE_STOP_AFTER_S": "30", "IDLE_WARN_AFTER_S": "20"}
    said, t, err, meter = looped(tmp_path, keys, Engine(base["INFERENCE_ENGINE"]), until=100)
    assert isinstance(err, IdleStop)
    assert 30 <= t <= 33.5  # live at ~0.25s, a sample every 3s (a tenth of the stop)
    assert any(s.startswith("ENVLAYERS-STAGE: idle release: stop after 30s, warn after 20s") for s in said)
    assert any(re.match(r"ENVLAYERS-WARN: no request served for 2[0-3]s \(IDLE_WARN_AFTER_S=20\); the job ends "
                        r"in (10|[7-9])s", s) for s in said), said
    assert re.match(r"ENVLAYERS-STAGE: idle stop: no request served for 3[0-3]s \(IDLE_STOP_AFTER_S=30\)", said[-1])
    data = json.loads((tmp_path / "accounting.json").read_text())
    assert data["live"]["counters_readable"] is True and data["final"] is False


def test_a_busy_endpoint_never_ends(tmp_path):
    eng = Engine("vllm")
    busy = [(t, lambda: setattr(eng, "finished", eng.finished + 1)) for t in range(5, 200, 5)]
    said, t, err, _ = looped(tmp_path, {**SINGLE_VLLM, "IDLE_STOP_AFTER_S": "10"}, eng, busy, until=200)
    assert isinstance(err, Stop) and t >= 200
    assert not any("idle stop" in s or "no request served" in s for s in said)


def test_a_request_in_the_last_second_resets_the_clock(tmp_path):
    eng = Engine("sglang")
    # one request finishes at 29.5s, half a second before the 30s idle stop would fire
    said, t, err, _ = looped(tmp_path, {**SINGLE_SGLANG, "IDLE_STOP_AFTER_S": "30"}, eng,
                             [(29.5, lambda: setattr(eng, "finished", 1))], until=100)
    assert isinstance(err, IdleStop)
    assert 59 <= t <= 66  # seen at the next sample (every 3s), then 30s more


def test_unreadable_counters_are_said_at_start_and_never_stop(tmp_path):
    eng = Engine("vllm")
    eng.up = False
    said, t, err, _ = looped(tmp_path, {**SINGLE_VLLM, "IDLE_STOP_AFTER_S": "5"}, eng, until=60)
    assert isinstance(err, Stop)
    assert any(s.startswith("ENVLAYERS-WARN: cannot read the engine's request counters (no request counters at "
                            "http://10.0.0.1:") and s.endswith("idle release is off") for s in said)


def test_sglang_without_metrics_says_why(tmp_path):
    eng = Engine("sglang")
    keys = {**SINGLE_SGLANG, "SGLANG_ENABLE_METRICS": "false", "IDLE_STOP_AFTER_S": "5"}
    said, t, err, _ = looped(tmp_path, keys, eng, until=30)
    assert isinstance(err, Stop) and eng.urls == []
    assert any("SGLang runs without --enable-metrics" in s for s in said)
