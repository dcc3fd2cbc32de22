"""The GPU-hour split of one job's timeline, and the sums and the largest waste over many (pure)."""

from __future__ import annotations

import pytest

from envlayers.accounting import SEGMENTS, fmt_h, largest_waste, split, summarize

T0 = 1_700_000_000.0


def timeline(**kw) -> dict:
    tl = {"job_start": T0, "gpus": 8, "ranks_up_at": T0 + 60, "phases": {"loading": T0 + 100, "weights-loaded":
          T0 + 700, "kv-cache": T0 + 720, "graph-capture": T0 + 750, "ready": T0 + 850}, "live_at": T0 + 900,
          "last_request_at": T0 + 2700, "live": {"serving_s": 1000, "idle_s": 5000, "unobserved_s": 0,
                                                "counters_readable": True},
          "idle_stop_after_s": None, "died_at": None, "ended_at": T0 + 7200, "model": "glm53", "shape": "pipeline"}
    tl.update(kw)
    return tl


@pytest.mark.parametrize("kw, want", [
    pytest.param({}, {"rank_start": 60, "weight_load": 600, "graph_capture": 100, "startup_other": 140,
                      "serving": 1000, "idle": 800, "idle_after_last_request": 4500}, id="served-then-idle"),
    pytest.param({"live": {"counters_readable": False}, "last_request_at": None},
                 {"rank_start": 60, "weight_load": 600, "graph_capture": 100, "startup_other": 140,
                  "live_unmeasured": 6300}, id="counters-unreadable"),
    pytest.param({"live_at": None, "phases": {"loading": T0 + 100}, "died_at": T0 + 400, "last_request_at": None},
                 {"rank_start": 60, "weight_load": 300, "startup_other": 40, "after_server_died": 6800},
                 id="died-while-loading"),
    pytest.param({"died_at": T0 + 3000}, {"rank_start": 60, "weight_load": 600, "graph_capture": 100,
                                          "startup_other": 140, "serving": 1000, "idle": 800,
                                          "idle_after_last_request": 300, "after_server_died": 4200},
                 id="died-after-live"),
    pytest.param({"ranks_up_at": None, "phases": {}, "live_at": None, "ended_at": T0 + 300, "last_request_at": None},
                 {"rank_start": 300}, id="ranks-never-up"),
])
def test_split_adds_up_to_the_allocation(kw, want):
    sp = split(timeline(**kw), now=T0 + 99999)
    expect = {seg: float(want.get(seg, 0)) for seg in SEGMENTS}
    assert sp["seconds"] == expect
    assert sum(sp["seconds"].values()) == pytest.approx(sp["allocated_s"])
    assert sp["gpu_hours"]["rank_start"] == pytest.approx(expect["rank_start"] * 8 / 3600, abs=1e-4)


def test_a_running_job_is_split_up_to_now():
    sp = split(timeline(ended_at=None, last_request_at=T0 + 1500), now=T0 + 3600)
    assert sp["running"] and sp["allocated_s"] == 3600 and sp["allocated_gpu_hours"] == 8.0
    assert sp["seconds"]["idle_after_last_request"] == 2100


def test_summarize_and_name_the_largest_waste():
    jobs = []
    for model, end in (("glm53", T0 + 7200), ("glm53", T0 + 3600), ("qwen", T0 + 1800)):
        tl = timeline(ended_at=end, model=model, last_request_at=min(T0 + 1500, end))
        jobs.append({"timeline": tl, "split": split(tl, now=end), "model": model, "shape": tl["shape"]})
    groups = summarize(jobs, "model", 1800)
    assert [g["model"] for g in groups] == ["glm53", "qwen"]
    glm = groups[0]
    assert glm["jobs"] == 2 and glm["allocated_gpu_hours"] == pytest.approx(8 * 3 * 1.0)
    assert glm["gpu_hours"]["idle_after_last_request"] == pytest.approx(8 * (5700 + 2100) / 3600, abs=1e-3)
    assert glm["idle_stop_would_save"] == pytest.approx(8 * (3900 + 300) / 3600, abs=1e-3)
    assert largest_waste(groups, "model", 1800) == (
        f"glm53: {glm['share']['idle_after_last_request'] * 100:.0f}% of 24.0 GPU-hours idle after the last request; "
        f"IDLE_STOP_AFTER_S=1800 would have saved {fmt_h(glm['idle_stop_would_save'])} GPU-hours")


def test_no_waste_no_sentence():
    tl = timeline(last_request_at=T0 + 7200, live={"serving_s": 6300, "counters_readable": True})
    sp = split(tl, now=T0)
    assert largest_waste(summarize([{"timeline": tl, "split": sp, "model": "m"}], "model", 60), "model", 60) is None


def test_status_recomputes_a_running_jobs_split_up_to_now(tmp_path):
    import json

    from envlayers.ops.status import job_accounting
    from envlayers.rundir import JobFiles

    tl = timeline(ended_at=None, last_request_at=T0 + 1500)
    tl["split"] = split(tl, now=T0 + 1000)  # as the launcher last wrote it
    (tmp_path / "accounting.json").write_text(json.dumps(tl))
    files = JobFiles("42", None, tmp_path)
    assert job_accounting(files, running=True, now=T0 + 3600)["split"]["allocated_s"] == 3600
    assert job_accounting(files, running=False, now=T0 + 3600)["split"]["allocated_s"] == 1000
    assert job_accounting(JobFiles("43", None, tmp_path / "none"), running=True) is None


# -- records that cannot be summed ----------------------------------------------------------------------

@pytest.mark.parametrize("kw, why", [
    pytest.param({"job_start": float("nan")}, "job_start is nan, not a time in seconds", id="start-nan"),
    pytest.param({"job_start": float("inf")}, "job_start is inf", id="start-inf"),
    pytest.param({"job_start": None}, "job_start is None", id="start-null"),
    pytest.param({"job_start": "1700000000"}, "job_start is '1700000000'", id="start-text"),
    pytest.param({"job_start": -1.0}, "job_start is -1.0", id="start-negative"),
    pytest.param({"ended_at": 10 ** 400}, "ended_at is 1000000", id="end-huge-int"),
    pytest.param({"live_at": True}, "live_at is True", id="live-bool"),
    pytest.param({"gpus": -4}, "gpus is -4, not a whole number from 0 to 1000000", id="gpus-negative"),
    pytest.param({"gpus": 8.5}, "gpus is 8.5", id="gpus-fraction"),
    pytest.param({"gpus": 10 ** 9}, "gpus is 1000000000", id="gpus-huge"),
    pytest.param({"phases": {"loading": float("nan")}}, "phases.loading is nan", id="phase-nan"),
    pytest.param({"phases": [1, 2]}, "phases is [1, 2], not an object", id="phases-list"),
    pytest.param({"live": {"serving_s": -5, "counters_readable": True}}, "live.serving_s is -5", id="serving-negative"),
    pytest.param({"live": "yes"}, "live is 'yes', not an object", id="live-text"),
    pytest.param({"idle_stop_after_s": float("nan")}, "idle_stop_after_s is nan", id="idle-stop-nan"),
    pytest.param({"extra": {"deep": [1.0, float("-inf")]}}, "extra.deep[1] is -inf", id="inf-anywhere"),
])
def test_a_record_that_would_make_a_total_nan_or_infinite_is_named(kw, why):
    from envlayers.accounting import problem

    tl = timeline(**kw)
    assert why in problem(tl)
    with pytest.raises(ValueError, match="is"):
        split(tl, now=T0 + 99999)


@pytest.mark.parametrize("value, why", [
    pytest.param([1, 2, 3], "a JSON list, not an object", id="list"),
    pytest.param(7, "a JSON int, not an object", id="number"),
    pytest.param({"gpus": 8}, "no job_start", id="no-start"),
])
def test_what_is_not_an_object_with_a_start_is_not_a_record(value, why):
    from envlayers.accounting import problem

    assert problem(value) == why


def test_a_good_record_has_no_problem():
    from envlayers.accounting import problem

    assert problem(timeline()) is None and problem(timeline(gpus=0, live=None, phases=None)) is None
