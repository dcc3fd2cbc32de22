"""The ``env_layers`` command line: the entry point and its click group.

Commands live in small modules that are imported only when their command runs (``LazyGroup``), so
``env_layers render`` does not pay for tomli-w or HTTP code. An ``EnvLayersError`` becomes one line on
stderr and its exit code (:class:`errors_as_one_line`).
"""

from __future__ import annotations

import importlib
import os
import sys

import click

from ..errors import EnvLayersError

# command name -> (module, attribute, one-line help shown in `env_layers --help`)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "render": ("layers_cmds", "render", "Print the merged environment of EXPERIMENT:MODEL."),
    "explain": ("layers_cmds", "explain", "Show every key's value, where it was set and what it overrode."),
    "check": ("layers_cmds", "check", "Verify the committed renders; check every site x experiment x model."),
    "list": ("layers_cmds", "list_cmd", "List sites, experiments and models."),
    "install-edfs": ("edf_cmds", "install_edfs", "Install the site's container definitions (EDFs)."),
    "edf": ("edf_cmds", "edf", "Inspect container definitions."),
    "plan": ("serve_cmds", "plan", "Show the deployment plan: shape, ranks, server commands."),
    "serve": ("serve_cmds", "serve", "Submit (or --dry-run) a serve-only endpoint job."),
    "launch": ("serve_cmds", "launch", "Inside the job: start the ranks, wait for readiness, report the endpoint."),
    "wait": ("ops_cmds", "wait", "Wait until a job's endpoint is live."),
    "status": ("ops_cmds", "status", "Show endpoint jobs, or one job's record."),
    "logs": ("ops_cmds", "logs", "Show a job's server logs."),
    "stop": ("ops_cmds", "stop", "Cancel an endpoint job and confirm it is gone."),
    "report": ("report_cmds", "report", "Where the GPU-hours went: allocated, starting, serving, idle."),
    "diagnose": ("diagnose_cmds", "diagnose", "Explain failures from a job's logs."),
    "check-cores": ("diagnose_cmds", "check_cores", "Report core files and a core limit that is not 0."),
    "verify": ("verify_cmds", "verify", "Check a live endpoint: tool calls, reasoning, accuracy, metrics."),
    "connect": ("access_cmds", "connect", "What a client needs to use a job's endpoint (owner only)."),
    "ping": ("access_cmds", "ping", "Check /v1/models and a one-token chat, with latency."),
    "tunnel": ("access_cmds", "tunnel", "Open a reverse SSH tunnel from the API node to a gateway host."),
    "release": ("access_cmds", "release", "Release in order: gateway route, tunnel, server, allocation."),
    "batch": ("batch_cmds", "batch", "Run an OpenAI Batch file through a live endpoint; a rerun resumes."),
    "bench": ("bench_cmds", "bench", "Load a live endpoint: throughput and latency at several concurrencies."),
    "images": ("images_cmds", "images", "The images a site runs and how to make each; podman save and load."),
}

# `env_layers --help` lists the commands in these sections, in this order; every command is in exactly one
# (tests/test_cli_layers.py holds the two tables together)
SECTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Set up (the catalog and the containers)", ("list", "render", "explain", "check", "install-edfs", "edf",
                                                 "images")),
    ("Launch", ("plan", "serve", "wait")),
    ("Operate (a job: its endpoint, access and end)", ("status", "logs", "connect", "ping", "batch", "tunnel",
                                                       "release", "stop")),
    ("Inspect (what happened, how well it serves)", ("diagnose", "check-cores", "verify", "bench", "report")),
    ("In the job (the job script runs it)", ("launch",)),
)


class errors_as_one_line:  # noqa: N801 - used as a context manager, like contextlib's
    """An EnvLayersError becomes one line and its exit code; anything else unexpected too,
    with the traceback only under ENVLAYERS_DEBUG=1. ``ctx`` is accepted and unused."""

    def __init__(self, ctx=None):
        self.ctx = ctx

    def __enter__(self):
        return self

    def __exit__(self, kind, err, tb) -> bool:
        if err is None or not isinstance(err, Exception):  # KeyboardInterrupt, SystemExit: as they are
            return False
        if isinstance(err, EnvLayersError):
            if os.environ.get("ENVLAYERS_DEBUG") == "1":
                return False
            click.echo(f"env_layers: error: {err}", err=True)
            sys.exit(err.exit_code)
        if isinstance(err, (click.exceptions.Exit, click.ClickException, click.Abort)):
            return False
        if isinstance(err, BrokenPipeError):  # `env_layers render ... | head`: the reader left, nothing is wrong
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(141)
        if os.environ.get("ENVLAYERS_DEBUG") == "1":  # a bug or an OS error
            return False
        click.echo(f"env_layers: internal error: {type(err).__name__}: {err}; "
                   "hint: rerun with ENVLAYERS_DEBUG=1 for the traceback, and report it", err=True)
        sys.exit(70)


def _available(name: str) -> bool:
    """Whether the command's module is present (a trimmed install may leave one out); only ``--help``
    asks, a command that runs is simply imported."""
    import importlib.util

    return importlib.util.find_spec(f"{__name__}.{COMMANDS[name][0]}") is not None


class LazyGroup(click.Group):
    """A group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [name for name in COMMANDS if _available(name)]

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module, attr, _ = COMMANDS[name]
        try:
            return getattr(importlib.import_module(f"{__name__}.{module}"), attr)
        except ModuleNotFoundError as err:
            if err.name != f"{__name__}.{module}":
                raise  # the module is there and one of its own imports is missing: a real error
            return None

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        available = set(self.list_commands(ctx))
        width = max(map(len, available), default=0)  # one column for every section
        for title, names in SECTIONS:
            rows = [(name.ljust(width), COMMANDS[name][2]) for name in names if name in available]
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)

    def invoke(self, ctx: click.Context):
        with errors_as_one_line(ctx):
            return super().invoke(ctx)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--root",
    type=click.Path(file_okay=False),
    default=None,
    help="Folder holding experiments/ and containers/ (default: nearest upward from here, "
    "else the catalog installed with the package). Env: ENVLAYERS_ROOT.",
)
@click.version_option(package_name="envlayers", prog_name="env_layers")
@click.pass_context
def cli(ctx: click.Context, root: str | None) -> None:
    """Layered launch settings and a serve-only launcher for LLM endpoints on Slurm.

    \b
    Typical use:
      env_layers render experiment:qwen38        # the merged launch environment
      env_layers explain experiment:glm53 SGLANG_ATTENTION_BACKEND
      SITE=h100 env_layers plan --model glm53    # the same model on another site
      SUBMIT=0 cluster/serve-only.sbatch          # what a submission would run
    """
    ctx.obj = {"root": root}


site_option = click.option(
    "--site", envvar="SITE", metavar="SITE",
    help="The site layer (env: SITE): a name of experiments/sites/<SITE>.env or a file's path; it sits right "
         "above common.env. Without it, setups.yaml's site: (docs/sites.md).")


def get_root(ctx) -> str:
    from ..paths import find_root

    obj = ctx.find_root().obj or {}
    return find_root(obj.get("root"))  # None: ENVLAYERS_ROOT, then upward from the cwd


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else list(argv)
    cli.main(args=args, prog_name="env_layers")


def install_edfs_main(argv: list[str] | None = None) -> None:
    """The ``install_edfs`` console script: ``env_layers install-edfs`` under its own name."""
    args = sys.argv[1:] if argv is None else argv
    ctx = click.Context(cli, obj={"root": None})  # --root comes from ENVLAYERS_ROOT or the cwd
    command = cli.get_command(ctx, "install-edfs")
    with errors_as_one_line(ctx):
        command.main(args=args, prog_name="install_edfs", obj={"root": None})
