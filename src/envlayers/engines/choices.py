"""vLLM's own choices for the flags that have them, checked on the login node before submission.

A parser name vLLM does not know (``--tool-call-parser qwen25``, SGLang's name for Qwen's format)
makes ``vllm serve`` refuse to start (vLLM checks the names after parsing its arguments), after the
allocation was granted and the image started. The choices come from a table generated from the real engine's argument parser by
``scripts/gen-vllm-choices.py`` and kept as data (``data/vllm-choices.json``), with the engine
version it came from; ``--options`` flags the table does not list are reported too, as warnings,
since a newer or older engine may have them.

Pure apart from reading that one file.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterable, Mapping

DATA = Path(__file__).resolve().parent.parent / "data"
TABLE = DATA / "vllm-choices.json"
LABELS = {"vllm": "vLLM", "sglang": "SGLang"}
# the launch key behind a flag, to name where a bad value was set
FLAG_KEYS = {"--tool-call-parser": "TOOL_CALL_PARSER", "--reasoning-parser": "REASONING_PARSER",
             "--attention-backend": "SGLANG_ATTENTION_BACKEND"}
CLASS_PATH_FLAG = "--distributed-executor-backend"
_cache: dict[str, dict] = {}


def table(path: Path = TABLE) -> dict:
    """The table ``{"engine": ..., "version": ..., "choices": {flag: [names]}, "options": [flags]}`` (read once)."""
    key = str(path)
    if key not in _cache:
        _cache[key] = json.loads(path.read_text(encoding="utf-8"))
    return _cache[key]


def for_image(engine: str, image: str | None) -> Path:
    """The table of ``engine`` for the release ``image`` pins (``data/<engine>-choices-X.Y.Z.json``), else the
    newest one (``data/<engine>-choices.json``), whose names :func:`messages` then only warns about."""
    wanted = release(image)
    if wanted is not None:
        pinned = DATA / f"{engine}-choices-{'.'.join(map(str, wanted))}.json"
        if pinned.is_file():
            return pinned
    return DATA / f"{engine}-choices.json"


def flag_values(argv: Iterable[str]) -> list[tuple[str, str | None]]:
    """``(flag, value)`` for every ``--flag value`` / ``--flag=value`` / bare ``--flag`` in ``argv``."""
    words = list(argv)
    out: list[tuple[str, str | None]] = []
    for i, word in enumerate(words):
        if not word.startswith("--"):
            continue
        name, eq, value = word.partition("=")
        if eq:
            out.append((name, value))
        elif i + 1 < len(words) and not words[i + 1].startswith("-"):
            out.append((name, words[i + 1]))
        else:
            out.append((name, None))
    return out


def check(argv: Iterable[str], data: Mapping | None = None) -> tuple[list[tuple[str, str, list[str]]], list[str]]:
    """``(refused, unknown)`` for one ``vllm serve`` argv: the ``(flag, value, valid names)`` whose value
    is not among vLLM's choices, and the ``--flags`` vLLM's parser does not have."""
    data = table() if data is None else data
    choices: Mapping[str, list[str]] = data.get("choices", {})
    options = set(data.get("options", ()))
    refused, unknown = [], []
    seen: set[str] = set()  # unknown as a set: a long SERVER_EXTRA_ARGS stays linear
    for flag, value in flag_values(argv):
        if data.get("engine") == "vllm" and flag == CLASS_PATH_FLAG and value is not None and "." in value:
            continue  # vLLM also takes an Executor class by its dotted path
        if flag in choices and value is not None and value not in choices[flag]:
            refused.append((flag, value, sorted(choices[flag])))
        if options and flag not in options and flag not in seen:
            seen.add(flag)
            unknown.append(flag)
    return refused, unknown


_RELEASE = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


def release(text: str | None) -> tuple[int, int, int] | None:
    """The x.y.z an engine version or an image tag names (``0.32.0+cpu``, ``v0.28.0``,
    ``v0.5.20-rocm724-mi30x-20260919``): from the tag after the image's last ``:``; None without one."""
    if not text:
        return None
    tag = text.rsplit("@", 1)[0].rsplit("/", 1)[-1].rpartition(":")[2] if ":" in text else text
    m = _RELEASE.search(tag)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)) if m else None


def messages(argv: Iterable[str], extra: Iterable[str], where: Mapping[str, str],
             data: Mapping | None = None, image: str | None = None) -> tuple[list[str], list[str]]:
    """``(blockers, warnings)`` as the dry run prints them, for one rank's ``vllm serve`` argv of which
    ``extra`` came from ``SERVER_EXTRA_ARGS`` (only those can be flags vLLM lacks). ``where`` maps a
    launch key to the file:line that set it. ``image``: the pinned image the job runs; when its tag names
    another release than the table's, a refused name is a warning that says so (the image's engine may
    take it), not a refusal."""
    data = table() if data is None else data
    engine = LABELS.get(data.get("engine", "vllm"), data.get("engine"))
    version = data.get("version", "?")
    ours, theirs = release(version), release(image)
    runs = f"{engine} {'.'.join(map(str, theirs))} ({image})" if ours and theirs and ours != theirs else ""
    refused, _ = check(argv, data)
    _, unknown = check(extra, data)
    blockers, warnings = [], []
    for flag, value, valid in refused:
        key = FLAG_KEYS.get(flag)
        origin = where.get(key) if key else None
        setting = f"{key} ({origin})" if origin else f"SERVER_EXTRA_ARGS ({where.get('SERVER_EXTRA_ARGS', '?')})"
        said = f"{setting}: {engine} refuses {flag} {value!r} ({engine} {version} takes: {', '.join(valid)})"
        if runs:
            warnings.append(f"{said}; the image runs {runs}, whose list may differ: check it there")
        else:
            blockers.append(said + "; the engine would refuse it as it starts, after the allocation was granted")
    warnings += [f"{engine} {version}'s argument parser has no {flag} (SERVER_EXTRA_ARGS "
                 f"({where.get('SERVER_EXTRA_ARGS', '?')})); check the flag against the image's {engine}"
                 + (f", {runs}" if runs else "") for flag in unknown]
    return blockers, warnings
