"""The supervision loop reads each rank's log as it grows: a vLLM server whose engine core died ends the job
(or, once live, drops that replica) on that line, not seconds later when the server process exits."""

from __future__ import annotations

import pytest

from envlayers.engines.logsigns import CORE_DIED, core_died
from envlayers.launch.prepare import LaunchFailure, prepare
from envlayers.launch.supervise import CORE_DEATH_SETTLE_S, POLL_S, Supervisor
from envlayers.readiness import Probe
from clocktools import Clock
from launchtools import (GATEWAY, RAY, SINGLE_VLLM, Step, alloc, exited, grow, ray_alloc, replicas_loop, started, stop,
                         supervisor)

# the line vLLM 0.32's API server prints when its engine core process dies (vllm/v1/engine/core_client.py)
DIED = ("(APIServer pid=4242) WARNING 12-04 10:00:00 [core_client.py:818] [shutdown] MPClient: engine core "
        "exited unexpectedly; starting cleanup")


def test_the_vllm_line_is_recognised_and_nothing_else():
    assert core_died("vllm", DIED)
    assert not core_died("vllm", "(APIServer pid=4242) INFO 12-04 10:00:00 [launcher.py:47] Route: /v1/models")
    assert not core_died("sglang", DIED)  # SGLang kills its process tree at once: its exit is the sign
    assert not core_died("other", DIED)
    assert set(CORE_DIED) == {"vllm", "sglang"}


def single(tmp_path, clock, step, said, live=None, **keys):
    lp = prepare({**SINGLE_VLLM, "ENVLAYERS_READY_TIMEOUT_S": "100", **keys}, alloc(tmp_path, nodes=alloc(
        tmp_path).nodes[:1]))

    def probe(url, served, key, timeout_s):
        return Probe(url, True, 200, "ok")

    return Supervisor(lp, step, probe=probe, on_live=lambda e: (live if live is not None else []).append(e),
                      say=said.append, clock=clock, sleep=clock.sleep, background=False)


def test_a_single_rank_whose_engine_core_died_ends_the_job_on_the_line_not_the_exit(tmp_path):
    clock, step, said = Clock(), Step(), []
    sup = single(tmp_path, clock, step, said)
    started(tmp_path, 0)
    clock.at(10, lambda: grow(tmp_path, 0, DIED))
    with pytest.raises(LaunchFailure) as err:
        sup.run()
    assert str(err.value) == f"rank 0 on n1 lost its engine core after the endpoint was live (its log: {DIED})"
    assert err.value.rank == 0 and sup.live
    assert clock.t - 1000 <= 10 + 2 * POLL_S  # the next tick, with no exit file at all


def test_before_live_it_says_before(tmp_path):
    clock, step, said = Clock(), Step(), []
    sup = single(tmp_path, clock, step, said)
    sup.probe = lambda url, served, key, timeout_s: Probe(url, False, None, "no answer")
    started(tmp_path, 0)
    clock.at(3, lambda: grow(tmp_path, 0, DIED))
    with pytest.raises(LaunchFailure, match=r"^rank 0 on n1 lost its engine core before the endpoint was live"):
        sup.run()


def test_sglang_logs_are_not_read_for_it(tmp_path):
    clock, step, said = Clock(), Step(), []
    sup = single(tmp_path, clock, step, said, INFERENCE_ENGINE="sglang")
    started(tmp_path, 0)
    clock.at(3, lambda: grow(tmp_path, 0, DIED))
    clock.at(20, stop)
    with pytest.raises(BaseException) as err:
        sup.run()
    assert type(err.value).__name__ == "Stop"


def test_in_several_ranks_a_peers_exit_landing_within_the_settle_time_is_blamed(tmp_path):
    clock, step = Clock(), Step()
    sup = supervisor(tmp_path, clock, step, probe_ok=lambda url: True, INFERENCE_ENGINE="vllm")
    started(tmp_path, 0), started(tmp_path, 1)
    # rank 1 dies; rank 0's server says its engine core went with it, a moment before rank 1's exit lands
    clock.at(10, lambda: grow(tmp_path, 0, DIED))
    clock.at(10 + CORE_DEATH_SETTLE_S / 2, lambda: exited(tmp_path, 1, 137, 10.0))
    with pytest.raises(LaunchFailure) as err:
        sup.run()
    assert str(err.value).startswith("rank 1 on n2 exited with code 137 after the endpoint was live")


def test_in_several_ranks_without_an_exit_the_core_death_is_blamed_after_the_settle_time(tmp_path):
    clock, step = Clock(), Step()
    sup = supervisor(tmp_path, clock, step, probe_ok=lambda url: True, INFERENCE_ENGINE="vllm")
    started(tmp_path, 0), started(tmp_path, 1)
    clock.at(10, lambda: grow(tmp_path, 1, DIED))
    with pytest.raises(LaunchFailure, match=r"^rank 1 on n2 lost its engine core after the endpoint was live"):
        sup.run()
    assert 10 + CORE_DEATH_SETTLE_S <= clock.t - 1000 <= 10 + CORE_DEATH_SETTLE_S + 2 * POLL_S


def test_a_replica_whose_engine_core_died_is_dropped_at_once_and_its_exit_is_not_said_again(tmp_path):
    clock = Clock()
    sup, steps, released, said = replicas_loop(tmp_path, clock)
    clock.at(10, lambda: grow(tmp_path, 2, DIED))
    clock.at(14, lambda: exited(tmp_path, 2, 1, 14.0))  # the server exits after its cleanup
    clock.at(20, stop)
    with pytest.raises(BaseException) as err:
        sup.run()
    assert type(err.value).__name__ == "Stop"
    errors = [line for line in said if line.startswith("ENVLAYERS-ERROR: replica")]
    assert errors == [f"ENVLAYERS-ERROR: replica rank 2 on n3 lost its engine core after the endpoint was live "
                      f"(its log: {DIED})"]
    assert steps.ended == [2] and released == [["n1", "n2"]]


@pytest.mark.parametrize("keys, watched", [
    pytest.param(GATEWAY, False, id="gateway-rank-0-log-carries-every-serve-replica"),
    pytest.param(RAY, True, id="ray-one-engine"),
])
def test_the_gateway_shape_leaves_its_replicas_engines_to_the_gateway(tmp_path, keys, watched):
    clock, step = Clock(), Step()
    lp = prepare({**keys, "ENVLAYERS_READY_TIMEOUT_S": "100"}, ray_alloc(tmp_path))
    sup = Supervisor(lp, step, probe=lambda url, served, key, timeout_s: Probe(url, True, 200, "ok"),
                     on_live=lambda e: None, say=[].append, clock=clock, sleep=clock.sleep, background=False)
    assert sup.watch_cores is watched
    started(tmp_path, 0), started(tmp_path, 1)
    clock.at(10, lambda: grow(tmp_path, 0, DIED))
    clock.at(20, stop)
    with pytest.raises(BaseException) as err:
        sup.run()
    assert (type(err.value).__name__ == "Stop") is not watched
