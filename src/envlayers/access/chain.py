"""Where a chain's endpoint is now: from a job, follow ``chain.json`` (launch.successor) to the newest
successor that serves, for ``connect`` and ``status`` (a client that kept a node URL learns the new one;
cli.access_format says it in words).

A link serves when its run directory holds ``endpoint.json`` and no ``launch-end.json`` (the run has
not ended) and Slurm says it runs. Each successor's run directory is beside its predecessor's
(``$RUN_ROOT/<jobid>``), as the launcher that submitted it expects.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..rundir import chain_links, serving_endpoint

def newest_live(job_id: str, run_dir: str | Path | None, job_info: Callable | None = None) -> dict | None:
    """The newest successor of ``job_id`` that serves, as ``{"from", "to", "links", "state", "base_urls",
    "run_dir"}`` (``links``: the job ids from ``from`` to ``to``); ``None`` when the job has no
    successor that serves (it serves itself, or its successor is not live yet)."""
    links = chain_links(job_id, run_dir)
    if len(links) < 2:
        return None
    if job_info is None:
        from .. import slurm

        def job_info(jid: str):
            return slurm.job_info(jid, run=slurm.run)

    for n in range(len(links) - 1, 0, -1):
        jid, folder = links[n]
        ep = serving_endpoint(folder)
        if ep is None:
            continue
        info = job_info(jid)
        if info is None or not info.running or info.state == "COMPLETING":
            continue
        return {"from": str(job_id), "to": jid, "links": [j for j, _ in links[:n + 1]], "state": info.state,
                "base_urls": list(ep.base_urls), "run_dir": str(folder)}
    return None
