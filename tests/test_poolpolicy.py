"""The elastic pool's decisions (launch/poolpolicy.py): pure, readings in, decisions out."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envlayers.launch.poolpolicy import Bounds, PoolPolicy, QueueReading, QueueWait, read_queue

B = Bounds(started=2, max_replicas=3, wait_s=5.0, window_s=30.0, idle_s=60.0)


def policy(**kw) -> PoolPolicy:
    bounds = Bounds(**{**B.__dict__, **kw})
    return PoolPolicy(bounds, startup_s=20.0)


def test_grows_once_the_wait_stayed_above_the_bound_for_the_window():
    p = policy()
    assert p.decide(0, 6.0, None, {}) == []
    assert p.decide(29, 6.0, None, {}) == []
    (d,) = p.decide(30, 6.0, None, {})
    assert d.action == "grow" and "SCALE_UP_WINDOW_S=30" in d.why


def test_a_wait_at_or_below_the_bound_restarts_the_window():
    p = policy()
    p.decide(0, 6.0, None, {})
    p.decide(20, 5.0, None, {})
    assert p.decide(35, 6.0, None, {}) == []
    assert [d.action for d in p.decide(65, 6.0, None, {})] == ["grow"]


def test_unreadable_wait_is_no_pressure():
    p = policy()
    p.decide(0, 6.0, None, {})
    p.decide(10, None, None, {})
    assert p.decide(31, 6.0, None, {}) == []


def test_no_grow_while_a_grown_replica_is_pending():
    p = policy(max_replicas=5)
    p.decide(0, 9.0, None, {})
    assert p.decide(30, 9.0, None, {})[0].action == "grow"
    p.submitted("101")
    assert p.decide(100, 9.0, None, {}) == [] and p.decide(200, 9.0, None, {}) == []


def test_never_above_max_replicas():
    p = policy(max_replicas=3)
    p.joined("101", 10.0)
    p.decide(0, 9.0, None, {})
    assert p.decide(100, 9.0, None, {}) == []


def test_no_grow_when_the_walltime_left_is_shorter_than_a_start_up():
    p = policy()
    p.decide(0, 9.0, 20.0, {})
    assert p.decide(30, 9.0, 20.0, {}) == []
    assert p.decide(31, 9.0, 21.0, {})[0].action == "grow"


def test_the_longest_start_up_seen_bounds_the_walltime_rule():
    p = policy(max_replicas=5)
    p.submitted("101")
    p.joined("101", 90.0)
    p.decide(0, 9.0, 80.0, {})
    assert p.decide(40, 9.0, 80.0, {}) == []


def test_a_replica_that_joined_restarts_the_window():
    p = policy(max_replicas=5)
    p.decide(0, 9.0, None, {})
    p.decide(30, 9.0, None, {})
    p.submitted("101")
    p.joined("101", 10.0)
    assert p.decide(40, 9.0, None, {}) == []
    assert p.decide(70, 9.0, None, {})[0].action == "grow"


def test_shrinks_an_added_replica_idle_past_the_bound():
    p = policy()
    p.submitted("101")
    p.joined("101", 10.0)
    assert p.decide(0, 0.0, None, {"101": 59.0}) == []
    (d,) = p.decide(1, 0.0, None, {"101": 60.0})
    assert (d.action, d.job) == ("shrink", "101") and "IDLE_STOP_AFTER_S=60" in d.why


def test_never_shrinks_the_started_replicas():
    p = policy()
    assert p.decide(0, 0.0, None, {"0": 1e6, "1": 1e6}) == []


def test_no_shrink_without_idle_stop():
    p = policy(idle_s=None)
    p.joined("101", 10.0)
    assert p.decide(0, 0.0, None, {"101": 1e6}) == []


def test_a_failed_pending_replica_lets_the_pool_grow_again():
    p = policy()
    p.decide(0, 9.0, None, {})
    p.decide(30, 9.0, None, {})
    p.submitted("101")
    p.failed("101")
    p.decide(31, 9.0, None, {})
    assert p.decide(61, 9.0, None, {})[0].action == "grow"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 20), st.sampled_from(["grow-ok", "join", "fail", "idle", "none"])),
                max_size=60),
       st.integers(1, 4), st.integers(0, 3))
def test_the_pool_stays_between_the_started_count_and_max(steps, started, extra):
    p = PoolPolicy(Bounds(started, started + extra, 5.0, 10.0, 30.0), startup_s=5.0)
    now, n = 0.0, 0
    for wait, event in steps:
        now += 4.0
        idle = {j: (100.0 if event == "idle" else 0.0) for j in p.added}
        for d in p.decide(now, wait, None, idle):
            if d.action == "grow":
                assert p.pending is None
                n += 1
                p.submitted(f"j{n}")
            else:
                assert d.job in p.added
                p.released(d.job)
        if p.pending is not None and event == "join":
            p.joined(p.pending, 5.0)
        elif p.pending is not None and event == "fail":
            p.failed(p.pending)
        assert started <= p.size <= started + extra


@pytest.mark.parametrize("engine,text,want", [
    pytest.param("vllm", 'vllm:num_requests_waiting{engine="0"} 3.0\n'
                 'vllm:request_queue_time_seconds_sum{engine="0"} 12.5\n'
                 'vllm:request_queue_time_seconds_count{engine="0"} 5.0\n', QueueReading(3.0, 12.5, 5.0), id="vllm"),
    pytest.param("sglang", 'sglang:num_queue_reqs{model_name="m"} 1\n', QueueReading(1.0), id="sglang-gauge-only"),
    pytest.param("vllm", "vllm:request_success_total 3\n", None, id="no-gauge"),
    pytest.param("other", "vllm:num_requests_waiting 3\n", None, id="unknown-engine"),
])
def test_read_queue(engine, text, want):
    assert read_queue(engine, text) == want


def test_queue_wait_is_the_mean_wait_of_the_requests_that_left_the_queue():
    q = QueueWait()
    assert q.feed(0, {"a": QueueReading(2, 0.0, 0)}) == 0.0
    assert q.feed(5, {"a": QueueReading(2, 12.0, 3)}) == 4.0


def test_queue_wait_grows_while_nobody_leaves_the_queue():
    q = QueueWait()
    q.feed(0, {"a": QueueReading(2, 0.0, 0)})
    assert q.feed(5, {"a": QueueReading(2, 0.0, 0)}) == 5.0
    assert q.feed(9, {"a": QueueReading(1)}) == 9.0
    assert q.feed(12, {"a": QueueReading(0)}) == 0.0


def test_queue_wait_is_the_worst_engine_and_none_when_none_reads():
    q = QueueWait()
    q.feed(0, {"a": QueueReading(0, 0, 0), "b": QueueReading(1, 0, 0)})
    assert q.feed(3, {"a": QueueReading(0, 0, 0), "b": QueueReading(1, 0, 0)}) == 3.0
    assert q.feed(4, {"a": None}) is None
