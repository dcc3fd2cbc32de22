"""The one HTTP client of the login node and the launcher: every request with a bounded timeout.

Standard library only (``urllib.request``, and ``http.client`` for :class:`Connection`, the kept-alive
connection a load generator or a batch sends many requests over). Every call takes ``timeout_s``, which bounds each socket
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
            line = self._resp.readline()
        except (OSError, ValueError, http.client.HTTPException) as err:
            raise HttpError(self.url, err, timed_out=isinstance(err, TimeoutError)) from err
        if not line and getattr(self._resp, "chunked", False) and getattr(self._resp, "chunk_left", None) is not None:
            # http.client reads a chunked answer cut short as an end (chunk_left goes None only at the last
            # chunk): a server that died mid-stream is not a complete answer
            raise HttpError(self.url, "the connection closed before the answer's last chunk")
        return line

    def read(self, limit: int) -> bytes:
        """The rest of the answer, up to ``limit`` bytes; :class:`HttpError` when the connection fails."""
        import http.client

        try:
            return self._resp.read(limit)
        except (OSError, http.client.HTTPException) as err:
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


class Connection:
    """One kept-alive HTTP/1.1 connection to the server of ``base_url``, reused request after request as a
    client library's session does (vLLM's own benchmark client keeps its connections open): no TCP
    handshake and no accept in the server's event loop per request. :meth:`stream` opens a streamed
    answer like :func:`stream`; a connection the server closed while idle is reopened and the request
    sent again once, but only when nothing of an answer came (the server never saw it, or dropped it
    unread). Not thread-safe: one per worker. ``close()`` when done."""

    def __init__(self, base_url: str, timeout_s: float):
        import urllib.parse

        parts = urllib.parse.urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url}")
        self.scheme, self.host, self.port = parts.scheme, parts.hostname, parts.port
        self.origin = f"{parts.scheme}://{parts.netloc}"
        self.timeout_s = timeout_s
        self._conn = None

    def _connection(self):
        import http.client

        if self._conn is None:
            cls = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
            self._conn = cls(self.host, self.port, timeout=self.timeout_s)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _send(self, method: str, path: str, data: bytes | None, headers: dict[str, str]):
        import http.client

        for attempt in (1, 2):
            fresh = self._conn is None or self._conn.sock is None
            conn = self._connection()
            try:
                conn.request(method, path, body=data, headers=headers)
                return conn.getresponse()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self.close()
                if fresh or attempt == 2:
                    raise  # a new connection that fails is the server's answer, not a stale socket

    def request(self, method: str, path: str, *, json_body: Any = None, api_key: str | None = None,
                limit: int = MAX_BODY, error_limit: int = MAX_BODY) -> Response:
        """``path`` on this connection, the whole answer read (up to ``limit`` bytes); :class:`HttpError`
        as :func:`request` raises it (with the error body, up to ``error_limit``)."""
        started = time.monotonic()
        with self.stream(method, path, json_body=json_body, api_key=api_key, accept="application/json",
                         error_limit=error_limit) as answer:
            return Response(answer.url, answer.status, answer.read(limit), time.monotonic() - started)

    @contextmanager
    def stream(self, method: str, path: str, *, json_body: Any = None, api_key: str | None = None,
               accept: str = "text/event-stream", error_limit: int = 4096) -> Iterator[Stream]:
        """``path`` (e.g. ``/v1/chat/completions``) on this connection, streamed. Raises :class:`HttpError`
        as :func:`stream` does; the connection is kept for the next request when the answer was read to
        its end, closed otherwise."""
        import http.client

        url = self.origin + path
        headers = {"Accept": accept, "Host": self.origin.split("://", 1)[1]}
        data = None
        if json_body is not None:
            data = json.dumps(json_body).encode("utf-8")
            headers["Content-Type"] = "application/json"
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        started = time.monotonic()
        try:
            resp = self._send(method, path, data, headers)
        except (OSError, http.client.HTTPException) as err:
            self.close()
            raise HttpError(url, err, timed_out=isinstance(err, TimeoutError),
                            elapsed_s=time.monotonic() - started) from err
        if not 200 <= resp.status < 300:
            try:
                body = resp.read(error_limit)
            except (OSError, http.client.HTTPException):
                body = b""
            self.close()  # the rest of an error body is not worth reading
            raise HttpError(url, f"HTTP {resp.status}", status=resp.status, body=body,
                            elapsed_s=time.monotonic() - started)
        try:
            yield Stream(url, resp)
        except BaseException:
            self.close()
            raise
        if not resp.isclosed() and not resp.will_close:
            self._drain(resp)  # the end of the stream after its last event: the last chunk of a chunked answer
        if not resp.isclosed() or resp.will_close:
            self.close()  # the answer was not read to its end, or the server ends the connection

    def _drain(self, resp) -> None:
        """Read what is left of an answer the caller stopped reading (``data: [DONE]`` seen), for a moment
        at most: a server that ends its stream there leaves only the closing chunk."""
        import http.client

        sock = self._conn.sock if self._conn is not None else None
        try:
            if sock is not None:
                sock.settimeout(min(1.0, self.timeout_s))
            resp.read(1 << 16)
        except (OSError, http.client.HTTPException):
            self.close()
        else:
            if sock is not None and self._conn is not None:
                sock.settimeout(self.timeout_s)
