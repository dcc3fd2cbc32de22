"""``ping``: does an endpoint answer? ``GET /v1/models`` and a one-token chat completion, each timed.

Standard library HTTP only, every request with a timeout; the key goes in a header, never on a
command line or in the output. Exit 0 when both checks pass, 1 when the endpoint fails them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from urllib.parse import urlsplit, urlunsplit

from ..errors import EnvLayersError
from ..urls import api_base

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


def _request(url: str, body: dict | None, api_key: str | None, timeout_s: float):
    """(status, parsed JSON or None, detail, seconds), within about ``timeout_s`` in all: the timeout
    bounds each socket operation, and a server that trickles bytes is cut off by the wall clock."""
    from .. import httpclient

    try:
        answer = httpclient.request_within("POST" if body is not None else "GET", url, timeout_s, slack_s=1.0,
                                           json_body=body, api_key=api_key, limit=1 << 20, error_limit=4096)
    except httpclient.HttpError as err:
        if err.incomplete:
            return None, None, f"no answer: no complete reply within {timeout_s:g}s", err.elapsed_s
        if err.status is None:
            return None, None, f"no answer: {err.reason}", err.elapsed_s
        detail = f"HTTP {err.status}"
        if err.status == 401:
            detail += (": the endpoint wants a key (--api-key-file FILE)" if not api_key
                       else ": the key was refused")
        else:
            message = httpclient.engine_message(err.body, 200)
            if message:
                detail += f": {message}"
        return err.status, None, detail, err.elapsed_s
    data = answer.json()
    if data is None and answer.body.strip() != b"null":
        return answer.status, None, "the answer is not JSON", answer.elapsed_s
    return answer.status, data, "ok", answer.elapsed_s


def ping(base_url: str, served: str | None = None, api_key: str | None = None, timeout_s: float = 10.0) -> PingResult:
    """Both checks against one base URL (ending in /v1). ``served=None`` takes the first listed model."""
    result = PingResult(base_url, served)
    url = base_url.rstrip("/") + "/models"
    status, data, detail, spent = _request(url, None, api_key, timeout_s)
    ok = False
    if status == 200 and data is not None:
        try:
            names = [m.get("id") for m in data.get("data", [])]
        except AttributeError:
            names = None
        if names is None:
            detail = "the answer is not an OpenAI model list"
        elif served is None and names:
            result.served_model_name = served = names[0]
            ok, detail = True, f"ok, serves {names}"
        elif served in names:
            ok, detail = True, "ok"
        else:
            detail = f"serves {names}, not {served!r}"
    elif status == 200:
        pass  # detail says why
    result.checks.append(Check("models", url, ok, status, round(spent, 4) if status else None, detail))
    if not ok and status is None:
        return result  # nothing answers: a chat request would only wait the same timeout again
    url = base_url.rstrip("/") + "/chat/completions"
    body = {"model": served or "", "max_tokens": 1, "messages": [{"role": "user", "content": "ping"}]}
    status, data, detail, spent = _request(url, body, api_key, timeout_s)
    ok = False
    if status == 200 and data is not None:
        try:
            choice = data["choices"][0]
            ok, detail = True, f"ok, finish_reason={choice.get('finish_reason')}"
        except (KeyError, IndexError, TypeError, AttributeError):
            detail = "the answer has no choices"
    result.checks.append(Check("chat", url, ok, status, round(spent, 4) if status else None, detail))
    return result
