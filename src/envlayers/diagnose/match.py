"""Matching: which rules of the knowledge base fire on a set of logs, with the evidence lines.

Pure: it takes :class:`LogText` inputs and :class:`Rule` objects and reads nothing itself.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

from ..phases import strip_ansi
from .evidence import Evidence, Finding, LogText, _clip
from .rules import Pattern, Rule, Trend, load_rules


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
    certainty = "confirmed"
    for pattern in rule.requires:
        mine = [log for log in prepared if log.name == evidence[0].file]
        found = _first_match(mine, pattern) or _first_match(prepared, pattern)
        if found is None:
            if not _possible(rule, prepared, evidence):
                return None
            certainty = "possible"
            continue
        evidence.append(Evidence(found.file, found.line, found.text, role="requires"))
    for pattern in rule.unless:
        if _first_match(prepared, pattern) is not None:
            return None
    return Finding(rule_id=rule.id, title=rule.title, severity=rule.severity, status=rule.status,
                   cause=rule.cause, fix=rule.fix, see=rule.see, evidence=tuple(evidence),
                   detail=detail, certainty=certainty,
                   confirm_if=rule.possible.confirm if certainty == "possible" and rule.possible else None)


def _possible(rule: Rule, prepared: Sequence[_Prepared], evidence: list[Evidence]) -> bool:
    """A required line is missing: is it only the context that is missing (a lone log), so the rule may
    still report as a possible finding? Adds the ``also`` lines to ``evidence`` when so."""
    spec = rule.possible
    if spec is None or any(_first_match(prepared, p) is not None for p in spec.context):
        return False  # no fallback, or the context is there and says no
    extra = []
    for pattern in spec.also:
        found = _first_match(prepared, pattern)
        if found is None:
            return False
        extra.append(Evidence(found.file, found.line, found.text, role="with"))
    evidence.extend(e for e in extra if e not in evidence)
    return True


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
