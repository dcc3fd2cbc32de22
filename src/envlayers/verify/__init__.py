"""``env_layers verify``: gates against a live endpoint (tool calls, reasoning, accuracy, metrics).

``run_gates(target, ...)`` runs the chosen checks on every base URL of a :class:`Target` (from
``target.resolve``) and returns a :class:`Report`: pass/fail/skip per check with its evidence, as data (the
evidence is what the endpoint sent, as it sent it; ``cli.verify_cmds`` formats it for a terminal).
Exit statuses: 0 every check passed or was skipped, 1 a check failed, 2 the gates could not run
(``CannotVerify`` and the other ``EnvLayersError``s). docs/verify.md describes the gates.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .checks import NAMES, Check
from .target import CannotVerify, Target, resolve

__all__ = ["NAMES", "CannotVerify", "Check", "Report", "Target", "load_accuracy_data", "resolve", "run_gates"]


@dataclass
class Report:
    target: Target
    checks: list[Check] = field(default_factory=list)

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == "fail"]

    @property
    def exit_code(self) -> int:
        return 1 if self.failed else 0

    def to_dict(self) -> dict:
        return {"target": self.target.to_dict(), "ok": not self.failed, "exit_code": self.exit_code,
                "checks": [c.to_dict() for c in self.checks]}


def load_accuracy_data(baselines_file: str | None = None, prompts_file: str | None = None):
    """The prompts and baselines, validated: call it before any request, so bad data costs nothing."""
    from .data import load_baselines, load_prompts

    prompts = load_prompts(prompts_file)
    return prompts, load_baselines(baselines_file, n_prompts=len(prompts))


def run_gates(target: Target, *, checks: tuple[str, ...] = NAMES, timeout_s: float = 180.0,
              accuracy_data=None) -> Report:
    """Run ``checks`` (in the order of NAMES) against every base URL of ``target``.
    ``accuracy_data``: ``load_accuracy_data()``'s result (loaded here when not given)."""
    from . import checks as gates
    from .client import Client

    prompts = baselines = None
    if "accuracy" in checks:
        prompts, baselines = accuracy_data or load_accuracy_data()
    report = Report(target)
    for url in target.base_urls:
        client = Client(url, target.api_key, timeout_s=timeout_s)
        for name in NAMES:
            if name not in checks:
                continue
            if name == "tools":
                report.checks.append(gates.check_tools(client, target))
            elif name == "reasoning":
                report.checks.append(gates.check_reasoning(client, target))
            elif name == "accuracy":
                report.checks.append(gates.check_accuracy(client, target, prompts, baselines))
            else:
                report.checks.append(gates.check_metrics(client, target))
    return report
