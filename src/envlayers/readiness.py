"""Readiness: probing an endpoint, and the report printed once it answers (the endpoint block, and the
commands to paste that endpoint.json carries: its record is ``rundir.EndpointRecord``).

Every HTTP call has a timeout. A probe never declares failure: it says whether the endpoint
answers now: :func:`probe` whether ``/v1/models`` lists the served name (:func:`models`, the one asking of
``/v1/models`` every command and the launcher use), :func:`generates` whether a one-token completion comes
back (live means both). Failure is the launcher's call, made from the server step's exit or a spent budget.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .defaults import BANNER
from .rundir import EndpointRecord
from .urls import server_root
from . import shell

if TYPE_CHECKING:
    from .httpclient import Response

NO_KEY = "EMPTY"  # what to pass as api_key to a keyless endpoint: OpenAI clients refuse to start without one


@dataclass(frozen=True)
class Probe:
    url: str
    ok: bool  # /v1/models answered 200 and lists the served name
    status: int | None  # HTTP status, None when nothing answered
    detail: str  # one line: why not ok


@dataclass(frozen=True)
class Listing:
    """What ``GET {base_url}/models`` said: ``answer``, the HTTP outcome; ``cards``, the model cards it lists
    (None when it is no OpenAI model list); ``name``, the name asked for, or the first listed when none was."""

    answer: Response
    cards: list[dict] | None
    name: str | None

    @property
    def ids(self) -> list:
        return [card.get("id") for card in self.cards or []]

    @property
    def serves(self) -> bool:
        """The name is listed."""
        return self.cards is not None and self.name in self.ids

    @property
    def card(self) -> dict | None:
        """The listed card of the name."""
        return self.cards[self.ids.index(self.name)] if self.serves else None

    @property
    def detail(self) -> str:
        """One line: ``ok``, or why not (what is served instead, or what came back)."""
        if self.answer.status is None:
            return f"no answer: {self.answer.reason}"
        if not self.answer.ok:
            return f"HTTP {self.answer.status}"
        if self.cards is None:
            if self.answer.json() is None and self.answer.body.strip() != b"null":
                return "the answer is not JSON"
            return "the answer is not an OpenAI model list"
        return "ok" if self.serves else f"serves {self.ids}, not {self.name!r}"


def models(base_url: str, name: str | None, api_key: str | None = None, timeout_s: float = 2.0, *,
           slack_s: float | None = None) -> Listing:
    """``GET {base_url}/models`` once (``base_url`` ends in /v1): does it list ``name`` (None: the first it
    lists)? Each socket operation bounded by ``timeout_s``; with ``slack_s``, the whole answer too, within
    ``timeout_s + slack_s`` by the wall clock."""
    from . import httpclient

    url = base_url.rstrip("/") + "/models"
    kw = {"api_key": api_key, "limit": 1 << 20, "error_limit": 4096}
    answer = (httpclient.request("GET", url, timeout_s, **kw) if slack_s is None
              else httpclient.request_within("GET", url, timeout_s, slack_s=slack_s, **kw))
    data = answer.json() if answer.ok else None
    cards = data.get("data", []) if isinstance(data, dict) else None
    if not isinstance(cards, list) or not all(isinstance(card, dict) for card in cards):
        cards = None
    if name is None and cards:
        name = cards[0].get("id")
    return Listing(answer, cards, name)


def probe(base_url: str, served_name: str, api_key: str | None = None, timeout_s: float = 2.0) -> Probe:
    """GET {base_url}/models once: ``ok`` when it lists the served name. ``base_url`` ends in /v1."""
    listing = models(base_url, served_name, api_key, timeout_s)
    return Probe(listing.answer.url, listing.serves, listing.answer.status, listing.detail)


def generates(base_url: str, served_name: str, api_key: str | None = None, timeout_s: float = 60.0) -> Probe:
    """POST a one-token completion to {base_url}/completions once: ``ok`` when the engine answered with a
    choice. ``status`` is the HTTP status of a refusal (the engine's own message in ``detail``), None when
    nothing answered within ``timeout_s``. A server can list its model and still fail here (an engine
    that dies on its first forward pass)."""
    from . import httpclient

    url = base_url.rstrip("/") + "/completions"
    body = {"model": served_name, "prompt": "Hi", "max_tokens": 1, "temperature": 0}
    answer = httpclient.request("POST", url, timeout_s, json_body=body, api_key=api_key, limit=1 << 20,
                                error_limit=1 << 16)
    if not answer.ok:  # the engine's message on one line: it goes into ENVLAYERS- lines
        message = answer.message()
        said = f"HTTP {answer.status}: {' '.join(message.split())[:300]}" if message else answer.said()
        return Probe(url, False, answer.status, said)
    data = answer.json()
    if not (isinstance(data, dict) and data.get("choices")):
        return Probe(url, False, answer.status, "the answer holds no completion")
    return Probe(url, True, answer.status, "ok")


def metrics_url(ep: EndpointRecord, base_url: str | None = None) -> str:
    """Prometheus text at the server root: ``http://host:port/metrics`` (not under /v1); ``metrics_at`` when
    set (a router serves its metrics on a port of their own)."""
    if base_url is None and ep.metrics_at:
        return ep.metrics_at
    return server_root(base_url or ep.base_url) + "/metrics"


def curl(ep: EndpointRecord, base_url: str | None = None) -> str:
    body = json.dumps({
        "model": ep.served_model_name, "max_tokens": 128,
        "messages": [{"role": "user", "content": "Say hi."}],
    })
    parts = [f"curl -s {shell.word((base_url or ep.base_url) + '/chat/completions')}",
             "-H 'Content-Type: application/json'"]
    if ep.api_key_required:
        # reads the key where the operator keeps it: works as pasted, and never prints the key
        source = shell.word(ep.key_file) if ep.key_file else '"$SERVER_API_KEY_FILE"'
        parts.append(f'-H "Authorization: Bearer $(cat {source})"')
    parts.append(f"-d {shell.word(body)}")
    return " ".join(parts)


def client_api_key(ep: EndpointRecord) -> str:
    """The ``api_key=`` argument of an OpenAI client, as Python source: the key file read, or ``"EMPTY"``."""
    if not ep.api_key_required:
        return json.dumps(NO_KEY)
    if ep.key_file:
        return f"open({json.dumps(ep.key_file)}).read().strip()"
    return 'open(os.environ["SERVER_API_KEY_FILE"]).read().strip()'


def python(ep: EndpointRecord) -> list[str]:
    """A script for the official ``openai`` client: models.list() and one chat completion on every base
    URL. Printed as a shell here-document, so it runs as pasted (or save the lines between as a file)."""
    imports = "import os, openai" if ep.api_key_required and not ep.key_file else "import openai"
    ask = (f"    reply = client.chat.completions.create(model={json.dumps(ep.served_model_name)}, max_tokens=128, "
           'messages=[{"role": "user", "content": "Say hi."}])')
    return ["python3 - <<'PY'", imports,
            f"base_urls = {json.dumps(ep.base_urls)}" + ("  # one per replica: spread requests over them"
                                                        if len(ep.base_urls) > 1 else ""),
            "for base_url in base_urls:",
            f"    client = openai.OpenAI(base_url=base_url, api_key={client_api_key(ep)})",
            "    print(base_url, [m.id for m in client.models.list()])",
            ask, "    print(reply.choices[0].message.content)", "PY"]


def stop_command(ep: EndpointRecord) -> str:
    return f"env_layers stop {ep.job_id}"


def add_usage(ep: EndpointRecord) -> EndpointRecord:
    """``ep`` with the commands endpoint.json carries for a reader without envlayers (``stop``, ``curl``, one
    ``curls`` per base URL, ``python``, ``client_api_key``) filled from its fields."""
    ep.stop, ep.curl = stop_command(ep), curl(ep)
    ep.curls = [curl(ep, u) for u in ep.base_urls]
    ep.python = "\n".join(python(ep)) + "\n"
    ep.client_api_key = None if ep.api_key_required else NO_KEY
    return ep


REQUIRED = ("job_id", "served_model_name", "model", "engine", "shape", "api_key_required", "run_dir")


def block(ep: EndpointRecord) -> str:
    """The text block the job prints; greppable, stable, no secrets. ValueError for a record that lacks what
    the block says (a hand-made or cut-short endpoint.json)."""
    missing = [name for name in REQUIRED if getattr(ep, name) is None] + ([] if ep.base_urls else ["base_urls"])
    if missing:
        raise ValueError(f"endpoint.json has no {', '.join(missing)}")
    lines = [BANNER]
    if len(ep.base_urls) == 1:
        lines.append(f"base URL: {ep.base_url}")
    else:
        lines.append(f"base URLs: {len(ep.base_urls)} independent replicas, the client spreads load over "
                     f"all of them (endpoint.json: base_urls)")
        lines += [f"base URL: {u}" for u in ep.base_urls]
    if ep.node_local:
        node = ep.nodes[0] if ep.nodes else "the first node"
        lines.append(f"reach: on {node} only (SERVER_HOST binds loopback); from elsewhere open a tunnel: "
                     f"env_layers tunnel {ep.job_id} (docs/access.md)")
    lines.append(f"served name: {ep.served_model_name} (what clients pass as model)")
    if ep.metrics is not False:
        lines.append(f"metrics: {metrics_url(ep)}")
    lines.append(f"model id: {ep.model} ({ep.engine}, {ep.shape})")
    if ep.site:
        lines.append(f"site: {ep.site}")
    if ep.api_key_required:
        where = ep.key_file or "SERVER_API_KEY_FILE"
        lines.append(f"API key: required (the key in {where}; send 'Authorization: Bearer <key>')")
    else:
        lines.append(f"API key: none needed, but OpenAI clients refuse to start without one: pass any placeholder, "
                     f"e.g. api_key=\"{NO_KEY}\" (anyone who can reach the node can use this endpoint)")
    if ep.startup_s is not None:
        lines.append(f"startup: {ep.startup_s:.0f}s")
    lines.append(f"stop: {stop_command(ep)} (the endpoint stays up until this job ends)")
    lines.append(f"run dir: {ep.run_dir}")
    lines.append("try (curl):")
    lines += [f"  {curl(ep, u)}" for u in ep.base_urls]
    lines.append("try (Python, pip install openai):")
    lines += python(ep)
    return "\n".join(lines) + "\n"
