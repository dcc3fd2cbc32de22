"""The ``env_layers`` command line: the entry point and its click group.

Commands live in small modules that are imported only when their command runs, so
``env_layers render`` does not pay for tomli-w or HTTP code. click itself is imported only when
the click group is needed: the plain forms of ``render`` and of ``serve --dry-run`` are answered
without it (:mod:`.fastpath`), and every other command line, ``--help``, every error and every
doubt go to the click group, so the output, the messages and the exit codes are the click path's.
The cyclic garbage collector is paused while a command that parses layer stacks runs: those
objects form no cycles, and the collector's passes over them grew the cost per assignment with
the size of the stack.
"""

from __future__ import annotations

import os
import sys

from ..errors import EnvLayersError

# command name -> (module, attribute, one-line help shown in `env_layers --help`)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "render": ("layers_cmds", "render", "Print the merged environment of EXPERIMENT:MODEL."),
    "explain": ("layers_cmds", "explain", "Show every key's value, where it was set and what it overrode."),
    "check": ("layers_cmds", "check", "Verify committed .env.<setup> renders are up to date."),
    "list": ("layers_cmds", "list_cmd", "List experiments and models."),
    "install-edfs": ("edf_cmds", "install_edfs", "Install the catalog's container definitions (EDFs)."),
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
    "bench": ("bench_cmds", "bench", "Load a live endpoint: throughput and latency at several concurrencies."),
    "images": ("images_cmds", "images", "Save or load a pinned podman image to or from shared storage."),
}

# commands that parse a layer stack and end: the cyclic GC is paused while they run (the long-running
# ones, launch's supervision loop, wait, logs --follow, keep it)
_GC_PAUSED = frozenset({"render", "explain", "check", "list", "plan", "serve"})

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
        import click

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
    import importlib.util

    module = COMMANDS[name][0]
    spec = importlib.util.find_spec(f"{__name__}.{module}")
    return spec is not None


def _build_click_group():
    """The click group and its class, built on first use (``from envlayers.cli import cli``)."""
    import importlib

    import click

    class LazyGroup(click.Group):
        """A group whose subcommands are imported on first use."""

        def list_commands(self, ctx: click.Context) -> list[str]:
            return [name for name in COMMANDS if _available(name)]

        def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
            if name not in COMMANDS or not _available(name):
                return None
            module, attr, _ = COMMANDS[name]
            return getattr(importlib.import_module(f"{__name__}.{module}"), attr)

        def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
            rows = [(name, COMMANDS[name][2]) for name in self.list_commands(ctx)]
            if rows:
                with formatter.section("Commands"):
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
          SUBMIT=0 cluster/serve-only.sbatch          # what a submission would run
        """
        ctx.obj = {"root": root}

    return LazyGroup, cli


def __getattr__(name: str):
    if name in ("cli", "LazyGroup"):
        g = globals()
        g["LazyGroup"], g["cli"] = _build_click_group()
        return g[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def get_root(ctx):
    from ..paths import find_root

    obj = ctx.find_root().obj or {}
    return find_root(obj.get("root"))  # None: ENVLAYERS_ROOT, then upward from the cwd


class _gc_paused:  # noqa: N801
    """Pause the cyclic garbage collector, and restore its state after (for in-process callers)."""

    def __init__(self, paused: bool = True):
        self.paused = paused

    def __enter__(self):
        import gc

        self.was_enabled = gc.isenabled()
        if self.paused:
            gc.disable()

    def __exit__(self, *exc) -> bool:
        import gc

        if self.was_enabled:
            gc.enable()
        return False


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else list(argv)
    with _gc_paused(_command_of(args) in _GC_PAUSED):
        from .fastpath import answer

        answer(args)  # returns only when the click path must answer
        cli_group = __getattr__("cli")
        cli_group.main(args=args, prog_name="env_layers")


def _command_of(args: list[str]) -> str | None:
    """The subcommand's name, skipping the group's own options (only --root takes a value)."""
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--root":
            i += 2
        elif a.startswith("-"):
            i += 1
        else:
            return a
    return None


def install_edfs_main(argv: list[str] | None = None) -> None:
    """The ``install_edfs`` console script: ``env_layers install-edfs`` under its own name."""
    import click

    cli_group = __getattr__("cli")
    args = sys.argv[1:] if argv is None else argv
    ctx = click.Context(cli_group, obj={"root": None})  # --root comes from ENVLAYERS_ROOT or the cwd
    command = cli_group.get_command(ctx, "install-edfs")
    with errors_as_one_line(ctx):
        command.main(args=args, prog_name="install_edfs", obj={"root": None})
