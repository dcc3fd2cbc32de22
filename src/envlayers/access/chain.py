"""Where a chain's endpoint is now: from a job, follow ``chain.json`` (launch.successor) to the newest
successor that serves, for ``connect`` and ``status`` (a client that kept a node URL learns the new one;
cli.access_format says it in words).

A link serves when its run directory holds ``endpoint.json`` and no ``launch-end.json`` (the run has
not ended) and Slurm says it runs. Each successor's run directory is beside its predecessor's
(``$RUN_ROOT/<jobid>``), as the launcher that submitted it expects.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

MAX_LINKS = 1000  # a chain.json cycle (a hand-edited file) must not loop forever


def chain_links(job_id: str, run_dir: str | Path | None) -> list[tuple[str, Path]]:
    """``[(job id, run dir), ...]``: this job, then each successor its ``chain.json`` names, in order."""
    if not run_dir:
        return []
    links = [(str(job_id), Path(run_dir))]
    seen = {str(job_id)}
    while len(links) < MAX_LINKS:
        try:
            data = json.loads((links[-1][1] / "chain.json").read_text())
        except (OSError, ValueError):
            break
        succ = str(data.get("successor") or "") if isinstance(data, dict) else ""
        if not succ.isdigit() or succ in seen:  # a job id, never a path (chain.json may be edited by hand)
            break
        seen.add(succ)
        links.append((succ, links[-1][1].parent / succ))
    return links


def _serving_files(run_dir: Path) -> dict | None:
    """endpoint.json of a run that has not ended (no launch-end.json), else ``None``."""
    if (run_dir / "launch-end.json").exists():
        return None
    try:
        data = json.loads((run_dir / "endpoint.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


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
        data = _serving_files(folder)
        if data is None:
            continue
        info = job_info(jid)
        if info is None or not info.running or info.state == "COMPLETING":
            continue
        urls = list(data.get("base_urls") or ([data["base_url"]] if data.get("base_url") else []))
        return {"from": str(job_id), "to": jid, "links": [j for j, _ in links[:n + 1]], "state": info.state,
                "base_urls": urls, "run_dir": str(folder)}
    return None
