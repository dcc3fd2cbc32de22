"""Running a batch: requests sent at a bounded concurrency, retried with backoff, following the endpoint.

Workers (threads, each with one kept-alive connection per base URL, :class:`envlayers.httpclient.Connection`)
take the requests not answered yet in input order. A request is retried with exponential backoff (with
jitter) on HTTP 429, on a 5xx, on a timeout and on a broken or refused connection, up to
``Settings.retries`` times; another answer (a 4xx: the request itself is wrong) fails it at once. A broken
or refused connection also asks :class:`Endpoint` where the endpoint is now: for a job that is its live
replicas (a dead one leaves ``endpoint.json``) or, once it handed over, its newest live successor. The
answers go to :class:`envlayers.batch.records.Output` as they come.
"""

from __future__ import annotations

import random
import threading
import time
import urllib.parse
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import EnvLayersError
from ..httpclient import Connection, Response
from ..urls import server_root
from .records import Output, Request

RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


@dataclass
class Settings:
    concurrency: int = 8
    retries: int = 6  # after the first attempt
    timeout_s: float = 600.0  # per attempt, each socket operation
    backoff_s: float = 1.0  # the first wait; doubled each retry
    backoff_max_s: float = 30.0


@dataclass
class Tally:
    """What the run did: answered, failed by kind, tokens, retries, its wall time."""

    total: int = 0  # requests in the input
    skipped: int = 0  # answered by an earlier run
    answered: int = 0
    failed: Counter = field(default_factory=Counter)  # kind -> requests
    retries: Counter = field(default_factory=Counter)  # kind -> retries
    prompt_tokens: int = 0
    completion_tokens: int = 0
    wall_s: float = 0.0
    endpoints: list[str] = field(default_factory=list)  # every base URL the batch sent to, in order
    interrupted: bool = False

    @property
    def done(self) -> int:
        return self.answered + sum(self.failed.values())


class Endpoint:
    """Where requests go now: ``resolve()`` -> (base URLs, key), asked again after a broken connection (at
    most every ``min_refresh_s``); a resolve that fails (nothing serves right now: a successor not live
    yet) keeps what was known and the request's backoff waits."""

    def __init__(self, resolve: Callable[[], tuple[list[str], str | None]], *, min_refresh_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic):
        self.resolve, self.min_refresh_s, self.clock = resolve, min_refresh_s, clock
        self.urls, self.key = resolve()
        if not self.urls:
            raise EnvLayersError("the endpoint has no base URL", hint="is it live? `env_layers status JOBID`")
        self.lock = threading.Lock()
        self._turn = 0
        self._refreshed_at = clock()
        self.seen: list[str] = list(self.urls)
        self.moves: list[str] = []  # "old -> new" each time the URLs changed

    def pick(self) -> tuple[str, str | None]:
        with self.lock:
            self._turn += 1
            return self.urls[self._turn % len(self.urls)], self.key

    def refresh(self) -> None:
        with self.lock:
            if self.clock() - self._refreshed_at < self.min_refresh_s:
                return
            self._refreshed_at = self.clock()
        try:
            urls, key = self.resolve()
        except EnvLayersError:
            return
        if not urls:
            return
        with self.lock:
            if urls != self.urls:
                self.moves.append(f"{', '.join(self.urls)} -> {', '.join(urls)}")
                self.seen += [u for u in urls if u not in self.seen]
            self.urls, self.key = urls, key


def _path(base_url: str, url: str) -> str:
    """The path of the request's endpoint (``/v1/...``) on the server of ``base_url``, under the path the
    server sits at (a proxy's prefix)."""
    return urllib.parse.urlsplit(server_root(base_url)).path.rstrip("/") + url


def _kind(answer: Response) -> str:
    if answer.status == 429:
        return "rate_limited"
    if answer.status is not None and answer.status >= 500:
        return "server_error"
    if answer.status is not None:
        return f"http_{answer.status}"
    return "timeout" if answer.timed_out else "connection"


def _message(answer: Response) -> str:
    return answer.said(300) if answer.status is not None else answer.reason


def run(requests: list[Request], output: Output, endpoint: Endpoint, settings: Settings, *,
        progress: Callable[[Tally], None] | None = None, stop: threading.Event | None = None,
        sleep: Callable[[float], Any] | None = None) -> Tally:
    """Send every request of ``requests`` not in ``output.answered``; returns when each is answered or failed
    (or ``stop`` is set: the requests in flight finish, no new one starts)."""
    stop = stop or threading.Event()
    wait = sleep or stop.wait  # a stop cuts a backoff short
    tally = Tally(total=len(requests))
    todo = [r for r in requests if r.custom_id not in output.answered]
    tally.skipped = len(requests) - len(todo)
    lock = threading.Lock()
    queue = iter(todo)
    t0 = time.monotonic()

    def note(fn) -> None:
        with lock:
            fn()
            tally.wall_s = time.monotonic() - t0
            snapshot = tally
        if progress is not None:
            progress(snapshot)

    def send(conns: dict[str, Connection], req: Request) -> None:
        attempt = 0
        while True:
            base, key = endpoint.pick()
            conn = conns.get(base)
            if conn is None:
                conn = conns[base] = Connection(base, settings.timeout_s)
            answer = conn.request("POST", _path(base, req.url), json_body=req.body, api_key=key)
            if not answer.ok:
                kind = _kind(answer)
                retry = answer.status is None or answer.status in RETRY_STATUSES
                if answer.status is None:
                    conn.close()
                    endpoint.refresh()  # the replica or the job may be gone: ask where the endpoint is now
                if not retry or attempt >= settings.retries or stop.is_set():
                    body = answer.json() if answer.status is not None else None
                    note(lambda: tally.failed.update([kind]))
                    output.fail(req, kind, _message(answer) + (f" (after {attempt} retries)" if attempt else ""),
                                answer.status, body)
                    return
                attempt += 1
                note(lambda: tally.retries.update([kind]))
                wait(min(settings.backoff_max_s, settings.backoff_s * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0))
                continue
            body = answer.json()
            if not isinstance(body, dict):
                note(lambda: tally.failed.update(["bad_answer"]))
                output.fail(req, "bad_answer", f"HTTP {answer.status} with a body that is not a JSON object",
                            answer.status, None)
                return
            usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
            output.answer(req, answer.status, body)

            def count() -> None:
                tally.answered += 1
                tally.prompt_tokens += int(usage.get("prompt_tokens") or 0)
                tally.completion_tokens += int(usage.get("completion_tokens") or 0)
            note(count)
            return

    def worker() -> None:
        conns: dict[str, Connection] = {}
        try:
            while not stop.is_set():
                with lock:
                    req = next(queue, None)
                if req is None:
                    return
                send(conns, req)
        finally:
            for c in conns.values():
                c.close()

    threads = [threading.Thread(target=worker, daemon=True, name=f"batch-{i}")
               for i in range(max(1, min(settings.concurrency, len(todo))))]
    for t in threads:
        t.start()
    try:
        for t in threads:
            while t.is_alive():
                t.join(0.5)
    except KeyboardInterrupt:
        stop.set()
        for t in threads:
            t.join()
    tally.interrupted = stop.is_set() and tally.done < len(todo)
    tally.wall_s = time.monotonic() - t0
    tally.endpoints = list(endpoint.seen)
    return tally
