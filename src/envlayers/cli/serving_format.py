"""The serving part of ``status JOBID``'s record: the GPU-hour split and which replicas are alive.

Terminal text only, from the records ``envlayers.ops`` returns (``accounting`` and ``endpoint``)."""

from __future__ import annotations

from .textfmt import fmt_duration
from .textfmt import label as _label


def gpu_hours_lines(acct: dict | None) -> list[str]:
    """``status JOBID``'s GPU-hour split (docs/operating.md "Where the GPU-hours went")."""
    from ..accounting import LABELS, fmt_h

    if not acct or not acct.get("split"):
        return []
    sp = acct["split"]
    so_far = " so far" if sp.get("running") else ""
    lines = [_label("GPU-hours") + f"{fmt_h(sp['allocated_gpu_hours'])} allocated{so_far} ({sp['gpus']} GPUs x "
             f"{fmt_duration(sp['allocated_s'])})"]
    if acct.get("end_from") == "slurm":
        lines.append("    (the launcher's final record is missing: counted up to Slurm's end time)")
    for seg, hours in sp["gpu_hours"].items():
        if sp["seconds"][seg] > 0:
            share = hours / sp["allocated_gpu_hours"] * 100 if sp["allocated_gpu_hours"] else 0.0
            lines.append(f"    {LABELS[seg] + ':':<30}{fmt_h(hours):>8} ({share:.0f}%, "
                         f"{fmt_duration(sp['seconds'][seg])})")
    return lines


def replica_lines(ep: dict) -> list[tuple[str, str]]:
    """(label, text): ``replicas`` (how many alive of how many) and a ``dropped`` line per dropped replica;
    for the gateway shape, how many Ray Serve reports healthy and the replicas' latest events."""
    from ..rundir import replica_rows

    rows = replica_rows(ep)
    if not rows:
        return gateway_lines(ep)
    pool = ep.get("pool") if isinstance(ep.get("pool"), dict) else None
    added = [r for r in (pool or {}).get("replicas") or [] if isinstance(r, dict)]
    alive = [r for r in rows if r.get("alive")]
    out = [("replicas", f"{len(alive)} of {len(rows)} alive (" + ", ".join(
        f"rank {r.get('rank')} on {r.get('node')}" for r in alive) + f"); the job ends below "
        f"MIN_REPLICAS={ep.get('min_replicas', 1)}")]
    out += [("dropped", f"rank {r.get('rank')} on {r.get('node')}: {r.get('ended') or 'ended'}")
            for r in rows if not r.get("alive")]
    routed = ep.get("router_state")
    if isinstance(routed, dict) and isinstance(routed.get("workers"), dict) and routed["workers"]:
        workers = routed["workers"]
        down = [url for url, ok in workers.items() if not ok]
        out.append(("router", f"{len(workers) - len(down)} of {len(workers)} replica(s) healthy in the router's own "
                              "checks" + (f" (down: {', '.join(down)})" if down else "")))
    if pool is not None:
        out.append(("pool", f"{len(alive) + len(added)} replicas serve, up to MAX_REPLICAS={pool.get('max_replicas')}"
                            + "".join(f"; replica job {r.get('job')} on {r.get('node')} ({r.get('url')})"
                                      for r in added)))
    return out


def gateway_lines(endpoint: dict) -> list[tuple[str, str]]:
    """(label, text) for status and wait: the replicas Serve reports healthy, and the latest events
    (the gateway's state file, which ``rundir.JobFiles.endpoint_data`` puts under ``gateway``)."""
    rec = endpoint.get("gateway") if isinstance(endpoint, dict) else None
    if not isinstance(rec, dict) or rec.get("healthy") is None:
        return []
    out = [("replicas", f"{rec['healthy']} of {rec.get('replicas')} healthy behind the gateway (Ray Serve "
                        f"replaces one that dies); the job ends after {rec.get('grace_s')}s below "
                        f"MIN_REPLICAS={rec.get('min_replicas')}")]
    out += [("replica", str(event)) for event in rec.get("events") or []]
    return out
