"""``ping``: does an endpoint answer? ``GET /v1/models`` and a one-token chat completion, each timed.

Standard library HTTP only, every request with a timeout; the key goes in a header, never on a
command line or in the output. Exit 0 when both checks pass, 1 when the endpoint fails them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

from ..errors import EnvLayersError
from ..urls import api_base

if TYPE_CHECKING:
    from ..httpclient import Response

EXIT_OK, EXIT_FAILED = 0, 1


@dataclass
class Check:
    name: str  # "models" | "chat"
    url: str
    ok: bool
    status: int | None
    latency_s: float | None
    detail: str


@dataclass
class PingResult:
    base_url: str
    served_model_name: str | None
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    def to_dict(self) -> dict:
        return {"base_url": self.base_url, "served_model_name": self.served_model_name, "ok": self.ok,
                "checks": [asdict(c) for c in self.checks]}


def normalize_base_url(text: str) -> str:
    """``http://h:p`` or ``http://h:p/v1`` -> ``http://h:p/v1``; anything else is an input error."""
    url = (text or "").strip()
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise EnvLayersError(f"{text!r} is neither a job id nor an http(s) URL",
                             hint="give the job id, or a base URL such as http://127.0.0.1:8001/v1")
    try:
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise EnvLayersError(f"{text!r} has an invalid port", hint="e.g. http://127.0.0.1:8001/v1") from None
    return api_base(urlunsplit((parts.scheme, parts.netloc, parts.path, "", "")))


def _detail(answer: Response, api_key: str | None) -> str:
    """Why an answer is no success: what came back, a refused key said as such."""
    if answer.status == 401:
        return "HTTP 401: " + ("the key was refused" if api_key else "the endpoint wants a key (--api-key-file FILE)")
    return answer.said(200)


def _spent(answer: Response) -> float | None:
    return round(answer.elapsed_s, 4) if answer.status is not None else None


def ping(base_url: str, served: str | None = None, api_key: str | None = None, timeout_s: float = 10.0) -> PingResult:
    """Both checks against one base URL (ending in /v1), each within about ``timeout_s`` in all: the timeout
    bounds each socket operation, and a server that trickles bytes is cut off by the wall clock.
    ``served=None`` takes the first listed model."""
    from .. import httpclient
    from ..readiness import models

    result = PingResult(base_url, served)
    listing = models(base_url, served, api_key, timeout_s, slack_s=1.0)
    answer = listing.answer
    detail = listing.detail if answer.ok else _detail(answer, api_key)
    if listing.serves and served is None:
        result.served_model_name = served = listing.name
        detail = f"ok, serves {listing.ids}"
    result.checks.append(Check("models", answer.url, listing.serves, answer.status, _spent(answer), detail))
    if not listing.serves and answer.status is None:
        return result  # nothing answers: a chat request would only wait the same timeout again
    url = base_url.rstrip("/") + "/chat/completions"
    body = {"model": served or "", "max_tokens": 1, "messages": [{"role": "user", "content": "ping"}]}
    answer = httpclient.request_within("POST", url, timeout_s, slack_s=1.0, json_body=body, api_key=api_key,
                                       limit=1 << 20, error_limit=4096)
    ok, data = False, answer.json()
    if not answer.ok:
        detail = _detail(answer, api_key)
    elif data is None and answer.body.strip() != b"null":
        detail = "the answer is not JSON"
    else:
        try:
            choice = data["choices"][0]
            ok, detail = True, f"ok, finish_reason={choice.get('finish_reason')}"
        except (KeyError, IndexError, TypeError, AttributeError):
            detail = "the answer has no choices"
    result.checks.append(Check("chat", url, ok, answer.status, _spent(answer), detail))
    return result
