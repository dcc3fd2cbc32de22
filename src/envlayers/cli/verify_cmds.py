"""``verify``: run the gates against a live endpoint and print the verdict.

Thin: ``envlayers.verify`` resolves the target and runs the checks (imported when the command runs).
Exit 0 every check passed (or was skipped), 1 a check failed, 2 the gates could not run.
"""

from __future__ import annotations

import json

import click

from ..errors import EnvLayersError
from .params import Seconds, terminal_text

CHECKS = ("tools", "reasoning", "accuracy", "metrics")


@click.command()
@click.argument("spec", metavar="JOBID|URL")
@click.option("--model", "model", default=None, metavar="NAME",
              help="The served model name to ask for (default: the job's, or the first the URL lists).")
@click.option("--api-key-file", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="A file holding the API key (default: the job's SERVER_API_KEY_FILE). Never printed.")
@click.option("--timeout-s", "timeout_s", type=Seconds(zero_ok=False, minimum=1), default=180.0, show_default=True,
              metavar="S", help="Wall-clock limit of each request (a reasoning model thinks before it answers).")
@click.option("--check", "only", multiple=True, type=click.Choice(CHECKS), metavar="NAME",
              help=f"Run only this check (repeatable): {', '.join(CHECKS)}. Default: all.")
@click.option("--baselines", "baselines_file", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="Accuracy baselines to use instead of the packaged data/accuracy-baselines.yaml.")
@click.option("--run-dir", type=click.Path(file_okay=False), default=None,
              help="The job's run directory, when it is not where the job output says.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout.")
@click.pass_context
def verify(ctx: click.Context, spec: str, model: str | None, api_key_file: str | None, timeout_s: float,
           only: tuple[str, ...], baselines_file: str | None, run_dir: str | None, as_json: bool) -> None:
    """Check that a live endpoint is right, not just up: tool calls, reasoning, accuracy, metrics.

    \b
    JOBID|URL: a job id (its endpoint.json, written once live) or a base URL.
    Each check says pass, fail or skip, with the evidence; a failure names the fix.
    Exit 0 all passed, 1 a check failed, 2 could not run (no endpoint, no answer, no key).
      env_layers wait 1234 && env_layers verify 1234
    """
    from .. import verify as gates

    checks = tuple(only) or gates.NAMES
    try:
        data = gates.load_accuracy_data(baselines_file) if "accuracy" in checks else None  # bad data: exit 2 now
        root = (ctx.find_root().obj or {}).get("root")
        target = gates.resolve(spec, model=model, api_key_file=api_key_file, timeout_s=timeout_s, run_dir=run_dir,
                               root=root)
        report = gates.run_gates(target, checks=checks, timeout_s=timeout_s, accuracy_data=data)
    except EnvLayersError as err:  # its message may quote what the endpoint answered
        err.message, err.where, err.hint = (None if x is None else terminal_text(x)
                                            for x in (err.message, err.where, err.hint))
        raise
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))  # ensure_ascii: every control character escaped
    else:
        click.echo(format_report(report), nl=False)
    ctx.exit(report.exit_code)


def format_report(report) -> str:
    """The verdict for a terminal: one line per check, its evidence and fix below it. Every field that can
    hold what the endpoint sent (the served name, the model, bodies, error messages, tool calls) goes through
    :func:`terminal_text` as one line, so a hostile endpoint can neither drive the terminal nor print a line
    of its own."""
    from ..verify import NAMES

    t = report.target
    what = ", ".join(terminal_text(x) for x in (t.catalog_model, t.engine, t.model) if x)
    lines = [f"verify {terminal_text(t.label)}: model name {terminal_text(t.served)}" + (f" ({what})" if what else "")]
    lines += [f"  note: {terminal_text(n)}" for n in t.notes]
    several = len(t.base_urls) > 1
    width = max(len(n) for n in NAMES)
    for c in report.checks:
        where = f" [{terminal_text(c.url)}]" if several and c.url else ""
        lines.append(f"{c.status.upper():4}  {c.name:{width}}  {terminal_text(c.summary)}{where}")
        for e in c.evidence:
            lines.append(f"      evidence: {terminal_text(e)}")
        if c.hint and c.status == "fail":
            lines.append(f"      fix: {terminal_text(c.hint)}")
    counts = {s: sum(c.status == s for c in report.checks) for s in ("pass", "fail", "skip")}
    verdict = "FAILED" if report.failed else "passed"
    lines.append(f"verdict: {verdict} ({counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped)")
    return "\n".join(lines) + "\n"
