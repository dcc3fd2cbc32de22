"""The knowledge base ``data/known-issues.yaml``: the rule types, and loading them validated.

The file is read with the shared reader (:mod:`envlayers.yamlpos`), so an error names the file, the
line, the rule and the key. The format is documented in docs/diagnose.md.
"""

from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Mapping

from ..errors import EnvLayersError

SEVERITIES = ("error", "warning")
STATUSES = ("open", "mitigated", "informational")
SCOPES = ("any-line", "last-line")
DIRECTIONS = ("falling",)
ID_RE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
RULE_KEYS = {
    "id", "title", "severity", "status", "signature", "scope", "not_followed_by", "requires", "unless",
    "trend", "example", "cause", "fix", "see", "seen_by", "possible",
}
REQUIRED_KEYS = ("id", "title", "cause", "fix", "see", "status")
# where a user reads more: a page of this project's docs (with an optional #section), or a web page
SEE_RE = re.compile(r"^(?:docs/[A-Za-z0-9_./-]+\.md(?:#[a-z0-9-]+)?|https://\S+)$")


class RuleError(EnvLayersError):
    """The knowledge base is malformed: names the file, the rule id and the key."""


@dataclass(frozen=True)
class Pattern:
    """A regex, optionally limited to input files whose base name matches ``files`` (a glob)."""

    regex: re.Pattern
    files: str | None = None

    @cached_property
    def multiline(self) -> re.Pattern:
        """The same regex over a whole file: it finds a match wherever a line would (and maybe more)."""
        return re.compile(self.regex.pattern, self.regex.flags | re.MULTILINE)

    def applies_to(self, name: str) -> bool:
        return self.files is None or fnmatch.fnmatch(os.path.basename(name), self.files)

    def search(self, line: str) -> re.Match | None:
        return self.regex.search(line)

    def describe(self) -> str:
        return self.regex.pattern + (f"  (in {self.files})" if self.files else "")


@dataclass(frozen=True)
class Trend:
    """Numbers taken from matching lines of one file, in order; fires when they fall.

    Each line gives a value from the named group ``value``, or, without it, the percentage
    ``100 * cached / (cached + new)`` from groups ``cached`` and ``new``. The rule fires when the
    mean of the last ``window`` values is ``drop_points`` below the highest mean of any ``window``
    consecutive values; ``window`` is a fifth of the points, at least 3.
    """

    pattern: Pattern
    direction: str
    min_points: int
    drop_points: float


@dataclass(frozen=True)
class Possible:
    """When a rule's signature matches but the inputs lack the context its ``requires`` look for (a lone
    log: no job output saying how the rank ended, no node count), the rule still reports, as a *possible*
    finding that names what would confirm it.

    ``context``: patterns whose presence anywhere means the context is known (then ``requires`` decide
    alone: no possible finding); ``also``: patterns that must match too, for the signature to stand on its
    own; ``confirm``: what would confirm it, as a sentence starting with "if" ("if this rank was killed...").
    """

    context: tuple[Pattern, ...]
    confirm: str
    also: tuple[Pattern, ...] = ()


@dataclass(frozen=True)
class Rule:
    id: str
    title: str
    severity: str
    status: str
    cause: str
    fix: str
    see: str  # docs/<page>.md[#section] or an https:// page: where the user reads more
    signature: tuple[Pattern, ...] = ()
    scope: str = "any-line"
    not_followed_by: tuple[Pattern, ...] = ()
    requires: tuple[Pattern, ...] = ()
    unless: tuple[Pattern, ...] = ()
    trend: Trend | None = None
    example: str | None = None
    # for a problem no log shows (no signature, no trend): how an operator sees it instead; such a rule
    # never fires in `diagnose`, it is documented in docs/known-issues.md
    seen_by: str | None = None
    possible: Possible | None = None


def default_rules_path() -> Path:
    return Path(__file__).resolve().parent.parent / "data" / "known-issues.yaml"


def load_rules(path: str | os.PathLike | None = None) -> list[Rule]:
    """Read and validate the knowledge base (default: the one shipped with the package)."""
    from .. import yamlpos

    src = Path(path) if path is not None else default_rules_path()
    doc = yamlpos.read(src, str(src), RuleError)
    return parse_rules(doc.data(), origin=str(src), lines=doc.line_of)


_KEY_PART = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def parse_rules(data: object, origin: str = "<rules>", lines=None) -> list[Rule]:
    """Validate already-parsed rule data (a mapping with ``rules:``, or the list itself). ``lines``
    (key path -> line, e.g. ``Doc.line_of``) lets every error name ``origin:line``."""

    def where(path: tuple) -> str:
        line = lines(path) if lines is not None else None
        return f"{origin}:{line}" if line else origin

    prefix: tuple = ()
    if isinstance(data, Mapping):
        unknown = set(data) - {"version", "rules"}
        if unknown:
            key = sorted(unknown, key=str)[0]
            raise RuleError(f"{clip(key)}: unknown top-level key", where=where((key,)),
                            hint="the file holds `version:` and `rules:`")
        data, prefix = data.get("rules"), ("rules",)
    if not isinstance(data, list):
        raise RuleError("expected a list of rules under `rules:`", where=where(prefix))
    rules: list[Rule] = []
    seen: set[str] = set()
    for index, raw in enumerate(data):
        rule = _parse_rule(raw, index, lambda key, i=index: where(prefix + (i,) + _key_path(key)))
        if rule.id in seen:
            raise RuleError(f"rule {rule.id!r}: id: duplicate id", where=where(prefix + (index, "id")),
                            hint="each rule once; rename one of them")
        seen.add(rule.id)
        rules.append(rule)
    return rules


def _key_path(key: str) -> tuple:
    """"requires[0].pattern" -> ("requires", 0, "pattern")."""
    return tuple(name or int(index) for name, index in _KEY_PART.findall(key))


def clip(value: object) -> str:
    from ..yamlpos import clip as _clip

    return _clip(value)


def _parse_rule(raw: object, index: int, where) -> Rule:
    if not isinstance(raw, Mapping):
        raise RuleError(f"rule #{index + 1}: expected a mapping, got {type(raw).__name__}", where=where(""))
    rid = raw.get("id")
    label = f"rule {clip(rid)}" if isinstance(rid, str) and rid else f"rule #{index + 1}"

    def fail(key: str, message: str, hint: str | None = None) -> RuleError:
        key = str(key)[:80]
        return RuleError(f"{label}: {key}: {message}", where=where(key), hint=hint)

    unknown = sorted(set(raw) - RULE_KEYS, key=str)
    if unknown:
        raise fail(unknown[0], "unknown key", hint=f"known keys: {', '.join(sorted(RULE_KEYS))}")
    for key in REQUIRED_KEYS:
        if key not in raw or raw[key] in (None, ""):
            raise fail(key, "missing")
    for key in ("id", "title", "cause", "fix", "status"):
        if not isinstance(raw[key], str):
            raise fail(key, "must be a string")
    if not ID_RE.match(rid):
        raise fail("id", "must be kebab-case (lowercase words joined by '-')")
    severity = raw.get("severity", "error")
    if severity not in SEVERITIES:
        raise fail("severity", f"must be one of {', '.join(SEVERITIES)}")
    if raw["status"] not in STATUSES:
        raise fail("status", f"must be one of {', '.join(STATUSES)}")
    see = raw["see"]
    if not isinstance(see, str) or not SEE_RE.match(see):
        raise fail("see", "must be a page of the project's docs (docs/<page>.md, optionally #section) "
                   "or an https:// page", hint="where a user reads more about the problem")
    scope = raw.get("scope", "any-line")
    if scope not in SCOPES:
        raise fail("scope", f"must be one of {', '.join(SCOPES)}")

    has_sig, has_trend, seen_by = "signature" in raw, "trend" in raw, raw.get("seen_by")
    if has_sig and has_trend:
        raise fail("signature", "give exactly one of `signature` and `trend`")
    if not has_sig and not has_trend and seen_by is None:
        raise fail("signature", "give exactly one of `signature` and `trend`",
                   hint="for a problem no log shows, give `seen_by:` (how an operator sees it) instead")
    if seen_by is not None:
        if has_sig or has_trend:
            raise fail("seen_by", "only for a rule without `signature` or `trend` (a problem no log shows)")
        if not isinstance(seen_by, str) or not seen_by.strip():
            raise fail("seen_by", "must be a non-empty string: how an operator sees the problem")
    signature = _patterns(raw, "signature", fail, required=has_sig)
    trend = _trend(raw["trend"], fail) if has_trend else None
    if trend is not None:
        for key in ("scope", "not_followed_by"):
            if key in raw:
                raise fail(key, "only applies to a `signature` rule")

    example = raw.get("example")
    if example is not None:
        if not isinstance(example, str):
            raise fail("example", "must be a string")
        if seen_by is not None:
            raise fail("example", "a rule no log shows has no example line", hint="describe it in `seen_by:`")
        probes = signature or (trend.pattern,)
        if not any(p.search(example) for p in probes):
            raise fail("example", "does not match the rule's signature",
                       hint="the example is shown in docs/known-issues.md as the evidence to look for")

    return Rule(
        id=rid, title=raw["title"], severity=severity, status=raw["status"], cause=raw["cause"].strip(),
        fix=raw["fix"].strip(), see=see, signature=signature, scope=scope,
        not_followed_by=_patterns(raw, "not_followed_by", fail),
        requires=_patterns(raw, "requires", fail), unless=_patterns(raw, "unless", fail),
        trend=trend, example=example, seen_by=seen_by.strip() if seen_by else None,
        possible=_possible(raw, fail, has_requires="requires" in raw),
    )


def _possible(raw: Mapping, fail, has_requires: bool) -> Possible | None:
    item = raw.get("possible")
    if item is None:
        return None
    if not isinstance(item, Mapping):
        raise fail("possible", "must be a mapping with context, confirm (and optionally also)")
    unknown = sorted(set(item) - {"context", "also", "confirm"}, key=str)
    if unknown:
        raise fail(f"possible.{unknown[0]}", "unknown key (use `context`, `also` and `confirm`)")
    if not has_requires:
        raise fail("possible", "only applies to a rule with `requires` (the context a lone log may lack)")
    confirm = item.get("confirm")
    if not isinstance(confirm, str) or not confirm.strip().lower().startswith("if "):
        raise fail("possible.confirm", "must be a sentence starting with 'if' that names what would confirm it",
                   hint="e.g. 'if this rank was killed (exit 137), ...'")
    sub = {"context": item.get("context"), "also": item.get("also")}
    context = _patterns(sub, "context", lambda key, msg, hint=None: fail(f"possible.{key}", msg, hint), True)
    also = _patterns(sub, "also", lambda key, msg, hint=None: fail(f"possible.{key}", msg, hint))
    return Possible(context=context, confirm=" ".join(confirm.split()), also=also)


def _patterns(raw: Mapping, key: str, fail, required: bool = False) -> tuple[Pattern, ...]:
    items = raw.get(key)
    if items is None:
        if required:
            raise fail(key, "missing")
        return ()
    if isinstance(items, (str, Mapping)):
        items = [items]
    if not isinstance(items, list) or (required and not items):
        raise fail(key, "must be a regex or a non-empty list of them")
    return tuple(_pattern(item, f"{key}[{i}]", fail) for i, item in enumerate(items))


def _pattern(item: object, key: str, fail) -> Pattern:
    files = None
    if isinstance(item, Mapping):
        unknown = sorted(set(item) - {"pattern", "files"}, key=str)
        if unknown:
            raise fail(f"{key}.{unknown[0]}", "unknown key (use `pattern` and `files`)")
        files = item.get("files")
        if files is not None and (not isinstance(files, str) or not files):
            raise fail(f"{key}.files", "must be a file-name glob such as 'serve.env'")
        item = item.get("pattern")
        key = f"{key}.pattern"
    if not isinstance(item, str) or not item:
        raise fail(key, "must be a non-empty regular expression")
    try:
        regex = re.compile(item)
    except re.error as err:
        raise fail(key, f"invalid regular expression: {err}") from None
    return Pattern(regex=regex, files=files)


def _trend(raw: object, fail) -> Trend:
    if not isinstance(raw, Mapping):
        raise fail("trend", "must be a mapping with pattern, direction, min_points, drop_points")
    unknown = sorted(set(raw) - {"pattern", "files", "direction", "min_points", "drop_points"}, key=str)
    if unknown:
        raise fail(f"trend.{unknown[0]}", "unknown key")
    pattern = _pattern({"pattern": raw.get("pattern"), "files": raw.get("files")}, "trend", fail)
    groups = set(pattern.regex.groupindex)
    if "value" not in groups and not {"cached", "new"} <= groups:
        raise fail("trend.pattern", "needs a named group `value`, or groups `cached` and `new`")
    direction = raw.get("direction", "falling")
    if direction not in DIRECTIONS:
        raise fail("trend.direction", f"must be one of {', '.join(DIRECTIONS)}")
    min_points, drop = raw.get("min_points", 10), raw.get("drop_points")
    if not isinstance(min_points, int) or isinstance(min_points, bool) or min_points < 3:
        raise fail("trend.min_points", "must be an integer >= 3")
    if not isinstance(drop, (int, float)) or isinstance(drop, bool) or drop <= 0:
        raise fail("trend.drop_points", "must be a positive number")
    return Trend(pattern=pattern, direction=direction, min_points=min_points, drop_points=float(drop))
