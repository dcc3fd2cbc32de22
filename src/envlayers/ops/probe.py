"""Asking a job's endpoint whether it answers: the probe of each URL that reaches it from here
(``job.endpoint_urls``: endpoint.json's node addresses put in the base URLs' place, since node names may
not resolve on the login node)."""

from __future__ import annotations

from ..job import endpoint_urls
from ..rundir import EndpointRecord


def probe_all(ep: EndpointRecord | None, served: str, timeout_s: float) -> list[dict]:
    """``{"url", "answers", "ok", "detail"}`` for every URL of the endpoint record."""
    from .. import readiness

    answers = []
    for url in endpoint_urls(ep):
        p = readiness.probe(url, served, timeout_s=timeout_s)
        answers.append({"url": url, "answers": p.status is not None, "ok": p.ok, "detail": p.detail})
    return answers
