"""Bounded HTTP to one endpoint, with the standard library only.

Every request has a wall-clock limit (:func:`envlayers.httpclient.request_within`): the caller waits
at most ``timeout_s`` for the whole answer, so a server that accepts the
connection and then dribbles or stalls cannot hang a gate. The API key goes in the
``Authorization`` header and nowhere else: it is never part of a result or a message.
"""

from __future__ import annotations

import json
import threading
import time

from ..httpclient import Response, request_within
from ..urls import server_root


def describe(answer: Response) -> str:
    """One line for evidence: the status and the error message an engine put in the body."""
    if answer.status is None:
        return f"no answer from {answer.url}: {answer.reason}"
    message = answer.message()
    return f"HTTP {answer.status} from {answer.url}" + (f": {message}" if message else "")


class Client:
    """Requests to ``base_url`` (ending in /v1); ``root`` is the server root, where /metrics is."""

    def __init__(self, base_url: str, api_key: str | None = None, timeout_s: float = 120.0):
        self.base_url = base_url.rstrip("/")
        self.root = server_root(self.base_url)
        self._key = api_key
        self.timeout_s = timeout_s

    def __repr__(self) -> str:  # never the key
        return f"Client({self.base_url!r}, key={'yes' if self._key else 'no'}, timeout_s={self.timeout_s})"

    def get(self, path: str, *, at_root: bool = False) -> Response:
        return self.request("GET", (self.root if at_root else self.base_url) + path)

    def post(self, path: str, payload: dict) -> Response:
        return self.request("POST", self.base_url + path, json.dumps(payload).encode("utf-8"))

    def post_all(self, path: str, payloads: list[dict], parallel: int = 6) -> list[Response]:
        """The payloads at most ``parallel`` at a time; answers in the order given."""
        gate = threading.Semaphore(max(1, parallel))
        results: list[Response | None] = [None] * len(payloads)

        def one(i: int, payload: dict) -> None:
            with gate:
                results[i] = self.post(path, payload)

        threads = [threading.Thread(target=one, args=(i, p), daemon=True) for i, p in enumerate(payloads)]
        for t in threads:
            t.start()
        rounds = -(-len(payloads) // max(1, parallel))
        deadline = time.monotonic() + rounds * (self.timeout_s + 2.0)
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        url = self.base_url + path
        return [r if r is not None else Response(url, None, reason=f"no answer within {self.timeout_s:g}s")
                for r in results]

    def request(self, method: str, url: str, data: bytes | None = None) -> Response:
        return request_within(method, url, self.timeout_s, data=data, api_key=self._key,
                              content_type="application/json" if data is not None else None)
