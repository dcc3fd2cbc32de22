"""docs/known-issues.md, generated from the knowledge base (``env_layers diagnose --markdown``)."""

from __future__ import annotations

from typing import Sequence

from .rules import Rule


def render_markdown(rules: Sequence[Rule]) -> str:
    """docs/known-issues.md: every rule with its evidence, cause, fix, where to read more, and status."""
    out = [
        "# Known issues",
        "",
        "<!-- Generated from src/envlayers/data/known-issues.yaml by",
        "     `env_layers diagnose --markdown > docs/known-issues.md`. Do not edit by hand. -->",
        "",
        "Problems seen when serving models on the cluster, each with the log line that gives it away (or, where",
        "no log shows it, how to see it instead).",
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
        if r.seen_by is not None:
            out += [f"Signature: none; no log shows it. Seen by: {r.seen_by}"]
        elif r.trend is not None:
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
        if r.possible is not None:
            also = "".join(f" and a line matches `{p.describe()}`" for p in r.possible.also)
            known = " or ".join(f"`{p.describe()}`" for p in r.possible.context)
            out += ["", f"Possible finding: when the signature matches{also} but no input matches {known} (a lone "
                    f"log: the context is missing), the rule is reported as POSSIBLE, to confirm {r.possible.confirm}."]
        out += ["", f"Cause: {r.cause}", "", f"Fix: {r.fix}", "", f"See: {see_link(r.see)}."]
    return "\n".join(out) + "\n"


def see_link(see: str) -> str:
    """A rule's ``see`` as a Markdown link from docs/known-issues.md (which sits in docs/)."""
    target = see[len("docs/"):] if see.startswith("docs/") else see
    return f"[{see}]({target})"
