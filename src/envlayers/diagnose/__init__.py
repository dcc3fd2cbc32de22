"""Symptom -> cause -> fix, from logs, with a knowledge base kept as data.

The rules live in ``data/known-issues.yaml`` (format: docs/diagnose.md). The package is pure apart from
reading that file, a log (:func:`read_log`) and a run directory's end record
(:func:`launcher_end_finding`): it never talks to Slurm and never changes anything. The command line is
``env_layers diagnose`` (envlayers.cli.diagnose_cmds); ``env_layers diagnose --markdown`` prints
docs/known-issues.md.

- :mod:`.rules`: the rule types and the validated loading of the knowledge base;
- :mod:`.evidence`: the inputs (logs) and outputs (findings, evidence) and the order of a job's files;
- :mod:`.match`: which rules fire on which logs;
- :mod:`.launcher_end`: what a run directory says about how the launcher ended;
- :mod:`.docs`: docs/known-issues.md.

Typical use::

    rules = load_rules()                                   # validated; RuleError names file:line, rule, key
    logs = [read_log(p) for p in paths]                    # LogText(name, lines)
    for f in diagnose(logs, rules):
        print(f.rule_id, f.evidence[0].where, f.cause, f.fix, f.see)
"""

from __future__ import annotations

from .docs import render_markdown
from .evidence import EVIDENCE_TEXT_MAX, Evidence, Finding, LogText, input_order, read_log
from .launcher_end import current_run_files, launcher_end_finding
from .match import diagnose, evaluate
from .rules import (
    DIRECTIONS, ID_RE, REQUIRED_KEYS, RULE_KEYS, SCOPES, SEVERITIES, STATUSES, Pattern, Rule, RuleError, Trend,
    default_rules_path, load_rules, parse_rules,
)

__all__ = [
    "render_markdown", "EVIDENCE_TEXT_MAX", "Evidence", "Finding", "LogText", "input_order", "read_log",
    "current_run_files", "launcher_end_finding", "diagnose", "evaluate",
    "DIRECTIONS", "ID_RE", "REQUIRED_KEYS", "RULE_KEYS", "SCOPES", "SEVERITIES", "STATUSES", "Pattern", "Rule",
    "RuleError", "Trend", "default_rules_path", "load_rules", "parse_rules",
]
