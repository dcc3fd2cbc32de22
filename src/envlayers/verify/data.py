"""The accuracy gate's data: the fixed prompts, the per-model baselines, and how an answer is scored.

``data/accuracy-prompts.yaml`` and ``data/accuracy-baselines.yaml`` (format: their header comments and
docs/verify.md), or the files ``--baselines`` names, are read with the project's YAML reader (``yamlpos``)
and validated here; a bad file is one error naming ``file:key.path`` and what is expected. Scoring is pure:
text in, verdict out.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ..errors import EnvLayersError

DATA = Path(__file__).resolve().parent.parent / "data"
PROMPTS_FILE = DATA / "accuracy-prompts.yaml"
BASELINES_FILE = DATA / "accuracy-baselines.yaml"

MATCHES = ("number", "exact", "word")
KINDS = ("arithmetic", "string", "factual")
_ID_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
_THINK_RE = re.compile(r"<think>.*?(</think>|$)", re.S)
_NUMBER_RE = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?")
_TRIM = " \t\r\n\"'`*."


class VerifyDataError(EnvLayersError):
    """A prompts or baselines file that is not what the accuracy gate expects."""


@dataclass(frozen=True)
class Prompt:
    id: str
    kind: str
    prompt: str
    answer: str
    match: str


@dataclass(frozen=True)
class Baseline:
    name: str  # the catalog model, or "default"
    model: str | None  # INFERENCE_MODEL, for matching a URL's /v1/models root
    min_correct: int
    how: str
    measured: dict | None = None

    def describe(self) -> str:
        what = "default baseline" if self.name == "default" else f"baseline of {self.name}"
        return f"{what}: {self.how}"


@dataclass(frozen=True)
class Baselines:
    default: Baseline
    models: dict[str, Baseline]
    source: str

    def lookup(self, catalog_model: str | None, served_model: str | None) -> Baseline:
        """The catalog model's entry, else the entry whose ``model`` is the served model, else the default."""
        if catalog_model and catalog_model in self.models:
            return self.models[catalog_model]
        if served_model:
            for entry in self.models.values():
                if entry.model == served_model:
                    return entry
        return self.default


# --------------------------------------------------------------------------------------- loading


def _read_yaml(path: Path) -> Any:
    """The file's data, read by the project's one YAML reader (yamlpos): a regular file of at most 4 MiB,
    no anchors or aliases, nesting bounded before it is parsed; every error names the file and line."""
    from .. import yamlpos

    return yamlpos.read(path, str(path), VerifyDataError,
                        missing_hint="pass a readable file, or leave the option out for the packaged one").data()


def _fail(path: Path, keypath: str, message: str, hint: str | None = None) -> VerifyDataError:
    return VerifyDataError(f"{keypath}: {message}", where=str(path), hint=hint)


def _top(data: Any, path: Path, allowed: set[str], required: str) -> Mapping:
    if not isinstance(data, Mapping):
        raise _fail(path, "(top)", f"expected a mapping with `version: 1` and `{required}:`")
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise _fail(path, unknown[0], "unknown key", hint=f"known keys: {', '.join(sorted(allowed))}")
    if data.get("version") != 1:
        raise _fail(path, "version", f"must be 1, got {data.get('version')!r}")
    return data


def _text(path: Path, keypath: str, raw: Mapping, key: str, required: bool = True) -> str | None:
    value = raw.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value.strip():
        raise _fail(path, f"{keypath}.{key}", "missing" if value is None else "must be a non-empty string")
    return value


def load_prompts(path: str | os.PathLike | None = None) -> list[Prompt]:
    src = Path(path) if path is not None else PROMPTS_FILE
    data = _top(_read_yaml(src), src, {"version", "prompts"}, "prompts")
    items = data.get("prompts")
    if not isinstance(items, list) or not items:
        raise _fail(src, "prompts", "must be a non-empty list of prompts")
    prompts: list[Prompt] = []
    seen: set[str] = set()
    fields = {"id", "kind", "prompt", "answer", "match"}
    for i, raw in enumerate(items):
        keypath = f"prompts[{i}]"
        if not isinstance(raw, Mapping):
            raise _fail(src, keypath, f"expected a mapping, got {type(raw).__name__}")
        unknown = sorted(set(raw) - fields)
        if unknown:
            raise _fail(src, f"{keypath}.{unknown[0]}", "unknown key", hint=f"known keys: {', '.join(sorted(fields))}")
        pid = _text(src, keypath, raw, "id")
        if not _ID_RE.match(pid):
            raise _fail(src, f"{keypath}.id", f"{pid!r} must be kebab-case (lowercase words joined by '-')")
        if pid in seen:
            raise _fail(src, f"{keypath}.id", f"duplicate id {pid!r}")
        seen.add(pid)
        keypath = f"prompts.{pid}"
        kind, match = raw.get("kind"), raw.get("match")
        if kind not in KINDS:
            raise _fail(src, f"{keypath}.kind", f"must be one of {', '.join(KINDS)}, got {kind!r}")
        if match not in MATCHES:
            raise _fail(src, f"{keypath}.match", f"must be one of {', '.join(MATCHES)}, got {match!r}")
        answer = raw.get("answer")
        if isinstance(answer, (int, float)) and not isinstance(answer, bool):
            raise _fail(src, f"{keypath}.answer", "must be a quoted string", hint=f"write answer: \"{answer}\"")
        answer = _text(src, keypath, raw, "answer")
        if match == "number" and not _NUMBER_RE.fullmatch(answer):
            raise _fail(src, f"{keypath}.answer", f"{answer!r} is not a number, and match is number")
        prompts.append(Prompt(pid, kind, _text(src, keypath, raw, "prompt"), answer, match))
    return prompts


def load_baselines(path: str | os.PathLike | None = None, n_prompts: int | None = None) -> Baselines:
    src = Path(path) if path is not None else BASELINES_FILE
    data = _top(_read_yaml(src), src, {"version", "default", "models"}, "models")
    if "default" not in data:
        raise _fail(src, "default", "missing",
                    hint="the floor for a model without an entry: {min_correct: N, how: ...}")
    default = _baseline(src, "default", data["default"], "default", n_prompts, with_model=False)
    models_raw = data.get("models") or {}
    if not isinstance(models_raw, Mapping):
        raise _fail(src, "models", "must be a mapping of catalog model name -> baseline")
    models = {str(name): _baseline(src, f"models.{name}", raw, str(name), n_prompts, with_model=True)
              for name, raw in models_raw.items()}
    return Baselines(default, models, str(src))


def _baseline(src: Path, keypath: str, raw: Any, name: str, n_prompts: int | None, with_model: bool) -> Baseline:
    if not isinstance(raw, Mapping):
        raise _fail(src, keypath, f"expected a mapping, got {type(raw).__name__}")
    fields = {"min_correct", "how", "measured"} | ({"model"} if with_model else set())
    unknown = sorted(set(raw) - fields)
    if unknown:
        raise _fail(src, f"{keypath}.{unknown[0]}", "unknown key", hint=f"known keys: {', '.join(sorted(fields))}")
    floor = raw.get("min_correct")
    if not isinstance(floor, int) or isinstance(floor, bool) or floor < 0:
        raise _fail(src, f"{keypath}.min_correct", f"must be a whole number of prompts (0 or more), got {floor!r}")
    if n_prompts is not None and floor > n_prompts:
        raise _fail(src, f"{keypath}.min_correct", f"{floor} is more than the {n_prompts} prompts there are")
    how = _text(src, keypath, raw, "how")
    model = _text(src, keypath, raw, "model") if with_model else None
    measured = raw.get("measured")
    if measured is not None:
        if not isinstance(measured, Mapping) or not {"score", "of", "date"} <= set(measured):
            raise _fail(src, f"{keypath}.measured", "must be a mapping with score, of and date (and job)")
        measured = {str(k): v for k, v in measured.items()}
    return Baseline(name, model, floor, how, measured)


# --------------------------------------------------------------------------------------- scoring


def strip_think(text: str) -> str:
    """The answer without any ``<think>...</think>`` block (also an unclosed one, or a bare ``</think>``)."""
    text = _THINK_RE.sub("", text)
    if "</think>" in text:  # a template that opens <think> in the prompt: only the close shows
        text = text.rsplit("</think>", 1)[1]
    return text.strip()


def final_answer(content: str | None) -> str:
    return strip_think(content or "")


def is_correct(prompt: Prompt, content: str | None) -> tuple[bool, str]:
    """Whether ``content`` answers ``prompt``, and the part of it that was compared."""
    answer = final_answer(content)
    if prompt.match == "number":
        numbers = _NUMBER_RE.findall(answer)
        if not numbers:
            return False, answer
        got = numbers[-1].replace(",", "")
        try:
            return float(got) == float(prompt.answer), got
        except ValueError:
            return False, got
    lines = [line for line in answer.splitlines() if line.strip()]
    got = (lines[-1] if lines else "").strip(_TRIM)
    if prompt.match == "word":
        return got.lower() == prompt.answer.lower(), got
    return got == prompt.answer, got
