"""The root-cause line of an engine's log: the error that started a failure, not the last line.

Pure: lines in, one line out. When vLLM refuses a setting, its log ends with the API server's own
wrapper (``RuntimeError: Engine core initialization failed. See root cause above. ...``) while the
cause (``ValueError: ...``, ``AssertionError``, an argparse ``error: argument ...``) stands tens of
lines higher, in the engine core's traceback. :func:`root_cause` returns that line, with the
process and logging prefixes the engines put in front of it removed, or ``None`` when the log holds
no error line (a rank killed by a signal prints none).

The first error line counts, not the last: Python prints a chained traceback's original exception
first, and vLLM's engine core prints its own before the API server reports that it died. A log that
reached readiness is read from its last readiness line on, so an error handled while serving, long
before the failure, is not taken for its cause.
"""

from __future__ import annotations

import re
from typing import Iterable

from .phases import strip_ansi

# (EngineCore pid=123) / (APIServer pid=1) / (Worker_TP0 pid=9) / [rank1]: / [2026-12-03 10:00:00 TP0]
_PROCESS_RE = re.compile(r"^(?:\((?:[\w.-]+) pid=\d+\)\s*|\[rank\d+\]:\s*|\[\d{4}-\d\d-\d\d [\d:]+(?: [\w ]+)?\]\s*)+")
# vLLM's logging prefix: `ERROR 12-03 16:30:07 [core.py:133] `
_LOGGING_RE = re.compile(r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+\d\d-\d\d [\d:.]+\s+\[[^\]]*\]\s*")
# a Python exception's last line: `ValueError: ...`, `torch.OutOfMemoryError: ...`, `AssertionError`
_EXCEPTION_RE = re.compile(r"^(?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception)(?::\s.*)?$")
# argparse's refusal: `vllm serve: error: argument --tool-call-parser: invalid choice: ...`
_ARGPARSE_RE = re.compile(r"^[\w .-]*: error: .+")
# the wrappers that only point at the cause
_WRAPPER_RE = re.compile(r"root cause above|see stack trace|EngineDeadError|Engine core initialization failed|"
                         r"Engine process failed to start|EngineCore encountered an issue", re.I)
# `pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig`, the reason below it
_DETAIL_NEXT_RE = re.compile(r"ValidationError: \d+ validation errors? for ")
_READY_RE = re.compile(r"Application startup complete|The server is fired up")
MAX_CHARS = 400


def clean(line: str) -> str:
    """``line`` without terminal codes and the engines' process and logging prefixes."""
    text = strip_ansi(line).strip()
    text = _PROCESS_RE.sub("", text)
    return _LOGGING_RE.sub("", text).strip()


def root_cause(lines: Iterable[str]) -> str | None:
    """The first error line of the log's last run (see the module docstring), cleaned and cut to
    MAX_CHARS, or None."""
    cleaned = [clean(line) for line in lines]
    start = 0
    for i, text in enumerate(cleaned):
        if _READY_RE.search(text):
            start = i + 1
    for i in range(start, len(cleaned)):
        text = cleaned[i]
        if (_EXCEPTION_RE.match(text) or _ARGPARSE_RE.match(text)) and not _WRAPPER_RE.search(text):
            if _DETAIL_NEXT_RE.search(text) and i + 1 < len(cleaned) and cleaned[i + 1]:
                text = f"{text}: {cleaned[i + 1]}"  # pydantic puts the reason on the next line
            elif ":" not in text and i > start and cleaned[i - 1] and not cleaned[i - 1].startswith(
                    ("File ", "Traceback")):
                text = f"{text} at: {cleaned[i - 1]}"  # a bare `AssertionError`: the line that raised it
            return text if len(text) <= MAX_CHARS else text[:MAX_CHARS - 3] + "..."
    return None
