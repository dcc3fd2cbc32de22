"""What the gates run against: JOBID or URL -> a :class:`Target` (base URLs, served name, key, and
what the model's catalog entry expects).

A job id is looked up by the one handle (``job.find_job``, as ``env_layers status``/``wait`` do); its run
directory gives ``endpoint.json`` (written once live, so ``verify`` works right after ``env_layers wait``),
``launch.json`` (the target, hence the catalog model) and ``serve.env`` (what ran: the parsers, the fabric
keys). A URL is asked ``/v1/models`` for the served name and the model behind it. The key is read from
``--api-key-file`` or the job's key file (``Job.key_source``, as every client finds it); it is never printed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..apikey import read_key
from ..defaults import DEFAULT_EXPERIMENT
from ..errors import EnvLayersError
from ..jobid import looks_like_job_id
from ..urls import api_base
from ..readiness import models
from .client import describe



class CannotVerify(EnvLayersError):
    """The gates cannot run: no endpoint, no answer, no key (exit 2)."""


@dataclass
class Target:
    label: str
    base_urls: list[str]
    served: str = ""
    api_key: str | None = field(default=None, repr=False)
    engine: str | None = None
    model: str | None = None  # INFERENCE_MODEL, or the root /v1/models reports
    catalog_model: str | None = None
    reasoning_parser: str | None = None  # what the catalog entry names; "" none; None unknown
    tool_call_parser: str | None = None
    metrics_off: str | None = None  # the SGLANG_ENABLE_METRICS value that turned /metrics off
    metrics_url: str | None = None  # Prometheus text elsewhere than the base URL's root (endpoint.json: metrics_at)
    gdr_level: str | None = None
    multi_node: bool | None = None
    job_id: str | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"label": self.label, "base_urls": self.base_urls, "served_model_name": self.served,
                "api_key": "set" if self.api_key else None, "engine": self.engine, "model": self.model,
                "catalog_model": self.catalog_model, "reasoning_parser": self.reasoning_parser,
                "tool_call_parser": self.tool_call_parser, "job_id": self.job_id, "multi_node": self.multi_node,
                "notes": self.notes}


def is_url(spec: str) -> bool:
    return spec.startswith(("http://", "https://"))


def base_url_of(spec: str) -> str:
    """``http://host:port`` or ``.../v1`` or ``.../v1/`` -> ``http://host:port/v1`` (``urls.api_base``)."""
    from urllib.parse import urlsplit

    url = spec.rstrip("/")
    parts = urlsplit(url)
    if not parts.hostname:
        raise CannotVerify(f"{spec!r} is not a URL with a host", where="URL",
                           hint="give the base URL the endpoint block prints, e.g. http://nid001234:8000/v1")
    return api_base(url)


def catalog_entry(root_opt: str | None, catalog_model: str | None, model: str | None) -> tuple[str | None, dict]:
    """The catalog model (named, or the one serving ``model``) and its merged keys; ``(None, {})``
    when there is no catalog here or no entry matches."""
    from .. import catalog as cat
    from .. import layers
    from ..paths import find_root

    try:
        root = find_root(root_opt)
        catalog = cat.load(root)
    except EnvLayersError:
        return catalog_model, {}
    experiment = DEFAULT_EXPERIMENT if DEFAULT_EXPERIMENT in catalog.experiments else next(iter(catalog.experiments), None)
    if experiment is None:
        return catalog_model, {}
    names = [catalog_model] if catalog_model else list(catalog.models)
    for name in names:
        if name not in catalog.models:
            continue
        try:
            env = layers.load_env(root, f"{experiment}:{name}").text()
        except EnvLayersError:
            continue
        if catalog_model or (model and env.get("INFERENCE_MODEL") == model):
            return name, env
    return catalog_model, {}


def from_job(job_id: str, *, run_dir: str | None, api_key_file: str | None) -> tuple[Target, dict[str, str]]:
    from ..job import find_job

    job = find_job(job_id, run_dir=run_dir)
    files = job.files
    ep = job.endpoint
    state = job.info.state if job.info else "forgotten by Slurm"
    if ep is None:
        raise CannotVerify(f"job {job.job_id} has no endpoint.json yet ({state}; run dir: {files.run_dir})",
                           hint=f"`env_layers wait {job.job_id}` blocks until the endpoint is live, then verify")
    if job.info is not None and job.info.finished:
        raise CannotVerify(f"job {job.job_id} has ended ({state}): its endpoint is gone",
                           hint="verify a running job (`env_layers status` lists them)")
    env = job.serve_env
    launch = job.launch
    target_name = launch.target if launch is not None and launch.target is not None else ""
    urls = job.reachable_urls
    t = Target(label=f"job {job.job_id}", base_urls=urls,
               served=ep.served_model_name if ep.served_model_name is not None else "",
               engine=ep.engine, model=ep.model or env.get("INFERENCE_MODEL"),
               catalog_model=(target_name.partition(":")[2] if not target_name.startswith("base-env:") else None)
               or env.get("MODEL") or None, job_id=job.job_id)
    t.metrics_url = ep.metrics_at or None  # a router's own metrics port
    t.gdr_level = env.get("NCCL_NET_GDR_LEVEL") or None
    t.multi_node = ep.shape == "pipeline" or len(ep.nodes) > len(urls)
    if t.engine == "sglang" and "SGLANG_ENABLE_METRICS" in env:
        from ..engines.sglang import metrics_enabled

        try:
            if not metrics_enabled(env):
                t.metrics_off = env["SGLANG_ENABLE_METRICS"]
        except EnvLayersError:
            pass
    source = job.key_source()
    if api_key_file:
        t.api_key = read_key(api_key_file, named_by="--api-key-file", serving=False, owner=os.getuid())
    elif source.path:
        t.api_key = read_key(source.path, source.record, named_by=source.named_by, serving=False, owner=os.getuid())
    elif ep.api_key_required:
        raise CannotVerify(f"job {job.job_id}'s endpoint needs an API key and its serve.env names no key file",
                           hint="pass --api-key-file FILE")
    t.notes.append(f"job {job.job_id}: {state}; run dir {files.run_dir}")
    return t, env


def resolve(spec: str, *, model: str | None = None, api_key_file: str | None = None, timeout_s: float = 30.0,
            run_dir: str | None = None, root: str | None = None) -> Target:
    """The target of ``env_layers verify SPEC``, checked to answer /v1/models with the served name."""
    job_env: dict[str, str] = {}
    if is_url(spec):
        target = Target(label=base_url_of(spec), base_urls=[base_url_of(spec)])
        if api_key_file:
            target.api_key = read_key(api_key_file, named_by="--api-key-file", serving=False, owner=os.getuid())
    elif looks_like_job_id(spec):
        target, job_env = from_job(spec, run_dir=run_dir, api_key_file=api_key_file)
    else:
        raise CannotVerify(f"{spec!r} is neither a job id nor a URL", where="JOBID|URL",
                           hint="give a Slurm job id (1234) or a base URL (http://host:8000/v1)")
    if model:
        target.served = model
    _preflight(target, timeout_s)
    name, env = catalog_entry(root, target.catalog_model, target.model)
    target.catalog_model = name
    source = env or job_env  # the catalog says what the model needs; without one, what the job ran
    if source:
        target.reasoning_parser = source.get("REASONING_PARSER") or ""
        target.tool_call_parser = source.get("TOOL_CALL_PARSER") or None
    return target


def _preflight(target: Target, timeout_s: float) -> None:
    """Every base URL answers /v1/models and lists the served name (filled in from it for a URL)."""
    for url in target.base_urls:
        listing = models(url, target.served or None, target.api_key, min(timeout_s, 30.0), slack_s=0.5)
        answer = listing.answer
        if answer.status in (401, 403):
            raise CannotVerify(f"{url}/models: HTTP {answer.status}: the endpoint needs an API key",
                               hint="pass --api-key-file FILE (a job's own key file is found through its serve.env)")
        if not answer.ok or not listing.cards:
            raise CannotVerify(describe(answer) if not answer.ok else f"{url}/models: not an OpenAI model list",
                               hint="is the endpoint live? `env_layers status <jobid>` says")
        if not target.served:
            target.served = listing.name
            if len(listing.ids) > 1:
                target.notes.append(f"{url} serves {listing.ids}; verifying {listing.name!r} (--model picks another)")
        elif not listing.serves:
            raise CannotVerify(f"{url} serves {listing.ids}, not {target.served!r}", hint="pass --model NAME")
        card = listing.card
        target.model = target.model or card.get("root") or None
        owner = card.get("owned_by")
        if target.engine is None and owner in ("vllm", "sglang"):
            target.engine = owner
