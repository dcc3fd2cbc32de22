"""The click-free fast paths: the plain forms of ``render`` and of ``serve --dry-run``, answered without click.

Importing click costs a plain render or dry run more than its own work (docs/layers.md, "Start-up"). These
two forms are parsed here by hand:

- ``[--root R] render TARGET [--format F] [-o PATH]``;
- ``[--root R] serve --dry-run [--json] [--model M] [--experiment E] [--time T] [--base-env F] [--env-file F]``
  (each option also from its environment variable, as the click command reads it: what
  ``SUBMIT=0 cluster/serve-only.sbatch`` runs).

Each option at most once, as ``--opt VALUE`` or ``--opt=VALUE``, with a value that is not empty and does not
start with ``-``. Anything else (``--help``, an unknown or repeated option, ``--``, an empty or unusual
environment value, a path click would refuse), any error while answering, ``ENVLAYERS_DEBUG=1`` and shell
completion: :func:`answer` returns and the click group answers, so the output, the messages and the exit codes
are always the click path's (tests/test_cli_fastpath.py and tests/test_cli_fastpath_serve.py run tables of
command lines through both).
"""

from __future__ import annotations

import os
import sys

from ..defaults import DEFAULT_EXPERIMENT, DEFAULT_MODEL, DEFAULT_TIME

# click's shell completion is asked for through this variable (`_{PROG}_COMPLETE`)
_COMPLETE_VAR = "_ENV_LAYERS_COMPLETE"

_FORMATS = ("sh", "env", "json")

# the serve options the dry run reads: option -> (key, environment variable); defaults as serve_cmds has them
_SERVE_VALUES = {
    "--model": ("model", "MODEL"),
    "--experiment": ("experiment", "EXPERIMENT"),
    "--time": ("time", "SERVE_TIME"),
    "--base-env": ("base_env", "SERVE_BASE_ENV"),
    "--env-file": ("env_file", "SERVE_ENV_FILE"),
}
_SERVE_DEFAULTS = {"model": DEFAULT_MODEL, "experiment": DEFAULT_EXPERIMENT, "time": DEFAULT_TIME}
# flags of serve the dry run ignores, read from the environment by click: a value click reads as a boolean
# in every click version is passed over, any other value goes to click (which may refuse it)
_SERVE_FLAG_VARS = ("WAIT", "VERIFY")
_BOOLEAN_WORDS = frozenset({"0", "1", "true", "false", "yes", "no", "on", "off", "t", "f", "y", "n"})


def answer(args: list[str]) -> None:
    """Answer ``args`` without click and exit; return when the click group must answer."""
    if os.environ.get("ENVLAYERS_DEBUG") == "1" or _COMPLETE_VAR in os.environ:
        return
    plain = _plain_render(args)
    if plain is not None:
        _guarded(_render, *plain)
        return
    plain = _plain_serve_dry_run(args)
    if plain is not None:
        _guarded(_serve_dry_run, *plain)


def _guarded(fn, *args) -> None:
    try:
        fn(*args)
    except KeyboardInterrupt:  # as click's main says it
        sys.stderr.write("\nAborted!\n")
        sys.exit(1)


# -- parsing ------------------------------------------------------------------------------------------

def _parse(args: list[str], command: str, valued: dict[str, str], flags: dict[str, str]):
    """``[--root R] COMMAND ...`` -> (options by key, positional arguments), or None when not plain."""
    opts: dict[str, str] = {}
    rest = list(args)

    def take(table: dict[str, str]) -> bool:
        a = rest[0]
        for name, key in table.items():
            if a == name and len(rest) > 1:
                value, n = rest[1], 2
            elif name.startswith("--") and a.startswith(name + "="):
                value, n = a[len(name) + 1:], 1
            else:
                continue
            if key in opts or not value or value.startswith("-"):
                raise ValueError  # repeated, empty, or a value click might read otherwise
            opts[key] = value
            del rest[:n]
            return True
        return False

    positional: list[str] = []
    try:
        while rest and rest[0] != command:
            if not take({"--root": "root"}):
                return None
        if not rest:
            return None
        del rest[0]
        while rest:
            a = rest[0]
            if a in flags:
                if flags[a] in opts:
                    return None
                opts[flags[a]] = a
                del rest[0]
            elif take(valued):
                continue
            elif a.startswith("-"):
                return None
            else:
                positional.append(rest.pop(0))
    except ValueError:
        return None
    if not _path_ok(opts.get("root"), want_dir=True):
        return None
    return opts, positional


def _plain_render(args: list[str]) -> tuple[str | None, str, str, str | None] | None:
    """``[--root R] render TARGET [--format F] [-o PATH]`` -> (root, target, format, output), else None."""
    parsed = _parse(args, "render", {"--format": "format", "-o": "output", "--output": "output"}, {})
    if parsed is None:
        return None
    opts, positional = parsed
    if len(positional) != 1 or opts.get("format", "sh") not in _FORMATS:
        return None
    if not _path_ok(opts.get("output"), want_dir=False):
        return None
    return opts.get("root"), positional[0], opts.get("format", "sh"), opts.get("output")


def _plain_serve_dry_run(args: list[str]) -> tuple[str | None, dict[str, str | None], bool] | None:
    """``[--root R] serve --dry-run [--json] [options]`` -> (root, the options as serve reads them, json)."""
    valued = {name: key for name, (key, _) in _SERVE_VALUES.items()}
    parsed = _parse(args, "serve", valued, {"--dry-run": "dry_run", "--json": "json"})
    if parsed is None:
        return None
    opts, positional = parsed
    if positional or "dry_run" not in opts:
        return None
    for var in _SERVE_FLAG_VARS:
        value = os.environ.get(var)
        if value is not None and value.strip().lower() not in _BOOLEAN_WORDS:
            return None
    values: dict[str, str | None] = {}
    for name, (key, var) in _SERVE_VALUES.items():
        value = opts.get(key)
        if value is None:
            value = os.environ.get(var)
            if value == "":  # click reads an empty variable as unset; not every version did
                return None
        values[key] = value if value is not None else _SERVE_DEFAULTS.get(key)
    for key in ("base_env", "env_file"):  # click.Path(exists=True, dir_okay=False)
        if values[key] is not None and not _existing_file(values[key]):
            return None
    return opts.get("root"), values, "json" in opts


def _path_ok(value: str | None, want_dir: bool) -> bool:
    """What click.Path(file_okay=False) for --root, click.Path(dir_okay=False) for -o accept without a word."""
    if value is None:
        return True
    import stat

    try:
        st = os.stat(value)
    except OSError:
        return True  # a path that does not exist yet: click passes it on as given
    if stat.S_ISDIR(st.st_mode) != want_dir:
        return False
    return os.access(value, os.R_OK)


def _existing_file(value: str) -> bool:
    """What click.Path(exists=True, dir_okay=False) accepts without a word: it exists, is no folder, reads."""
    import stat

    try:
        st = os.stat(value)
    except OSError:
        return False
    return not stat.S_ISDIR(st.st_mode) and os.access(value, os.R_OK)


# -- answering ----------------------------------------------------------------------------------------

def _render(root_opt: str | None, target: str, fmt: str, output: str | None) -> None:
    try:
        from ..layers import load_env
        from ..paths import find_root
        from ..shell import render as render_env

        text = render_env(load_env(find_root(root_opt), target), fmt)
    except Exception:  # any error: the click path says it, in its words
        return
    if output:
        from . import errors_as_one_line
        from ..fsutil import write_output  # the click command's writer: the same file handling

        with errors_as_one_line():
            write_output(output, text)
        sys.exit(0)
    _emit(text)


def _serve_dry_run(root_opt: str | None, values: dict[str, str | None], as_json: bool) -> None:
    """What ``serve_cmds.serve`` prints for ``--dry-run`` (and ``--json``), through the same ``prepare``."""
    try:
        from pathlib import Path

        from ..jobscript import prepare
        from ..paths import find_root

        job = prepare(find_root(root_opt), values["model"], values["experiment"], time=values["time"],
                      base_env=Path(values["base_env"]) if values["base_env"] else None,
                      env_file=Path(values["env_file"]) if values["env_file"] else None, environ=dict(os.environ))
        if as_json:
            import json

            text = json.dumps(job.to_json(), indent=2) + "\n"
        else:
            text = job.dry_run_text()
    except Exception:  # any error: the click path says it, in its words
        return
    _emit(text)


def _emit(text: str) -> None:
    """Write ``text`` to stdout as ``click.echo(text, nl=False)`` would, and exit 0."""
    from . import errors_as_one_line

    out = sys.stdout
    encoding = getattr(out, "encoding", None) if out is not None else None
    if "\x1b" in text or not _plain_stream(encoding):
        import click  # click strips escape sequences off a non-terminal and mends an ASCII stdout: let it

        with errors_as_one_line():
            click.echo(text, nl=False)
        sys.exit(0)
    with errors_as_one_line():
        out.write(text)
        out.flush()
    sys.exit(0)


def _plain_stream(encoding: str | None) -> bool:
    """A stream click would write to as it is: it has an encoding, and not ASCII."""
    if not encoding:
        return False
    import codecs

    try:
        return codecs.lookup(encoding).name != "ascii"
    except LookupError:
        return True
