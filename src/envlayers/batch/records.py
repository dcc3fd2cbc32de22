"""The batch's files: the OpenAI Batch input read and checked, the answers written once each, a rerun's resume.

Input (the OpenAI Batch format, as vLLM's ``run_batch`` reads it): one JSON object a line with ``custom_id``
(unique), ``method`` (``POST``), ``url`` (``/v1/chat/completions`` or ``/v1/completions``) and ``body``
(the request; ``model`` filled in with the endpoint's served name when absent; no ``stream``). Every line
is checked before the first request is sent: a bad one is an error naming ``FILE:LINE``.

Output: one line per answered request, in the format of OpenAI's batch output file (``id``, ``custom_id``,
``response`` with ``status_code``, ``request_id`` and ``body``, ``error``: null); requests that failed
for good go to the errors file, OpenAI's ``error_file``, in the same format with ``error`` set. Each
line is written with one ``write`` to a file opened for appending, so a line is whole or absent; a
rerun reads the custom_ids already answered and skips them, after cutting a last line a crash left
without its newline. The errors file holds the failures of the latest run only.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import EnvLayersError

URLS = ("/v1/chat/completions", "/v1/completions")
MAX_LINE = 64 << 20  # a request line longer than this is refused (a prompt of 64 MiB is a mistake)


@dataclass(frozen=True)
class Request:
    custom_id: str
    url: str
    body: dict[str, Any]
    line: int  # in the input file, for messages


def _bad(where: str, what: str, hint: str) -> EnvLayersError:
    return EnvLayersError(what, where=where, hint=hint)


def read_input(path: Path, served: str | None) -> list[Request]:
    """Every request of ``path``, checked; ``served`` fills in a missing ``body.model``."""
    try:
        text = path.read_bytes()
    except OSError as err:
        raise EnvLayersError(f"cannot read {path}: {err.strerror or err}", where=str(path),
                             hint="give the batch's input file (.jsonl)") from None
    out: list[Request] = []
    seen: dict[str, int] = {}
    for n, raw in enumerate(text.split(b"\n"), 1):
        where = f"{path}:{n}"
        if not raw.strip():
            continue
        if len(raw) > MAX_LINE:
            raise _bad(where, f"the line is {len(raw)} bytes, more than {MAX_LINE}", "split the request")
        try:
            item = json.loads(raw)
        except (UnicodeDecodeError, ValueError) as err:
            raise _bad(where, f"not JSON: {err}", "one JSON object per line (the OpenAI Batch input format)") from None
        if not isinstance(item, dict):
            raise _bad(where, "not a JSON object", "one JSON object per line (the OpenAI Batch input format)")
        cid = item.get("custom_id")
        if not isinstance(cid, str) or not cid:
            raise _bad(where, "custom_id is missing or not a string", 'give each line a unique "custom_id"')
        if cid in seen:
            raise _bad(where, f"custom_id {cid!r} is used twice (first on line {seen[cid]})",
                       "give each line its own custom_id: the output names answers by it")
        seen[cid] = n
        method = item.get("method", "POST")
        if method != "POST":
            raise _bad(where, f"method {method!r}: the batch sends POST requests only", 'use "method": "POST"')
        url = item.get("url")
        if url not in URLS:
            raise _bad(where, f"url {url!r} is not one the batch sends", f"use one of {', '.join(URLS)}")
        body = item.get("body")
        if not isinstance(body, dict):
            raise _bad(where, "body is missing or not a JSON object", "put the request's JSON in \"body\"")
        if body.get("stream"):
            raise _bad(where, "body asks for a stream", 'leave "stream" out: the batch writes whole answers')
        if "model" not in body:
            if not served:
                raise _bad(where, "body names no model and the endpoint's is not known",
                           "set body.model, or give --model")
            body = {**body, "model": served}
        out.append(Request(cid, url, body, n))
    return out


class Output:
    """The answers file (appended to, one whole line per answer) and the errors file (this run's)."""

    def __init__(self, path: Path, errors: Path):
        self.path, self.errors_path = path, errors
        self.lock = threading.Lock()
        self.answered = self._resume()
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._err_fd = os.open(errors, os.O_WRONLY | os.O_TRUNC | os.O_CREAT, 0o600)

    def _resume(self) -> set[str]:
        """The custom_ids the output holds answers for; a last line without its newline (a crash mid-write)
        is cut off first."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return set()
        except OSError as err:
            raise EnvLayersError(f"cannot read {self.path}: {err.strerror or err}", where="--output",
                                 hint="give a file you can read and write") from None
        whole = data[: data.rfind(b"\n") + 1]
        if len(whole) != len(data):
            os.truncate(self.path, len(whole))
        done = set()
        for n, raw in enumerate(whole.split(b"\n"), 1):
            if not raw.strip():
                continue
            try:
                item = json.loads(raw)
                done.add(str(item["custom_id"]))
            except (ValueError, KeyError, TypeError):
                raise EnvLayersError(f"{self.path}:{n} is not a line of a batch's output", where="--output",
                                     hint="give the output file of this batch, or a new file") from None
        return done

    @staticmethod
    def _line(req: Request, status: int | None, body: Any, error: dict | None) -> bytes:
        response = None if status is None else {
            "status_code": status, "request_id": (body or {}).get("id") if isinstance(body, dict) else None,
            "body": body}
        record = {"id": f"batch_req_{uuid.uuid4().hex}", "custom_id": req.custom_id, "response": response,
                  "error": error}
        return (json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")

    def answer(self, req: Request, status: int, body: Any) -> None:
        line = self._line(req, status, body, None)
        with self.lock:
            if req.custom_id in self.answered:
                return  # never twice
            os.write(self._fd, line)  # one write to an O_APPEND file: the line is whole or absent
            self.answered.add(req.custom_id)

    def fail(self, req: Request, kind: str, message: str, status: int | None = None, body: Any = None) -> None:
        line = self._line(req, status, body, {"code": kind, "message": message})
        with self.lock:
            os.write(self._err_fd, line)

    def close(self) -> None:
        for fd in (self._fd, self._err_fd):
            try:
                os.fsync(fd)
            except OSError:
                pass
            os.close(fd)


def errors_path_for(output: Path) -> Path:
    """``out.jsonl`` -> ``out.errors.jsonl``."""
    name = output.name[: -len(".jsonl")] if output.name.endswith(".jsonl") else output.name
    return output.with_name(name + ".errors.jsonl")
