"""The serving part of ``status JOBID``'s record: the GPU-hour split and which replicas are alive.

Terminal text only, from the records ``envlayers.ops`` returns (``accounting`` and ``endpoint``)."""

from __future__ import annotations

from ..rundir import EndpointRecord
from ..durations import compact
from .textfmt import label as _label


def gpu_hours_lines(acct: dict | None) -> list[str]:
    """``status JOBID``'s GPU-hour split (docs/operating.md "Where the GPU-hours went")."""
    from ..accounting import LABELS, fmt_h

    if not acct or not acct.get("split"):
        return []
    sp = acct["split"]
    so_far = " so far" if sp.get("running") else ""
    lines = [_label("GPU-hours") + f"{fmt_h(sp['allocated_gpu_hours'])} allocated{so_far} ({sp['gpus']} GPUs x "
             f"{compact(sp['allocated_s'])})"]
    if acct.get("end_from") == "slurm":
        lines.append("    (the launcher's final record is missing: counted up to Slurm's end time)")
    for seg, hours in sp["gpu_hours"].items():
        if sp["seconds"][seg] > 0:
            share = hours / sp["allocated_gpu_hours"] * 100 if sp["allocated_gpu_hours"] else 0.0
            lines.append(f"    {LABELS[seg] + ':':<30}{fmt_h(hours):>8} ({share:.0f}%, "
                         f"{compact(sp['seconds'][seg])})")
    return lines


def replica_lines(ep: EndpointRecord) -> list[tuple[str, str]]:
    """(label, text): ``replicas`` (how many alive of how many) and a ``dropped`` line per dropped replica;
    for the gateway shape, how many Ray Serve reports healthy and the replicas' latest events."""
    rows = ep.replicas or []
    if not rows:
        return gateway_lines(ep)
    pool = ep.pool
    added = [r for r in (pool or {}).get("replicas") or [] if isinstance(r, dict)]
    alive = [r for r in rows if r.alive]
    out = [("replicas", f"{len(alive)} of {len(rows)} alive (" + ", ".join(
        f"rank {r.rank} on {r.node}" for r in alive) + f"); the job ends below "
        f"MIN_REPLICAS={1 if ep.min_replicas is None else ep.min_replicas}")]
    out += [("dropped", f"rank {r.rank} on {r.node}: {r.ended or 'ended'}") for r in rows if not r.alive]
    if ep.router_state is not None and ep.router_state.workers:
        workers = ep.router_state.workers
        down = [url for url, ok in workers.items() if not ok]
        out.append(("router", f"{len(workers) - len(down)} of {len(workers)} replica(s) healthy in the router's own "
                              "checks" + (f" (down: {', '.join(down)})" if down else "")))
    if pool is not None:
        out.append(("pool", f"{len(alive) + len(added)} replicas serve, up to MAX_REPLICAS={pool.get('max_replicas')}"
                            + "".join(f"; replica job {r.get('job')} on {r.get('node')} ({r.get('url')})"
                                      for r in added)))
    return out


def gateway_lines(endpoint: EndpointRecord) -> list[tuple[str, str]]:
    """(label, text) for status and wait: the replicas Serve reports healthy, and the latest events
    (the gateway's state file, which ``rundir.JobFiles.endpoint`` reads as ``gateway``)."""
    rec = endpoint.gateway
    if rec is None or rec.healthy is None:
        return []
    out = [("replicas", f"{rec.healthy} of {rec.replicas} healthy behind the gateway (Ray Serve "
                        f"replaces one that dies); the job ends after {rec.grace_s}s below "
                        f"MIN_REPLICAS={rec.min_replicas}")]
    out += [("replica", event) for event in rec.events]
    return out
