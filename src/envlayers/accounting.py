"""Where a job's GPU-hours went: one job's timeline -> its split; many jobs' splits -> totals and the largest waste.

Pure: dicts in, dicts out; :func:`problem` says why a dict is not a record (every total stays finite). A job's timeline (written by the launcher as ``accounting.json``, see
``launch.timeline``) holds wall-clock times: the job's start (pending time is free), every rank started,
rank 0's startup phases, live, the last request seen, the server's death, the end; and the serving /
idle seconds the idle tracker measured from the engine's request counters. Every segment is GPU-seconds
= allocated GPUs x seconds; the segments add up to the allocation (docs/operating.md "Where the
GPU-hours went"):

- ``rank_start``: job start until every rank printed its first line;
- ``weight_load``: rank 0's log from "loading" until "weights loaded" (or the next phase seen);
- ``graph_capture``: from "capturing graphs" until ready (or live);
- ``startup_other``: the rest of the way to live (KV cache, readiness probes, phases the log did not tell);
- ``serving``: live, requests in flight or finished between two samples;
- ``idle``: live, no request, but more requests came later;
- ``idle_after_last_request``: live, after the last request (or since live when none came) until the
  server stopped: what ``IDLE_STOP_AFTER_S`` gives back;
- ``live_unmeasured``: live, the request counters could not be read;
- ``after_server_died``: the server died (or failed to start) and the job still held the nodes.
"""

from __future__ import annotations

from typing import Iterable, Mapping

SEGMENTS: tuple[str, ...] = ("rank_start", "weight_load", "graph_capture", "startup_other", "serving", "idle",
                             "idle_after_last_request", "live_unmeasured", "after_server_died")
LABELS: dict[str, str] = {
    "rank_start": "rank start", "weight_load": "weight load", "graph_capture": "graph capture",
    "startup_other": "other startup", "serving": "serving", "idle": "idle between requests",
    "idle_after_last_request": "idle after the last request", "live_unmeasured": "live, not measured",
    "after_server_died": "after the server died",
}
WASTE: tuple[str, ...] = ("idle_after_last_request", "after_server_died", "idle")
_PHASE_AFTER_LOAD = ("weights-loaded", "kv-cache", "graph-capture", "ready")


# What a record may hold, so that every sum stays finite: times are epoch seconds up to the year 5138, GPU
# counts and seconds are bounded too (the launcher writes nothing near these)
MAX_TIME_S = 1e11
MAX_GPUS = 1_000_000
_TIMES = ("job_start", "ranks_up_at", "live_at", "last_request_at", "died_at", "ended_at")
_SECONDS = ("serving_s", "idle_s", "unobserved_s")


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _seconds_ok(value) -> bool:
    """A finite number of seconds (or epoch seconds) from 0 to MAX_TIME_S; never a bool."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return 0 <= value <= MAX_TIME_S  # False for nan; a huge int is compared exactly, never made a float


def problem(tl) -> str | None:
    """Why ``tl`` (an ``accounting.json`` as parsed) is not an accounting record :func:`split` can sum, in a
    few words; None when it is one. A NaN, a negative GPU count or a time in the year 10**300 would make a
    total ``nan`` or infinite: such a record is named and left out, never summed."""
    if not isinstance(tl, Mapping):
        return f"a JSON {type(tl).__name__}, not an object"
    if "job_start" not in tl:
        return "no job_start"
    for key in _TIMES:
        value = tl.get(key)
        if (value is not None or key == "job_start") and not _seconds_ok(value):
            return f"{key} is {_shown(value)}, not a time in seconds"
    for key, top in (("gpus", MAX_GPUS), ("nodes", MAX_GPUS), ("restart", MAX_GPUS)):
        value = tl.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= top):
            return f"{key} is {_shown(value)}, not a whole number from 0 to {top}"
    phases = tl.get("phases")
    if phases is not None:
        if not isinstance(phases, Mapping):
            return f"phases is {_shown(phases)}, not an object"
        for name, value in phases.items():
            if value is not None and not _seconds_ok(value):
                return f"phases.{_shown(name)[1:-1] if isinstance(name, str) else name} is {_shown(value)}, not a time"
    live = tl.get("live")
    if live is not None:
        if not isinstance(live, Mapping):
            return f"live is {_shown(live)}, not an object"
        for key in _SECONDS:
            value = live.get(key)
            if value is not None and not _seconds_ok(value):
                return f"live.{key} is {_shown(value)}, not a number of seconds"
    stop = tl.get("idle_stop_after_s")
    if stop is not None and not _seconds_ok(stop):
        return f"idle_stop_after_s is {_shown(stop)}, not a number of seconds"
    return _not_finite(tl)


def _not_finite(tl: Mapping) -> str | None:
    """Where ``tl`` holds a NaN or an infinity anywhere (the report prints the record as JSON too)."""
    stack: list = [("", tl)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, float) and value - value != 0:  # nan and inf, without importing math
            return f"{where or 'the record'} is {value!r}"
        if isinstance(value, Mapping):
            stack += [(f"{where}.{k}" if where else str(k), v) for k, v in value.items()]
        elif isinstance(value, list):
            stack += [(f"{where}[{i}]", v) for i, v in enumerate(value)]
    return None


def _clamp(t: float | None, lo: float, hi: float) -> float | None:
    return None if t is None else min(max(t, lo), hi)


def split(tl: Mapping, now: float) -> dict:
    """A timeline -> ``{"gpus", "allocated_s", "seconds": {segment: s}, "gpu_hours": {segment: h},
    "allocated_gpu_hours", "running"}``. ``now`` ends a timeline that has no end yet (a running job).
    A record :func:`problem` names is a ``ValueError`` saying why."""
    why = problem(tl)
    if why is not None:
        raise ValueError(why)
    start = float(tl["job_start"])
    end = float(tl.get("ended_at") or now)
    end = max(end, start)
    gpus = int(tl.get("gpus") or 0)
    live_at = _clamp(tl.get("live_at"), start, end)
    died_at = _clamp(tl.get("died_at"), start, end)
    to_live_end = live_at if live_at is not None else (died_at if died_at is not None else end)
    sec = dict.fromkeys(SEGMENTS, 0.0)
    ranks_up = _clamp(tl.get("ranks_up_at"), start, to_live_end)
    sec["rank_start"] = (ranks_up if ranks_up is not None else to_live_end) - start
    phases = {k: _clamp(v, start, to_live_end) for k, v in (tl.get("phases") or {}).items() if v is not None}
    if "loading" in phases:
        loaded = next((phases[p] for p in _PHASE_AFTER_LOAD if p in phases), to_live_end)
        sec["weight_load"] = max(0.0, loaded - phases["loading"])
    if "graph-capture" in phases:
        sec["graph_capture"] = max(0.0, phases.get("ready", to_live_end) - phases["graph-capture"])
    sec["startup_other"] = max(0.0, (to_live_end - start) - sec["rank_start"] - sec["weight_load"]
                               - sec["graph_capture"])
    if live_at is not None:
        live_end = died_at if died_at is not None and died_at >= live_at else end
        live_total = live_end - live_at
        live = tl.get("live") or {}
        if live.get("counters_readable"):
            last = _clamp(tl.get("last_request_at"), live_at, live_end)
            trailing = live_end - (last if last is not None else live_at)
            serving = min(float(live.get("serving_s") or 0.0), live_total - trailing)
            unmeasured = min(float(live.get("unobserved_s") or 0.0), live_total - trailing - serving)
            sec["serving"] = serving
            sec["idle_after_last_request"] = trailing
            sec["live_unmeasured"] = unmeasured
            sec["idle"] = max(0.0, live_total - trailing - serving - unmeasured)
        else:
            sec["live_unmeasured"] = live_total
        sec["after_server_died"] = end - live_end
    else:
        sec["after_server_died"] = end - to_live_end
    sec = {k: round(max(0.0, v), 3) for k, v in sec.items()}
    return {"gpus": gpus, "allocated_s": round(end - start, 3), "allocated_gpu_hours": gpu_hours(end - start, gpus),
            "seconds": sec, "gpu_hours": {k: gpu_hours(v, gpus) for k, v in sec.items()},
            "running": not tl.get("ended_at")}


def gpu_hours(seconds: float, gpus: int) -> float:
    return round(seconds * gpus / 3600.0, 4)


def would_save(tl: Mapping, sp: Mapping, stop_after_s: float) -> float:
    """GPU-hours ``IDLE_STOP_AFTER_S=stop_after_s`` would have given back from this job."""
    trailing = sp["seconds"]["idle_after_last_request"]
    return gpu_hours(max(0.0, trailing - stop_after_s), sp["gpus"])


def summarize(jobs: Iterable[Mapping], key: str, suggest_stop_s: float) -> list[dict]:
    """Jobs (each ``{"timeline", "split", "model", "shape", "site", ...}``) grouped by ``key`` ("model",
    "shape" or "site"): summed GPU-hours per segment, the share of each, and the savings an idle stop would bring."""
    groups: dict[str, dict] = {}
    for job in jobs:
        name = str(job.get(key) or "?")
        g = groups.setdefault(name, {key: name, "jobs": 0, "allocated_gpu_hours": 0.0,
                                     "gpu_hours": dict.fromkeys(SEGMENTS, 0.0), "idle_stop_would_save": 0.0})
        g["jobs"] += 1
        sp = job["split"]
        g["allocated_gpu_hours"] += sp["allocated_gpu_hours"]
        for seg in SEGMENTS:
            g["gpu_hours"][seg] += sp["gpu_hours"][seg]
        if job["timeline"].get("idle_stop_after_s") is None:
            g["idle_stop_would_save"] += would_save(job["timeline"], sp, suggest_stop_s)
    out = []
    for g in groups.values():
        total = g["allocated_gpu_hours"]
        g["allocated_gpu_hours"] = round(total, 4)
        g["gpu_hours"] = {k: round(v, 4) for k, v in g["gpu_hours"].items()}
        g["share"] = {k: (round(v / total, 4) if total else 0.0) for k, v in g["gpu_hours"].items()}
        g["idle_stop_would_save"] = round(g["idle_stop_would_save"], 4)
        out.append(g)
    return sorted(out, key=lambda g: -g["allocated_gpu_hours"])


def largest_waste(groups: list[dict], key: str, suggest_stop_s: float) -> str | None:
    """The one sentence that names the largest waste, e.g. ``glm53: 41% of 128 GPU-hours idle after the
    last request; IDLE_STOP_AFTER_S=1800 would have saved 50.2 GPU-hours``; None when nothing was wasted."""
    best = None
    for g in groups:
        for seg in WASTE:
            h = g["gpu_hours"][seg]
            if h > 0 and (best is None or h > best[0]):
                best = (h, g, seg)
    if best is None:
        return None
    h, g, seg = best
    line = (f"{g[key]}: {g['share'][seg] * 100:.0f}% of {fmt_h(g['allocated_gpu_hours'])} GPU-hours "
            f"{LABELS[seg]}")
    if seg == "idle_after_last_request" and g["idle_stop_would_save"] > 0:
        line += (f"; IDLE_STOP_AFTER_S={suggest_stop_s:g} would have saved {fmt_h(g['idle_stop_would_save'])} "
                 "GPU-hours")
    return line


def fmt_h(hours: float) -> str:
    """GPU-hours for people: two decimals below 10, one above."""
    return f"{hours:.2f}" if abs(hours) < 10 else f"{hours:.1f}"
