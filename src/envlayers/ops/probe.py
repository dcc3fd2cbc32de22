"""Asking a job's endpoint whether it answers: which URLs (``endpoint.json``'s node addresses put in the
base URLs' place, since node names may not resolve on the login node) and the probe of each."""

from __future__ import annotations

from ..rundir import EndpointRecord


def endpoint_urls(ep: EndpointRecord | None) -> list[str]:
    """The URLs to probe: endpoint.json's ``addresses`` matching the base URLs, each either a URL (used
    as is) or an IP (put in the base URL's place); else the base URLs."""
    return [] if ep is None else _reachable(ep.base_urls, ep.addresses)


def _reachable(bases: list[str], addresses: list[str]) -> list[str]:
    urls = []
    for i, base in enumerate(bases):
        addr = addresses[i] if i < len(addresses) else None
        if not addr:
            urls.append(base)
        elif "://" in str(addr):
            urls.append(str(addr))
        else:
            urls.append(_with_host(base, str(addr)))
    return urls


def replica_urls(ep: EndpointRecord | None) -> list[str]:
    """Each replica's own URL to probe: behind a router (endpoint.json's ``replica_urls`` and
    ``replica_addresses``, the live replicas) the replicas' URLs with their node addresses put in, else
    the same as :func:`endpoint_urls`."""
    if ep is None or not ep.replica_urls:
        return endpoint_urls(ep)
    return _reachable(ep.replica_urls, ep.replica_addresses or [])


def _with_host(url: str, host: str) -> str:
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    netloc = host if parts.port is None else f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def probe_all(ep: EndpointRecord | None, served: str, timeout_s: float) -> list[dict]:
    """``{"url", "answers", "ok", "detail"}`` for every URL of the endpoint record."""
    from .. import readiness

    answers = []
    for url in endpoint_urls(ep):
        p = readiness.probe(url, served, timeout_s=timeout_s)
        answers.append({"url": url, "answers": p.status is not None, "ok": p.ok, "detail": p.detail})
    return answers
