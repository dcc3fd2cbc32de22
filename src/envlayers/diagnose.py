"""Symptom -> cause -> fix, from logs, with a knowledge base kept as data.

The rules live in ``data/known-issues.yaml`` (format: docs/diagnose.md). This module is pure apart from
reading that file and, in :func:`read_log`, a log: it never talks to Slurm and never changes anything.

Typical use::

    rules = load_rules()                                   # validated; RuleError names rule id and key
    logs = [read_log(p) for p in paths]                    # LogText(name, lines)
    for f in diagnose(logs, rules):
        print(f.rule_id, f.evidence[0].where, f.cause, f.fix)

``python -m envlayers.diagnose --markdown`` prints docs/known-issues.md.
"""

from __future__ import annotations

import bisect
import fnmatch
import os
import re
import sys
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Iterable, Iterator, Mapping, Sequence

from .errors import EnvLayersError
from .phases import strip_ansi

SEVERITIES = ("error", "warning")
STATUSES = ("open", "mitigated", "informational")
SCOPES = ("any-line", "last-line")
DIRECTIONS = ("falling",)
ID_RE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
RULE_KEYS = {
    "id", "title", "severity", "status", "signature", "scope", "not_followed_by", "requires", "unless",
    "trend", "example", "cause", "fix", "source",
}
REQUIRED_KEYS = ("id", "title", "cause", "fix", "source", "status")
EVIDENCE_TEXT_MAX = 400


class RuleError(EnvLayersError):
    """The knowledge base is malformed: names the file, the rule id and the key."""


# --- data ----------------------------------------------------------------------------------------


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
class Rule:
    id: str
    title: str
    severity: str
    status: str
    cause: str
    fix: str
    source: Mapping[str, str]
    signature: tuple[Pattern, ...] = ()
    scope: str = "any-line"
    not_followed_by: tuple[Pattern, ...] = ()
    requires: tuple[Pattern, ...] = ()
    unless: tuple[Pattern, ...] = ()
    trend: Trend | None = None
    example: str | None = None

    @property
    def source_text(self) -> str:
        return f"seed {self.source['seed']}, {self.source['section']}"


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
    source: str
    evidence: tuple[Evidence, ...]
    detail: str | None = None

    def to_dict(self) -> dict:
        return {
            "id": self.rule_id, "title": self.title, "severity": self.severity, "status": self.status,
            "evidence": [e.to_dict() for e in self.evidence], "detail": self.detail,
            "cause": self.cause, "fix": self.fix, "source": self.source,
        }


# --- loading and validation ------------------------------------------------------------------------


def default_rules_path() -> Path:
    return Path(__file__).resolve().parent / "data" / "known-issues.yaml"


def load_rules(path: str | os.PathLike | None = None) -> list[Rule]:
    """Read and validate the knowledge base (default: the one shipped with the package)."""
    import yaml

    src = Path(path) if path is not None else default_rules_path()
    try:
        text = src.read_text(encoding="utf-8")
    except OSError as err:
        raise RuleError(f"cannot read the knowledge base: {err.strerror}", where=str(src)) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{src}:{mark.line + 1}" if mark is not None else str(src)
        raise RuleError(f"not valid YAML: {getattr(err, 'problem', err)}", where=where) from None
    return parse_rules(data, origin=str(src))


def parse_rules(data: object, origin: str = "<rules>") -> list[Rule]:
    """Validate already-parsed rule data (a mapping with ``rules:``, or the list itself)."""
    if isinstance(data, Mapping):
        unknown = set(data) - {"version", "rules"}
        if unknown:
            raise RuleError(f"unknown top-level key {sorted(unknown)[0]!r}", where=origin,
                            hint="the file holds `version:` and `rules:`")
        data = data.get("rules")
    if not isinstance(data, list):
        raise RuleError("expected a list of rules under `rules:`", where=origin)
    rules: list[Rule] = []
    seen: set[str] = set()
    for index, raw in enumerate(data):
        rule = _parse_rule(raw, index, origin)
        if rule.id in seen:
            raise RuleError(f"rule {rule.id!r}: key 'id': duplicate id", where=origin)
        seen.add(rule.id)
        rules.append(rule)
    return rules


def _parse_rule(raw: object, index: int, origin: str) -> Rule:
    if not isinstance(raw, Mapping):
        raise RuleError(f"rule #{index + 1}: expected a mapping, got {type(raw).__name__}", where=origin)
    rid = raw.get("id")
    label = f"rule {rid!r}" if isinstance(rid, str) and rid else f"rule #{index + 1}"

    def fail(key: str, message: str, hint: str | None = None) -> RuleError:
        return RuleError(f"{label}: key {key!r}: {message}", where=origin, hint=hint)

    unknown = sorted(set(raw) - RULE_KEYS)
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
    source = raw["source"]
    if (not isinstance(source, Mapping) or set(source) != {"seed", "section"}
            or not all(isinstance(v, (str, int)) and str(v) for v in source.values())):
        raise fail("source", "must be a mapping {seed: <seed id>, section: <section>}")
    source = {k: str(v) for k, v in source.items()}
    scope = raw.get("scope", "any-line")
    if scope not in SCOPES:
        raise fail("scope", f"must be one of {', '.join(SCOPES)}")

    has_sig, has_trend = "signature" in raw, "trend" in raw
    if has_sig == has_trend:
        raise fail("signature", "give exactly one of `signature` and `trend`")
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
        probes = signature or (trend.pattern,)
        if not any(p.search(example) for p in probes):
            raise fail("example", "does not match the rule's signature",
                       hint="the example is shown in docs/known-issues.md as the evidence to look for")

    return Rule(
        id=rid, title=raw["title"], severity=severity, status=raw["status"], cause=raw["cause"].strip(),
        fix=raw["fix"].strip(), source=source, signature=signature, scope=scope,
        not_followed_by=_patterns(raw, "not_followed_by", fail),
        requires=_patterns(raw, "requires", fail), unless=_patterns(raw, "unless", fail),
        trend=trend, example=example,
    )


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
        unknown = sorted(set(item) - {"pattern", "files"})
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
    unknown = sorted(set(raw) - {"pattern", "files", "direction", "min_points", "drop_points"})
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


# --- matching --------------------------------------------------------------------------------------


@dataclass
class _Prepared:
    """One input, ANSI-free, with the whole text kept for C-speed searching.

    ``find_lines`` gives exactly the lines on which ``pattern.search(line)`` succeeds, in order, but
    finds candidates with one ``re.MULTILINE`` search over the whole file instead of a Python loop
    over every line: a match within a line is also a match in the whole text at the same place, and
    each candidate is checked on its own line before it is reported.
    """

    name: str
    lines: list[str]
    _text: str | None = None
    _starts: list[int] | None = None

    def _index(self) -> None:
        self._text = "\n".join(self.lines)
        starts, offset = [], 0
        for line in self.lines:
            starts.append(offset)
            offset += len(line) + 1
        self._starts = starts

    def find_lines(self, pattern: Pattern, start: int = 0) -> Iterator[int]:
        if self._text is None:
            self._index()
        regex = pattern.multiline
        while start < len(self.lines):
            m = regex.search(self._text, self._starts[start])
            if m is None:
                return
            i = bisect.bisect_right(self._starts, m.start()) - 1
            if pattern.search(self.lines[i]):
                yield i
            start = i + 1

    def first_line(self, patterns: Sequence[Pattern], start: int = 0) -> int | None:
        found = [next(self.find_lines(p, start), None) for p in patterns]
        found = [i for i in found if i is not None]
        return min(found) if found else None

    def last_line(self, patterns: Sequence[Pattern]) -> int:
        """Index of the last line matching any pattern, -1 when none does."""
        last = -1
        for p in patterns:
            for i in self.find_lines(p, last + 1):
                last = max(last, i)
        return last

    def last_nonblank(self) -> int | None:
        for i in range(len(self.lines) - 1, -1, -1):
            if self.lines[i].strip():
                return i
        return None


def _prepare(logs: Iterable[LogText | tuple[str, Sequence[str]]]) -> list[_Prepared]:
    prepared = []
    for log in logs:
        name, lines = (log.name, log.lines) if isinstance(log, LogText) else log
        prepared.append(_Prepared(name, [strip_ansi(line).rstrip("\r\n") for line in lines]))
    return prepared


def _clip(text: str) -> str:
    text = text.strip()
    return text if len(text) <= EVIDENCE_TEXT_MAX else text[: EVIDENCE_TEXT_MAX - 3] + "..."


def _first_match(logs: Sequence[_Prepared], pattern: Pattern) -> Evidence | None:
    for log in logs:
        if not pattern.applies_to(log.name):
            continue
        i = log.first_line([pattern])
        if i is not None:
            return Evidence(log.name, i + 1, _clip(log.lines[i]))
    return None


def _signature_hits(rule: Rule, logs: Sequence[_Prepared]) -> list[Evidence]:
    """The first qualifying line of each input file."""
    hits: list[Evidence] = []
    for log in logs:
        patterns = [p for p in rule.signature if p.applies_to(log.name)]
        if not patterns:
            continue
        stops = [p for p in rule.not_followed_by if p.applies_to(log.name)]
        after = log.last_line(stops) + 1 if stops else 0
        if rule.scope == "last-line":
            last = log.last_nonblank()
            ok = last is not None and last >= after and any(p.search(log.lines[last]) for p in patterns)
            hit = last if ok else None
        else:
            hit = log.first_line(patterns, after)
        if hit is not None:
            hits.append(Evidence(log.name, hit + 1, _clip(log.lines[hit])))
    return hits


def _trend_hit(trend: Trend, logs: Sequence[_Prepared]) -> tuple[list[Evidence], str] | None:
    for log in logs:
        if not trend.pattern.applies_to(log.name):
            continue
        points: list[tuple[int, float]] = []
        for i in log.find_lines(trend.pattern):
            groups = trend.pattern.search(log.lines[i]).groupdict()
            if groups.get("value") is not None:
                value = float(groups["value"])
            elif groups.get("cached") is not None and groups.get("new") is not None:
                cached, new = int(groups["cached"]), int(groups["new"])
                if cached + new == 0:
                    continue
                value = 100.0 * cached / (cached + new)
            else:
                continue
            points.append((i, value))
        if len(points) < trend.min_points:
            continue
        window = max(3, len(points) // 5)
        prefix = [0.0]
        for _, v in points:
            prefix.append(prefix[-1] + v)
        means = [(prefix[k + window] - prefix[k]) / window for k in range(len(points) - window + 1)]
        peak_k = max(range(len(means)), key=lambda k: means[k])
        latest = means[-1]
        if means[peak_k] - latest >= trend.drop_points:
            peak_i = points[peak_k + window - 1][0]
            last_i = points[-1][0]
            evidence = [Evidence(log.name, peak_i + 1, _clip(log.lines[peak_i]), role="peak"),
                        Evidence(log.name, last_i + 1, _clip(log.lines[last_i]), role="latest")]
            detail = (f"fell from {means[peak_k]:.1f} (peak mean of {window} consecutive lines) to "
                      f"{latest:.1f} (mean of the last {window}) over {len(points)} lines")
            return evidence, detail
    return None


def evaluate(rule: Rule, logs: Iterable[LogText | tuple[str, Sequence[str]]]) -> Finding | None:
    """The finding of one rule on the inputs, or ``None``."""
    return _evaluate(rule, _prepare(logs))


def _evaluate(rule: Rule, prepared: Sequence[_Prepared]) -> Finding | None:
    detail = None
    if rule.trend is not None:
        hit = _trend_hit(rule.trend, prepared)
        if hit is None:
            return None
        evidence, detail = hit
    else:
        evidence = _signature_hits(rule, prepared)
        if not evidence:
            return None
    if rule.requires and len(evidence) > 1:
        # several ranks show the signature: first the one whose own log also shows what is required
        # (the rank that was OOM-killed, not the one srun stopped because of it)
        def corroborated(ev: Evidence) -> bool:
            if not re.search(r"server-\d+\.log$", ev.file):
                return False  # the job output repeats every rank's tail: it corroborates nothing
            own = [log for log in prepared if log.name == ev.file]
            return any(_first_match(own, pattern) is not None for pattern in rule.requires)

        evidence.sort(key=lambda ev: not corroborated(ev))
    for pattern in rule.requires:
        mine = [log for log in prepared if log.name == evidence[0].file]
        found = _first_match(mine, pattern) or _first_match(prepared, pattern)
        if found is None:
            return None
        evidence.append(Evidence(found.file, found.line, found.text, role="requires"))
    for pattern in rule.unless:
        if _first_match(prepared, pattern) is not None:
            return None
    return Finding(rule_id=rule.id, title=rule.title, severity=rule.severity, status=rule.status,
                   cause=rule.cause, fix=rule.fix, source=rule.source_text, evidence=tuple(evidence),
                   detail=detail)


def diagnose(logs: Iterable[LogText | tuple[str, Sequence[str]]], rules: Sequence[Rule] | None = None
             ) -> list[Finding]:
    """Every rule that matches the logs taken together, in knowledge-base order."""
    rules = load_rules() if rules is None else rules
    prepared = _prepare(logs)
    findings = []
    for rule in rules:
        finding = _evaluate(rule, prepared)
        if finding is not None:
            findings.append(finding)
    return findings


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


# --- documentation -----------------------------------------------------------------------------


def render_markdown(rules: Sequence[Rule]) -> str:
    """docs/known-issues.md: every rule with its evidence, cause, fix, source and status."""
    out = [
        "# Known issues",
        "",
        "<!-- Generated from src/envlayers/data/known-issues.yaml by",
        "     `python -m envlayers.diagnose --markdown > docs/known-issues.md`. Do not edit by hand. -->",
        "",
        "Problems seen when serving models on the cluster, each with the log line that gives it away.",
        "`env_layers diagnose JOBID` matches a job's logs against all of them (see diagnose.md).",
        "",
        "| id | problem | severity | status |",
        "|---|---|---|---|",
    ]
    for r in rules:
        out.append(f"| [`{r.id}`](#{r.id}) | {r.title} | {r.severity} | {r.status} |")
    for r in rules:
        out += ["", f"## {r.id}", "", f"**{r.title}** ({r.severity}, status: {r.status})", ""]
        if r.example:
            out += ["Evidence, for example:", "", "```", r.example, "```", ""]
        if r.trend is not None:
            out += ["Signature: the numbers from lines matching", "",
                    f"- `{r.trend.pattern.describe()}`", "",
                    f"fall by {r.trend.drop_points:g} points from their peak (at least {r.trend.min_points} "
                    "such lines in one log)."]
        else:
            where = "the last non-blank line of a log" if r.scope == "last-line" else "a line"
            out += [f"Signature: {where} matching any of", ""]
            out += [f"- `{p.describe()}`" for p in r.signature]
        conditions = [f"- no later line of the same log matches `{p.describe()}`" for p in r.not_followed_by]
        conditions += [f"- the logs also contain `{p.describe()}`" for p in r.requires]
        conditions += [f"- the logs do not contain `{p.describe()}`" for p in r.unless]
        if conditions:
            out += ["", "Only when:", "", *conditions]
        out += ["", f"Cause: {r.cause}", "", f"Fix: {r.fix}", "", f"Source: {r.source_text}."]
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m envlayers.diagnose",
                                     description="Match logs against the known-issues knowledge base.")
    parser.add_argument("--markdown", action="store_true", help="print docs/known-issues.md and exit")
    parser.add_argument("--rules", help="knowledge base to use (default: the packaged one)")
    parser.add_argument("logs", nargs="*", help="log files to diagnose")
    args = parser.parse_args(argv)
    try:
        rules = load_rules(args.rules)
        if args.markdown:
            sys.stdout.write(render_markdown(rules))
            return 0
        findings = diagnose([read_log(p) for p in args.logs], rules)
    except EnvLayersError as err:
        print(f"diagnose: error: {err}", file=sys.stderr)
        return err.exit_code
    for f in findings:
        print(f"{f.rule_id}: {f.evidence[0].where}: {f.title}")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
