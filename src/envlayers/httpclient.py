"""The one HTTP client of the login node and the launcher: every request with a bounded timeout, every
outcome one :class:`Response`.

Standard library only (``urllib.request``, and ``http.client`` for :class:`Connection`, the kept-alive
connection a load generator or a batch sends many requests over). Every call takes ``timeout_s``, which bounds
each socket operation; :func:`request_within` also bounds the whole answer by the wall clock (a server that
accepts the connection and then trickles bytes is cut off). :func:`request` and :meth:`Connection.request`
return a :class:`Response` whatever happened: a 2xx answer, a refusal with its error body (whose message
:meth:`Response.message` reads, the one reading of an OpenAI-style error body), or nothing, with the reason.
A streamed answer (:func:`stream`, :meth:`Connection.stream`) raises :class:`HttpError`, which carries that
Response, when it is no 2xx answer or breaks while read. The API key goes in the ``Authorization`` header
and nowhere else: never in a message.

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
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

MAX_BODY = 8 << 20  # the most of an answer's body read into memory


@dataclass
class Response:
    """One request's outcome. ``status`` is the HTTP status when the server answered (its ``headers`` and
    ``body``, an error body too, up to the limit read), None when nothing (complete) came back: ``reason``
    says why in a few words, ``timed_out`` when a socket operation ran out of time, ``incomplete`` when
    :func:`request_within`'s wall clock ran out. ``elapsed_s``: from sending to the end of what came."""

    url: str
    status: int | None
    body: bytes = b""
    elapsed_s: float = 0.0
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    reason: str = ""
    timed_out: bool = False
    incomplete: bool = False

    @property
    def ok(self) -> bool:
        """A 2xx answer."""
        return self.status is not None and 200 <= self.status < 300

    def text(self, limit: int | None = None) -> str:
        """The body as text; cut at ``limit`` characters (and ``...`` added) when given."""
        text = self.body.decode("utf-8", "replace")
        return text if limit is None or len(text) <= limit else text[:limit] + "..."

    def json(self) -> Any:
        """The body as JSON; None when it is not JSON."""
        try:
            return json.loads(self.body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return None

    def message(self, limit: int | None = None) -> str | None:
        """The message of an OpenAI-style error body (``{"error": {"message": ...}}``, ``{"error": "..."}``,
        ``{"message": ...}``, or a web framework's ``{"detail": ...}``), or None."""
        data = self.json()
        if not isinstance(data, dict):
            return None
        error = data.get("error")
        message = error.get("message") if isinstance(error, dict) else error if isinstance(error, str) else None
        message = message or data.get("message") or data.get("detail")
        if not message:
            return None
        return str(message) if limit is None else str(message)[:limit]

    def said(self, limit: int | None = None) -> str:
        """What came back, in one phrase: ``HTTP 404: <the error body's message>`` (``limit`` characters of
        it at most), ``HTTP 200``, or ``no answer: <reason>``."""
        if self.status is None:
            return f"no answer: {self.reason}"
        message = None if self.ok else self.message(limit)
        return f"HTTP {self.status}" + (f": {message}" if message else "")


class HttpError(Exception):
    """A streamed answer that is no 2xx answer, or that broke while read: ``response`` says what came."""

    def __init__(self, response: Response):
        what = f"HTTP {response.status}" if response.status is not None else response.reason
        super().__init__(f"{response.url}: {what}")
        self.response = response


def _failed(url: str, started: float, reason: Any = "", *, status: int | None = None, **kw) -> HttpError:
    return HttpError(Response(url, status, elapsed_s=time.monotonic() - started, reason=str(reason), **kw))


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
        raise _failed(url, started, status=err.code, body=body, headers=err.headers or {}) from None
    except (urllib.error.URLError, OSError, ValueError) as err:
        reason = getattr(err, "reason", err)
        timed_out = (isinstance(err, TimeoutError) or isinstance(reason, TimeoutError)
                     or "timed out" in str(reason))
        raise _failed(url, started, reason, timed_out=timed_out) \
            from (reason if isinstance(reason, BaseException) else err)
    with resp:
        yield resp, started


def _body(json_body: Any, data: bytes | None, content_type: str | None) -> tuple[bytes | None, str | None]:
    if json_body is not None:
        return json.dumps(json_body).encode("utf-8"), "application/json"
    return data, content_type


def request(method: str, url: str, timeout_s: float, *, json_body: Any = None, data: bytes | None = None,
            api_key: str | None = None, accept: str | None = "application/json", content_type: str | None = None,
            limit: int = MAX_BODY, error_limit: int = MAX_BODY) -> Response:
    """One request, each socket operation bounded by ``timeout_s``: the :class:`Response`, whatever came (the
    body read up to ``limit`` bytes, an error body up to ``error_limit``). ``json_body`` is sent as JSON
    (Content-Type set), ``data`` as it is (with ``content_type``)."""
    import http.client

    data, content_type = _body(json_body, data, content_type)
    try:
        with _open(method, url, timeout_s, data=data, api_key=api_key, accept=accept, content_type=content_type,
                   error_limit=error_limit) as (resp, started):
            try:
                body = resp.read(limit)
            except (OSError, ValueError, http.client.HTTPException) as err:
                raise _failed(url, started, err, timed_out=isinstance(err, TimeoutError)) from err
            return Response(url, resp.status, body, time.monotonic() - started, resp.headers)
    except HttpError as err:
        return err.response


def get(url: str, timeout_s: float, **kw) -> Response:
    return request("GET", url, timeout_s, **kw)


def request_within(method: str, url: str, timeout_s: float, *, slack_s: float = 0.5, **kw) -> Response:
    """:func:`request`, and the whole answer within ``timeout_s + slack_s`` by the wall clock: the request
    runs in a daemon thread, left behind (``incomplete``) when the time is up."""
    box: list[Response] = []
    started = time.monotonic()
    worker = threading.Thread(target=lambda: box.append(request(method, url, timeout_s, **kw)), daemon=True)
    worker.start()
    worker.join(timeout_s + slack_s)
    if not box:
        return Response(url, None, elapsed_s=time.monotonic() - started,
                        reason=f"no complete reply within {timeout_s:g}s", timed_out=True, incomplete=True)
    return box[0]


class Stream:
    """An open 2xx answer read line by line (server-sent events); ``readline`` raises :class:`HttpError`
    (``timed_out`` when the server went silent for the timeout), ``b""`` at the end."""

    def __init__(self, url: str, resp):
        self.url, self.status, self.headers, self._resp = url, resp.status, resp.headers, resp

    def _broken(self, err: BaseException | str) -> HttpError:
        return HttpError(Response(self.url, None, reason=str(err), timed_out=isinstance(err, TimeoutError)))

    def readline(self) -> bytes:
        import http.client

        try:
            line = self._resp.readline()
        except (OSError, ValueError, http.client.HTTPException) as err:
            raise self._broken(err) from err
        if not line and getattr(self._resp, "chunked", False) and getattr(self._resp, "chunk_left", None) is not None:
            # http.client reads a chunked answer cut short as an end (chunk_left goes None only at the last
            # chunk): a server that died mid-stream is not a complete answer
            raise self._broken("the connection closed before the answer's last chunk")
        return line

    def read(self, limit: int) -> bytes:
        """The rest of the answer, up to ``limit`` bytes; :class:`HttpError` when the connection fails."""
        import http.client

        try:
            return self._resp.read(limit)
        except (OSError, http.client.HTTPException) as err:
            raise self._broken(err) from err


@contextmanager
def stream(method: str, url: str, timeout_s: float, *, json_body: Any = None, api_key: str | None = None,
           accept: str = "text/event-stream", error_limit: int = 4096) -> Iterator[Stream]:
    """An open streamed answer; every socket read bounded by ``timeout_s``. Raises :class:`HttpError`
    when no 2xx answer came (the error body read up to ``error_limit``)."""
    data, content_type = _body(json_body, None, None)
    with _open(method, url, timeout_s, data=data, api_key=api_key, accept=accept, content_type=content_type,
               error_limit=error_limit) as (resp, _started):
        yield Stream(url, resp)


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
        """``path`` on this connection, the whole answer read (up to ``limit`` bytes): the :class:`Response`
        as :func:`request` returns it (an error body read up to ``error_limit``)."""
        started = time.monotonic()
        try:
            with self.stream(method, path, json_body=json_body, api_key=api_key, accept="application/json",
                             error_limit=error_limit) as answer:
                return Response(answer.url, answer.status, answer.read(limit), time.monotonic() - started,
                                answer.headers)
        except HttpError as err:
            return err.response

    @contextmanager
    def stream(self, method: str, path: str, *, json_body: Any = None, api_key: str | None = None,
               accept: str = "text/event-stream", error_limit: int = 4096) -> Iterator[Stream]:
        """``path`` (e.g. ``/v1/chat/completions``) on this connection, streamed. Raises :class:`HttpError`
        as :func:`stream` does; the connection is kept for the next request when the answer was read to
        its end, closed otherwise."""
        import http.client

        url = self.origin + path
        headers = {"Accept": accept, "Host": self.origin.split("://", 1)[1]}
        data, content_type = _body(json_body, None, None)
        if content_type is not None:
            headers["Content-Type"] = content_type
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        started = time.monotonic()
        try:
            resp = self._send(method, path, data, headers)
        except (OSError, http.client.HTTPException) as err:
            self.close()
            raise _failed(url, started, err, timed_out=isinstance(err, TimeoutError)) from err
        if not 200 <= resp.status < 300:
            try:
                body = resp.read(error_limit)
            except (OSError, http.client.HTTPException):
                body = b""
            self.close()  # the rest of an error body is not worth reading
            raise _failed(url, started, status=resp.status, body=body, headers=resp.headers)
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
