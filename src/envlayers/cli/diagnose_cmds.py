"""``diagnose`` and ``check-cores``: read a job's logs and run directory, explain, change nothing."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import click

from ..errors import EnvLayersError
from ..jobid import looks_like_job_id, not_found, parse_job_id
from ..rundir import SERVE_ENV
from .params import terminal_text

LOG_GLOBS = ("*.log", "*.out", SERVE_ENV)
EVIDENCE_LABELS = {"signature": "evidence:", "requires": "with:", "with": "with:", "peak": "peak:",
                   "latest": "latest:"}
POSSIBLE = "POSSIBLE"  # the marker of a possible finding in text (in --json: "certainty": "possible")


def _dir_logs(folder: Path) -> list[Path]:
    """The current run's logs: the top level of a run directory (earlier runs of a requeued job sit in
    run-<n>/ folders and are not read)."""
    from ..diagnose import current_run_files, input_order

    return sorted(current_run_files(folder, LOG_GLOBS), key=input_order)


class Inputs:
    """What ``diagnose`` reads: the files, the run directories they came from, and per job id the run
    directory with Slurm's record (for the launcher's end)."""

    def __init__(self) -> None:
        self.paths: list[Path] = []
        self.run_dirs: list[Path] = []
        self.jobs: list[tuple[str, Path | None, object]] = []  # (job id, run dir, slurm.JobInfo | None)


def resolve(targets: tuple[str, ...], submit_dir: Path) -> Inputs:
    """Files to read (a file as given, a run directory's logs, or a job id's run directory and output), with
    the run directories and Slurm records found on the way."""
    inputs = Inputs()
    paths = inputs.paths
    for target in targets:
        if not target.strip():  # Path("") is the current directory: another job's files, read as this one's
            raise EnvLayersError(f"{target!r} is empty: not a job id, a log file or a run directory",
                                 where="JOBID|LOGFILE|RUNDIR",
                                 hint="give the job id sbatch printed (`env_layers diagnose 12345`), or '.' for the "
                                      "run directory you are in")
        p = Path(target)
        if p.is_dir():
            logs = _dir_logs(p)
            if not logs:
                raise EnvLayersError(f"no *.log, *.out or serve.env in {p}")
            paths += logs
            inputs.run_dirs.append(p)
        elif p.is_file():
            paths.append(p)
        elif not p.exists() and looks_like_job_id(target):
            from ..job import locate_job, slurm_record

            target = parse_job_id(target)

            # where Slurm says the job's output is (any directory), its run_dir= line, else the run roots
            job = locate_job(target, slurm_record(target), cwd=submit_dir)
            info, out, run_dir = job.info, job.files.job_out, job.files.run_dir
            has_dir = run_dir is not None and run_dir.is_dir()
            found = (_dir_logs(run_dir) if has_dir else []) + ([out] if out.is_file() else [])
            inputs.jobs.append((target, run_dir if has_dir else None, info))
            if has_dir:
                inputs.run_dirs.append(run_dir)
            if has_dir and not found and info is not None and info.finished:
                continue  # nothing logged, but the launcher's end (or its lack) still says something
            if not found and info is None and not has_dir:
                raise not_found(target, give_dir="`env_layers diagnose RUN_DIR`")  # as every command says it
            if not found:
                raise EnvLayersError(f"no logs for job {target}",
                                     hint=f"looked for {out} and the run directory ($SCRATCH/inference-server/"
                                     f"{target}); run from the submit directory or pass --root, or give the log files")
            paths += found
        elif p.exists():
            raise EnvLayersError(f"not a regular file or directory: {p}")
        else:
            raise EnvLayersError(f"no such file, directory or job id: {target}")
    unique: list[Path] = []
    for path in paths:
        if path not in unique:
            unique.append(path)
    inputs.paths = unique
    return inputs


def _wrap(label: str, text: str) -> str:
    return textwrap.fill(text, width=100, initial_indent=f"  {label}", subsequent_indent=" " * (len(label) + 2))


@click.command("diagnose")
@click.argument("targets", nargs=-1, metavar="JOBID|LOGFILE|RUNDIR...")
@click.option("--json", "as_json", is_flag=True, help="Print findings as JSON.")
@click.option("--root", "submit_root", type=click.Path(file_okay=False), default=None,
              help="Submit directory holding serve-only-<jobid>.out (and runs/ when SCRATCH is unset); "
              "default: the current directory.")
@click.option("--rules", "rules_path", metavar="FILE", default=None,
              help="Knowledge base to use instead of the packaged known-issues.yaml.")
@click.option("--markdown", is_flag=True,
              help="Print the knowledge base as docs/known-issues.md and exit (no TARGETS).")
@click.pass_context
def diagnose(ctx: click.Context, targets: tuple[str, ...], as_json: bool, submit_root: str | None,
             rules_path: str | None, markdown: bool) -> None:
    """Match a job's logs against the known-issues knowledge base.

    \b
    A JOBID reads ./serve-only-<jobid>.out and the run directory it names
    (else $SCRATCH/inference-server/<jobid>/, else ./runs/inference-server/<jobid>/);
    a directory reads its *.log, *.out and serve.env; a file is read as given.
    Only the current run of a requeued job is read (earlier runs sit in run-<n>/).
    A JOBID that ended without the launcher's launch-end.json is reported: the launcher was killed.
    A rule whose signature matches while the context that would confirm it is missing (a lone log)
    is reported as POSSIBLE, with what would confirm it.
    Exit status: 0 nothing matched, 1 at least one known issue matched (possible ones too), 2 bad input.
    """
    from ..diagnose import diagnose as run_diagnose
    from ..diagnose import launcher_end_finding, load_rules, read_log, render_markdown
    from ..rundir import earlier_run_dirs

    rules = load_rules(rules_path)
    if markdown:
        if targets:
            raise EnvLayersError("--markdown takes no JOBID, log or directory", hint="run it alone")
        click.echo(render_markdown(rules), nl=False)
        return
    if not targets:
        raise EnvLayersError("give a JOBID, a log file or a run directory", hint="env_layers diagnose --help")
    inputs = resolve(targets, Path(submit_root) if submit_root else Path.cwd())
    paths = inputs.paths
    logs = [read_log(p) for p in paths]
    findings = []
    for job_id, run_dir, info in inputs.jobs:
        died = launcher_end_finding(run_dir, info, job_id)
        if died is not None:
            findings.append(died)
    findings += run_diagnose(logs, rules)
    earlier = {str(d): [p.name for p in earlier_run_dirs(d).values()] for d in inputs.run_dirs}
    earlier = {d: names for d, names in earlier.items() if names}

    if as_json:
        click.echo(json.dumps({
            "inputs": [str(p) for p in paths],
            "earlier_runs": earlier,
            "matched": len(findings),
            "possible": sum(1 for f in findings if f.possible),
            "findings": [f.to_dict() for f in findings],
        }, indent=2))
    else:
        # every field may quote what a rank printed (or a --rules file says): one line each, no control
        # character reaches the terminal
        t = terminal_text
        for run_dir, names in earlier.items():
            click.echo(f"{t(run_dir)}: the job was requeued; earlier runs in {t(', '.join(n + '/' for n in names))} "
                       "are not read (pass one as RUNDIR to diagnose it)")
        for f in findings:
            mark = f", {POSSIBLE}" if f.possible else ""
            click.echo(f"{t(f.rule_id)} ({t(f.severity)}{mark}): {t(f.title)}")
            for e in f.evidence:
                click.echo(f"  {EVIDENCE_LABELS.get(e.role, 'evidence:'):<10}{t(e.where)}: {t(e.text)}")
            if f.detail:
                click.echo(_wrap("detail:   ", t(f.detail)))
            if f.possible:
                click.echo(_wrap("confirm:  ", f"holds only {t(f.confirm_if)}"))
            click.echo(_wrap("cause:    ", t(f.cause)))
            click.echo(_wrap("fix:      ", t(f.fix)))
            click.echo(f"  see:      {t(f.see)}")
            click.echo("")
        lines = sum(len(log.lines) for log in logs)
        possible = sum(1 for f in findings if f.possible)
        if findings:
            of_them = f" ({possible} of them {POSSIBLE}: confirm before acting)" if possible else ""
            click.echo(f"{len(findings)} known issue(s) matched in {len(paths)} file(s){of_them}.")
        else:
            click.echo(f"No known issue matched in {len(paths)} file(s), {lines} line(s).")
    if findings:
        ctx.exit(1)


@click.command("check-cores")
@click.argument("folder", metavar="DIR", type=click.Path(file_okay=False))
@click.option("--limit-file", type=click.Path(dir_okay=False), default=None,
              help="Recorded core limits (default: DIR/core-limit.txt, lines 'rank=<r> limit=<value>').")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_context
def check_cores(ctx: click.Context, folder: str, limit_file: str | None, as_json: bool) -> None:
    """Report core files in DIR and any recorded core limit that is not 0.

    Exit status: 0 clean, 1 core files found or a limit not 0, 2 bad input.
    """
    from ..cores import check_cores as run_check

    report = run_check(folder, limit_file)
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        if report.cores:
            for core in report.cores:
                kind = "ELF core" if core.elf_core else "named like a core file"
                click.echo(f"core file: {core.path} ({core.size_bytes} bytes, {kind})")
        else:
            click.echo(f"no core files in {report.folder}")
        if report.limit_file is None:
            click.echo("core limit: not recorded (no core-limit.txt)")
        for limit in report.limits:
            verdict = "ok" if limit.ok else "NOT 0: set ulimit -c 0 in the server step"
            click.echo(f"core limit: rank {limit.rank}: {limit.value} ({verdict}) [{limit.where}]")
        click.echo("clean" if report.ok else "FAILED: core files or a core limit that is not 0")
    if not report.ok:
        ctx.exit(1)
