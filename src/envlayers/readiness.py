"""Readiness: probing an endpoint, and the report printed once it answers.

Every HTTP call has a timeout. A probe never declares failure: it says whether the endpoint
answers now: :func:`probe` whether ``/v1/models`` lists the served name, :func:`generates` whether a
one-token completion comes back (live means both). Failure is the launcher's call, made from the server step's exit or a spent budget.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import asdict, dataclass, field

from .defaults import BANNER
from .urls import server_root

NO_KEY = "EMPTY"  # what to pass as api_key to a keyless endpoint: OpenAI clients refuse to start without one


@dataclass(frozen=True)
class Probe:
    url: str
    ok: bool  # /v1/models answered 200 and lists the served name
    status: int | None  # HTTP status, None when nothing answered
    detail: str  # one line: why not ok


def probe(base_url: str, served_name: str, api_key: str | None = None, timeout_s: float = 2.0) -> Probe:
    """GET {base_url}/models once. ``base_url`` ends in /v1."""
    url = base_url.rstrip("/") + "/models"
    answer = _ask("GET", url, None, api_key, timeout_s)
    if isinstance(answer, Probe):
        return answer
    status, body = answer
    try:
        names = [m.get("id") for m in json.loads(body).get("data", [])]
    except (ValueError, AttributeError):
        return Probe(url, False, status, "answer is not an OpenAI model list")
    if served_name not in names:
        return Probe(url, False, status, f"serves {names}, not {served_name!r}")
    return Probe(url, True, status, "ok")


def generates(base_url: str, served_name: str, api_key: str | None = None, timeout_s: float = 60.0) -> Probe:
    """POST a one-token completion to {base_url}/completions once: ``ok`` when the engine answered with a
    choice. ``status`` is the HTTP status of a refusal (the engine's own message in ``detail``), None when
    nothing answered within ``timeout_s``. A server can list its model and still fail here (an engine
    that dies on its first forward pass)."""
    url = base_url.rstrip("/") + "/completions"
    body = {"model": served_name, "prompt": "Hi", "max_tokens": 1, "temperature": 0}
    answer = _ask("POST", url, body, api_key, timeout_s, with_message=True)
    if isinstance(answer, Probe):
        return answer
    status, text = answer
    try:
        choices = json.loads(text).get("choices")
    except (ValueError, AttributeError):
        choices = None
    if not choices:
        return Probe(url, False, status, "the answer holds no completion")
    return Probe(url, True, status, "ok")


def _ask(method: str, url: str, body: dict | None, api_key: str | None, timeout_s: float,
         with_message: bool = False):
    """``(status, body)`` of one bounded request, or the not-ok Probe saying why there is none (the engine's
    own message from an error body, ``with_message``)."""
    from . import httpclient

    try:
        answer = httpclient.request(method, url, timeout_s, json_body=body, api_key=api_key, limit=1 << 20,
                                    error_limit=1 << 16)
    except httpclient.HttpError as err:
        if err.status is not None:
            return Probe(url, False, err.status, f"HTTP {err.status}{_engine_message(err.body) if with_message else ''}")
        return Probe(url, False, None, f"no answer: {err.reason}")
    return answer.status, answer.body


def _engine_message(body: bytes) -> str:
    """``: <message>`` from an OpenAI-style error body, or ``""``."""
    from .httpclient import engine_message

    message = engine_message(body)
    return f": {' '.join(message.split())[:300]}" if message else ""


@dataclass
class Endpoint:
    """What the operator needs once the endpoint answers; also written as endpoint.json."""

    job_id: str
    served_model_name: str
    model: str
    engine: str
    shape: str
    base_urls: list[str]
    api_key_required: bool
    run_dir: str
    startup_s: float | None = None
    nodes: list[str] = field(default_factory=list)
    metrics: bool | None = None  # None: the engine serves /metrics (vLLM always; SGLang unless turned off)
    restart: int = 0  # SLURM_RESTART_COUNT of the run that went live
    key_file: str | None = None  # SERVER_API_KEY_FILE: the printed curl reads the key from it
    node_local: bool = False  # SERVER_HOST binds loopback: only the node itself, or `env_layers tunnel`, reach it
    metrics_at: str | None = None  # the Prometheus URL when it is not the base URL's root (a router's own port)

    @property
    def base_url(self) -> str:
        return self.base_urls[0]

    def metrics_url(self, base_url: str | None = None) -> str:
        """Prometheus text at the server root: ``http://host:port/metrics`` (not under /v1); ``metrics_at`` when
        set (a router serves its metrics on a port of their own)."""
        if base_url is None and self.metrics_at:
            return self.metrics_at
        return server_root(base_url or self.base_url) + "/metrics"

    def curl(self, base_url: str | None = None) -> str:
        body = json.dumps({
            "model": self.served_model_name, "max_tokens": 128,
            "messages": [{"role": "user", "content": "Say hi."}],
        })
        parts = [f"curl -s {shlex.quote((base_url or self.base_url) + '/chat/completions')}",
                 "-H 'Content-Type: application/json'"]
        if self.api_key_required:
            # reads the key where the operator keeps it: works as pasted, and never prints the key
            source = shlex.quote(self.key_file) if self.key_file else '"$SERVER_API_KEY_FILE"'
            parts.append(f'-H "Authorization: Bearer $(cat {source})"')
        parts.append(f"-d {shlex.quote(body)}")
        return " ".join(parts)

    def client_api_key(self) -> str:
        """The ``api_key=`` argument of an OpenAI client, as Python source: the key file read, or ``"EMPTY"``."""
        if not self.api_key_required:
            return json.dumps(NO_KEY)
        if self.key_file:
            return f"open({json.dumps(self.key_file)}).read().strip()"
        return 'open(os.environ["SERVER_API_KEY_FILE"]).read().strip()'

    def python(self) -> list[str]:
        """A script for the official ``openai`` client: models.list() and one chat completion on every base
        URL. Printed as a shell here-document, so it runs as pasted (or save the lines between as a file)."""
        imports = "import os, openai" if self.api_key_required and not self.key_file else "import openai"
        ask = (f"    reply = client.chat.completions.create(model={json.dumps(self.served_model_name)}, max_tokens=128, "
               'messages=[{"role": "user", "content": "Say hi."}])')
        return ["python3 - <<'PY'", imports,
                f"base_urls = {json.dumps(self.base_urls)}" + ("  # one per replica: spread requests over them"
                                                              if len(self.base_urls) > 1 else ""),
                "for base_url in base_urls:",
                f"    client = openai.OpenAI(base_url=base_url, api_key={self.client_api_key()})",
                "    print(base_url, [m.id for m in client.models.list()])",
                ask, "    print(reply.choices[0].message.content)", "PY"]

    def stop(self) -> str:
        return f"env_layers stop {self.job_id}"

    def to_json(self) -> str:
        data = asdict(self)
        data.update(base_url=self.base_url, stop=self.stop(), curl=self.curl(),
                    curls=[self.curl(u) for u in self.base_urls], python="\n".join(self.python()) + "\n",
                    client_api_key=None if self.api_key_required else NO_KEY)
        return json.dumps(data, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> "Endpoint":
        data = json.loads(text)
        keep = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**keep)

    def block(self) -> str:
        """The text block the job prints; greppable, stable, no secrets."""
        lines = [BANNER]
        if len(self.base_urls) == 1:
            lines.append(f"base URL: {self.base_url}")
        else:
            lines.append(f"base URLs: {len(self.base_urls)} independent replicas, the client spreads load over "
                         f"all of them (endpoint.json: base_urls)")
            lines += [f"base URL: {u}" for u in self.base_urls]
        if self.node_local:
            node = self.nodes[0] if self.nodes else "the first node"
            lines.append(f"reach: on {node} only (SERVER_HOST binds loopback); from elsewhere open a tunnel: "
                         f"env_layers tunnel {self.job_id} (docs/access.md)")
        lines.append(f"served name: {self.served_model_name} (what clients pass as model)")
        if self.metrics is not False:
            lines.append(f"metrics: {self.metrics_url()}")
        lines.append(f"model id: {self.model} ({self.engine}, {self.shape})")
        if self.api_key_required:
            where = self.key_file or "SERVER_API_KEY_FILE"
            lines.append(f"API key: required (the key in {where}; send 'Authorization: Bearer <key>')")
        else:
            lines.append(f"API key: none needed, but OpenAI clients refuse to start without one: pass any placeholder, "
                         f"e.g. api_key=\"{NO_KEY}\" (anyone who can reach the node can use this endpoint)")
        if self.startup_s is not None:
            lines.append(f"startup: {self.startup_s:.0f}s")
        lines.append(f"stop: {self.stop()} (the endpoint stays up until this job ends)")
        lines.append(f"run dir: {self.run_dir}")
        lines.append("try (curl):")
        lines += [f"  {self.curl(u)}" for u in self.base_urls]
        lines.append("try (Python, pip install openai):")
        lines += self.python()
        return "\n".join(lines) + "\n"
