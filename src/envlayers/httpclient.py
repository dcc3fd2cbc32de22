"""The one HTTP client of the login node and the launcher: every request with a bounded timeout.

Standard library only (``urllib.request``). Every call takes ``timeout_s``, which bounds each socket
operation; :func:`request_within` also bounds the whole answer by the wall clock (a server that
accepts the connection and then trickles bytes is cut off). A request that gets no 2xx answer raises
:class:`HttpError`, carrying the URL and the reason (and the status and error body when the server
answered). The API key goes in the ``Authorization`` header and nowhere else: never in a message.

The two files the job copies into the container (``gateway_app.py``, ``launch/raynode.py``) stay
standalone and keep their own few lines of ``urllib``.

Named ``httpclient`` rather than ``http``: a script run from this directory (``gateway_app.py`` when
tried by hand) would otherwise find this file first as the standard library's ``http`` package.
"""

from __future__ import annotations

import json
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

MAX_BODY = 8 << 20  # the most of an answer's body read into memory


class HttpError(Exception):
    """No 2xx answer from ``url``. ``status`` is the HTTP status when the server answered (its body in
    ``body``), None when nothing answered; ``reason`` says why in a few words; ``timed_out`` when a
    socket operation ran out of time, ``incomplete`` when :func:`request_within`'s wall clock ran out."""

    def __init__(self, url: str, reason: Any, *, status: int | None = None, body: bytes = b"",
                 timed_out: bool = False, incomplete: bool = False, elapsed_s: float = 0.0):
        super().__init__(f"{url}: {f'HTTP {status}' if status is not None else reason}")
        self.url, self.reason, self.status, self.body = url, reason, status, body
        self.timed_out, self.incomplete, self.elapsed_s = timed_out, incomplete, elapsed_s

    def json(self) -> Any:
        return _json(self.body)


@dataclass
class Response:
    url: str
    status: int
    body: bytes
    elapsed_s: float

    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def json(self) -> Any:
        """The body as JSON; None when it is not JSON."""
        return _json(self.body)


def _json(body: bytes) -> Any:
    try:
        return json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None


def _request(method: str, url: str, data: bytes | None, api_key: str | None, accept: str | None,
             content_type: str | None):
    import urllib.request

    req = urllib.request.Request(url, data=data, method=method, headers={"Accept": accept} if accept else {})
    if content_type is not None:
        req.add_header("Content-Type", content_type)
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    return req


@contextmanager
def _open(method: str, url: str, timeout_s: float, *, data: bytes | None, api_key: str | None,
          accept: str | None, content_type: str | None, error_limit: int):
    """The open response of a 2xx answer; :class:`HttpError` otherwise (the error body read, up to ``error_limit``)."""
    import urllib.error
    import urllib.request

    started = time.monotonic()
    try:
        req = _request(method, url, data, api_key, accept, content_type)
        resp = urllib.request.urlopen(req, timeout=timeout_s)  # noqa: S310 - http(s) URLs the operator or the job gave
    except urllib.error.HTTPError as err:
        try:
            body = err.read(error_limit)
        except OSError:
            body = b""
        raise HttpError(url, f"HTTP {err.code}", status=err.code, body=body,
                        elapsed_s=time.monotonic() - started) from None
    except (urllib.error.URLError, OSError, ValueError) as err:
        reason = getattr(err, "reason", err)
        timed_out = (isinstance(err, TimeoutError) or isinstance(reason, TimeoutError)
                     or "timed out" in str(reason))
        raise HttpError(url, reason, timed_out=timed_out, elapsed_s=time.monotonic() - started) \
            from (reason if isinstance(reason, BaseException) else err)
    with resp:
        yield resp, started


def request(method: str, url: str, timeout_s: float, *, json_body: Any = None, data: bytes | None = None,
            api_key: str | None = None, accept: str | None = "application/json", content_type: str | None = None,
            limit: int = MAX_BODY, error_limit: int = MAX_BODY) -> Response:
    """One request, each socket operation bounded by ``timeout_s``; the body read up to ``limit`` bytes.
    ``json_body`` is sent as JSON (Content-Type set), ``data`` as it is (with ``content_type``)."""
    if json_body is not None:
        data, content_type = json.dumps(json_body).encode("utf-8"), "application/json"
    with _open(method, url, timeout_s, data=data, api_key=api_key, accept=accept, content_type=content_type,
               error_limit=error_limit) as (resp, started):
        try:
            body = resp.read(limit)
        except (OSError, ValueError) as err:
            raise HttpError(url, err, timed_out=isinstance(err, TimeoutError),
                            elapsed_s=time.monotonic() - started) from err
        return Response(url, resp.status, body, time.monotonic() - started)


def get(url: str, timeout_s: float, **kw) -> Response:
    return request("GET", url, timeout_s, **kw)


def request_within(method: str, url: str, timeout_s: float, *, slack_s: float = 0.5, **kw) -> Response:
    """:func:`request`, and the whole answer within ``timeout_s + slack_s`` by the wall clock: the request
    runs in a daemon thread, left behind (and raised as ``incomplete``) when the time is up."""
    box: list = []

    def run() -> None:
        try:
            box.append(request(method, url, timeout_s, **kw))
        except HttpError as err:
            box.append(err)

    started = time.monotonic()
    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout_s + slack_s)
    if not box:
        raise HttpError(url, f"no complete answer within {timeout_s:g}s", timed_out=True, incomplete=True,
                        elapsed_s=time.monotonic() - started)
    if isinstance(box[0], HttpError):
        raise box[0]
    return box[0]


class Stream:
    """An open 2xx answer read line by line (server-sent events); ``readline`` raises :class:`HttpError`
    (``timed_out`` when the server went silent for the timeout), ``b""`` at the end."""

    def __init__(self, url: str, resp):
        self.url, self.status, self._resp = url, resp.status, resp

    def readline(self) -> bytes:
        import http.client

        try:
            return self._resp.readline()
        except (OSError, ValueError, http.client.HTTPException) as err:
            raise HttpError(self.url, err, timed_out=isinstance(err, TimeoutError)) from err


@contextmanager
def stream(method: str, url: str, timeout_s: float, *, json_body: Any = None, api_key: str | None = None,
           accept: str = "text/event-stream", error_limit: int = 4096) -> Iterator[Stream]:
    """An open streamed answer; every socket read bounded by ``timeout_s``. Raises :class:`HttpError`
    when no 2xx answer came (the error body read up to ``error_limit``)."""
    data = content_type = None
    if json_body is not None:
        data, content_type = json.dumps(json_body).encode("utf-8"), "application/json"
    with _open(method, url, timeout_s, data=data, api_key=api_key, accept=accept, content_type=content_type,
               error_limit=error_limit) as (resp, _started):
        yield Stream(url, resp)


def engine_message(body: bytes, limit: int | None = None) -> str | None:
    """The message of an OpenAI-style error body (``{"error": {"message": ...}}``, ``{"error": "..."}``,
    ``{"message": ...}``), or None."""
    data = _json(body)
    if not isinstance(data, dict):
        return None
    message = data.get("error", data.get("message"))
    if isinstance(message, dict):
        message = message.get("message")
    if not message:
        return None
    return str(message) if limit is None else str(message)[:limit]
