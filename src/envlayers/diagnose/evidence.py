"""What diagnose reads and reports: a log as lines (:class:`LogText`, :func:`read_log`), the order of a
job's files (:func:`input_order`), and a rule's result (:class:`Finding` with its :class:`Evidence`)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..errors import EnvLayersError

EVIDENCE_TEXT_MAX = 400


@dataclass(frozen=True)
class LogText:
    """One input: a name for evidence (the path as given) and its lines, without line ends."""

    name: str
    lines: Sequence[str]


@dataclass(frozen=True)
class Evidence:
    file: str
    line: int  # 1-based
    text: str
    role: str = "signature"  # signature | requires | peak | latest

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    def to_dict(self) -> dict:
        return {"file": self.file, "line": self.line, "where": self.where, "text": self.text,
                "role": self.role}


@dataclass(frozen=True)
class Finding:
    rule_id: str
    title: str
    severity: str
    status: str
    cause: str
    fix: str
    see: str  # where the user reads more: docs/<page>.md[#section] or an https:// page
    evidence: tuple[Evidence, ...]
    detail: str | None = None
    certainty: str = "confirmed"  # "possible": the signature matched, the context to confirm it is missing
    confirm_if: str | None = None  # for a possible finding: what would confirm it

    @property
    def possible(self) -> bool:
        return self.certainty == "possible"

    def to_dict(self) -> dict:
        return {
            "id": self.rule_id, "title": self.title, "severity": self.severity, "status": self.status,
            "certainty": self.certainty, "confirm_if": self.confirm_if,
            "evidence": [e.to_dict() for e in self.evidence], "detail": self.detail,
            "cause": self.cause, "fix": self.fix, "see": self.see,
        }


def _clip(text: str) -> str:
    text = text.strip()
    return text if len(text) <= EVIDENCE_TEXT_MAX else text[: EVIDENCE_TEXT_MAX - 3] + "..."


def input_order(path: str | os.PathLike) -> tuple:
    """Sort key for the files of one job: server logs by rank, other logs, job output, serve.env.

    Evidence is reported in input order, so a server log's line comes before the copy the launcher
    repeats in the job output.
    """
    name = os.path.basename(os.fspath(path))
    natural = tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", name))
    if name.startswith("server-") and name.endswith(".log"):
        group = 0
    elif name.endswith(".log"):
        group = 1
    elif name.endswith(".out"):
        group = 2
    else:
        group = 3
    return (group, natural)


def read_log(path: str | os.PathLike, name: str | None = None) -> LogText:
    """Read one log (any bytes; undecodable ones replaced) as a :class:`LogText`."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise EnvLayersError(f"no such file: {p}") from None
    except IsADirectoryError:
        raise EnvLayersError(f"is a directory, not a log: {p}") from None
    except OSError as err:
        raise EnvLayersError(f"cannot read {p}: {err.strerror}") from None
    text = data.decode("utf-8", errors="replace")
    lines = text.split("\n") if text else []
    if lines and lines[-1] == "":
        lines.pop()  # the newline ending the last line does not start another
    return LogText(name if name is not None else str(path), lines)
