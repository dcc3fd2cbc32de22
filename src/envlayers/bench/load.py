"""The load generator: streamed chat completions at a fixed concurrency, bounded in count and time.

Standard library only (threads and :mod:`envlayers.httpclient`, one kept-alive connection per worker, as
vLLM's own client keeps its session's connections): the maintained generators (guidellm, aiperf,
``vllm bench serve``) each pull in torch or transformers and fetch a tokenizer from a model hub,
which a cluster's compute network usually cannot reach (docs/operating.md, "Load report").

Each request asks for ``output_tokens`` tokens with ``ignore_eos`` (vLLM and SGLang both accept it),
streams the reply (``stream_options.include_usage`` for the engine's own token counts, prompt and
completion) and records when each content chunk arrived. The prompt length is asked for in words: how
many tokens they make is the engine's tokenizer's business, so the count reported is the engine's
``usage.prompt_tokens``. Each level also records the CPU time this process spent on it
(``time.process_time``: user + system, all threads), the load generator's own cost, which on a host
shared with the engine is CPU the engine did not get. Requests go only to the one base URL given.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from dataclasses import dataclass, field

from ..httpclient import Connection, HttpError, Response

MAX_CONCURRENCY = 512


@dataclass
class Settings:
    base_url: str  # ends in /v1
    model: str
    api_key: str | None = None
    requests: int = 32  # per level
    duration_s: float = 60.0  # per level: no request starts after this
    timeout_s: float = 60.0  # per request, from sending to the last byte
    input_tokens: int = 128  # prompt length in words; the tokens they make: Sample.prompt_tokens
    output_tokens: int = 64
    ignore_eos: bool = True


@dataclass
class Sample:
    """One request: seconds from sending it, None where it never got that far."""

    ok: bool
    start_s: float  # since the level started
    e2e_s: float | None = None
    ttft_s: float | None = None
    chunk_times: list[float] = field(default_factory=list)  # arrival of each content chunk, from sending
    output_tokens: int = 0  # the engine's usage count, else the content chunks
    prompt_tokens: int | None = None  # the engine's usage.prompt_tokens; None when it sent no usage
    error: str | None = None


@dataclass
class LevelRun:
    concurrency: int
    wall_s: float
    samples: list[Sample]
    cut_short: bool  # the duration ran out before every request was sent
    cpu_s: float = 0.0  # CPU seconds (user + system) this process spent during the level


def prompt_text(words: int) -> str:
    """``words`` words of filler ("" for none)."""
    base = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima".split()
    return " ".join(base[i % len(base)] for i in range(max(0, words)))


def prompt_for(number: int, words: int) -> str:
    """Request ``number``'s prompt: ``words`` words (at least one), the first its number, so prompts
    are distinct and no prefix cache serves one whole."""
    return " ".join(filter(None, (str(number), prompt_text(words - 1))))


def _content(event: dict) -> str:
    """The text a chunk carries: content, reasoning (vLLM ``reasoning``, SGLang ``reasoning_content``)."""
    for choice in event.get("choices") or []:
        delta = choice.get("delta") or {}
        text = "".join(str(delta.get(k) or "") for k in ("content", "reasoning", "reasoning_content"))
        if delta.get("tool_calls"):
            text += "tool"
        if text:
            return text
    return ""


def one_request(s: Settings, number: int, level_t0: float, conn: Connection | None = None) -> Sample:
    """Send one streamed request (on ``conn``, a worker's kept-alive connection; a connection of its own
    when None) and time it; never raises, never runs past ``s.timeout_s`` by more than one socket read."""
    if conn is None:
        conn = Connection(s.base_url, s.timeout_s)
        try:
            return one_request(s, number, level_t0, conn)
        finally:
            conn.close()
    t0 = time.monotonic()
    sample = Sample(ok=False, start_s=t0 - level_t0)
    body = {"model": s.model, "stream": True, "stream_options": {"include_usage": True},
            "max_tokens": s.output_tokens, "temperature": 0.0,
            "messages": [{"role": "user", "content": prompt_for(number, s.input_tokens)}]}
    if s.ignore_eos:
        body["ignore_eos"] = True
    path = urllib.parse.urlsplit(s.base_url.rstrip("/") + "/chat/completions").path
    usage_tokens = prompt_tokens = None
    end = None
    streaming = False  # the server said 200 and the stream began
    try:
        with conn.stream("POST", path, json_body=body, api_key=s.api_key) as resp:
            if resp.status != 200:
                sample.error = f"HTTP {resp.status}"
                return sample
            streaming = True
            while True:
                if time.monotonic() - t0 > s.timeout_s:
                    sample.error = f"no complete reply within {s.timeout_s:g}s"
                    return sample
                line = resp.readline()
                if not line:
                    break
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                try:
                    event = json.loads(data)
                except ValueError:
                    sample.error = "a streamed chunk is not JSON"
                    return sample
                if isinstance(event, dict) and isinstance(event.get("usage"), dict):
                    usage_tokens = event["usage"].get("completion_tokens", usage_tokens)
                    prompt_tokens = event["usage"].get("prompt_tokens", prompt_tokens)
                if isinstance(event, dict) and event.get("error"):
                    sample.error = f"error in the stream: {str(event['error'])[:200]}"
                    return sample
                if isinstance(event, dict) and _content(event):
                    sample.chunk_times.append(time.monotonic() - t0)
            end = time.monotonic()  # the stream ended ([DONE] or the server closed it)
    except HttpError as err:
        answer = err.response
        cause = err.__cause__ if err.__cause__ is not None else answer.reason
        if answer.status is not None:
            sample.error = _http_error(answer)
        elif streaming and answer.timed_out:
            sample.error = stalled(sample.chunk_times, time.monotonic() - t0)
        elif streaming:
            sample.error = (f"the stream broke after {_chunks(len(sample.chunk_times))}: {type(cause).__name__}"
                            + (f": {cause}" if str(cause) else ""))
        else:
            sample.error = (f"no answer: {type(cause).__name__}: {cause}" if str(cause)
                            else f"no answer: {type(cause).__name__}")
        return sample
    sample.e2e_s = end - t0
    if not sample.chunk_times:
        sample.error = "the reply streamed no tokens"
        return sample
    sample.ttft_s = sample.chunk_times[0]
    sample.output_tokens = usage_tokens if isinstance(usage_tokens, int) and usage_tokens > 0 \
        else len(sample.chunk_times)
    if isinstance(prompt_tokens, int) and not isinstance(prompt_tokens, bool) and prompt_tokens > 0:
        sample.prompt_tokens = prompt_tokens
    sample.ok = True
    return sample


def _chunks(n: int) -> str:
    return f"{n} chunk{'' if n == 1 else 's'}"


def stalled(chunk_times: list[float], gave_up_s: float) -> str:
    """Why a request that began streaming failed when the server went silent: how many content chunks
    arrived (one token each, about) and when the last did, then how long nothing came."""
    if not chunk_times:
        return f"no token within {gave_up_s:.1f}s: the server answered HTTP 200, then the read timed out"
    last = chunk_times[-1]
    return (f"stalled mid-stream: {_chunks(len(chunk_times))} in {last:.1f}s, then nothing for "
            f"{gave_up_s - last:.1f}s")


def _http_error(answer: Response) -> str:
    detail = answer.said(200)
    if answer.status == 401:
        detail += " (the endpoint wants a key: --api-key-file FILE)"
    return detail


def run_level(s: Settings, concurrency: int) -> LevelRun:
    """``concurrency`` workers send ``s.requests`` requests in all, each starting its next as soon as
    its last ended; none starts after ``s.duration_s``. Returns when every started request ended."""
    lock = threading.Lock()
    counter = iter(range(s.requests))
    samples: list[Sample] = []
    cut = threading.Event()
    cpu0 = time.process_time()
    t0 = time.monotonic()

    def worker() -> None:
        conn = Connection(s.base_url, s.timeout_s)
        try:
            while True:
                with lock:
                    number = next(counter, None)
                if number is None:
                    return
                if time.monotonic() - t0 >= s.duration_s:
                    cut.set()
                    return
                sample = one_request(s, number, t0, conn)
                with lock:
                    samples.append(sample)
        finally:
            conn.close()

    threads = [threading.Thread(target=worker, daemon=True, name=f"bench-{i}")
               for i in range(min(concurrency, s.requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(s.duration_s + s.timeout_s + 30)  # a request past its timeout is cut by one_request
    wall = time.monotonic() - t0
    return LevelRun(concurrency, wall, sorted(samples, key=lambda x: x.start_s), cut.is_set(),
                    time.process_time() - cpu0)


def run(s: Settings, levels: list[int], progress=None) -> list[LevelRun]:
    """Every level in turn; ``progress(level_run)`` after each."""
    out = []
    for c in levels:
        result = run_level(s, c)
        out.append(result)
        if progress:
            progress(result)
    return out
