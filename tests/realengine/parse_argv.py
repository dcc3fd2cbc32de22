"""Ask the real vLLM whether it would start on each of a list of command lines, without loading a model.

Run with the real engine's interpreter; standard input is a JSON list of argv (each ``["vllm", "serve", ...]``,
the leading ``vllm`` optional), the last line of standard output one JSON list of verdicts in the same order (vLLM may log above it):
``{"accepted": bool, "stage": "argparse" | "validate" | "config" | null, "error": str | null}``.

    VENV/bin/python tests/realengine/parse_argv.py < argvs.json

Each command line goes through what ``vllm serve`` runs before it reads the model, with vLLM's own code:

- ``argparse``: the ``vllm`` command's parser (vllm/entrypoints/cli/main.py: a FlexibleArgumentParser with the
  serve subcommand), its error line (``vllm serve: error: ...``, exit 2);
- ``validate``: ``ServeSubcommand.validate`` (``validate_parsed_serve_args``: ``--enable-auto-tool-choice``
  needs ``--tool-call-parser``, ...) and, on a rank that serves the API (not ``--headless``),
  ``validate_api_server_args``, which ``setup_server`` calls before the engine starts (the tool call
  parser, with auto tool choice, must be registered);
- ``config``: the two lookups the engine config makes of what it was given, which need the model's files
  for everything else: ``ReasoningParserManager.get_reasoning_parser`` for ``--reasoning-parser``
  (``Reasoning parser 'nope' not found``), and for ``--distributed-executor-backend`` what
  ``Executor.get_class`` does with a name (one of the ``DistributedExecutorBackend`` literal, else the dotted
  path of an Executor subclass, imported: ``nope`` is no such path).
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import traceback
import typing


def parser():
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    top = FlexibleArgumentParser(prog="vllm", description="vLLM CLI")
    top.add_argument("-v", "--version", action="version", version="vllm")
    subparsers = top.add_subparsers(required=False, dest="subparser")
    cmd = ServeSubcommand()
    cmd.subparser_init(subparsers).set_defaults(dispatch_function=cmd.cmd)
    return top, cmd


def _error_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if ": error: " in line]
    return (errors or lines or ["(no message)"])[-1]


def _exception_line(exc: BaseException) -> str:
    return traceback.format_exception_only(type(exc), exc)[-1].strip()


def executor_backend(name: str) -> None:
    """What ``Executor.get_class`` does with a backend given by name, short of importing the executor."""
    from vllm.config.parallel import DistributedExecutorBackend
    from vllm.utils.import_utils import resolve_obj_by_qualname
    from vllm.v1.executor.abstract import Executor

    if name in typing.get_args(DistributedExecutorBackend):
        return
    cls = resolve_obj_by_qualname(name)
    if not (isinstance(cls, type) and issubclass(cls, Executor)):
        raise TypeError(f"distributed_executor_backend must be a subclass of Executor. Got {cls}.")


def verdict(top, cmd, argv: list[str]) -> dict:
    words = list(argv[1:] if argv[:1] == ["vllm"] else argv)
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            args = top.parse_args(words)
    except SystemExit as exc:
        if exc.code in (0, None):  # --help, --version
            return {"accepted": True, "stage": None, "error": None}
        return {"accepted": False, "stage": "argparse", "error": _error_line(err.getvalue())}
    from vllm.entrypoints.launchers.launcher import validate_api_server_args
    from vllm.reasoning import ReasoningParserManager

    try:
        cmd.validate(args)
        if not args.headless:
            validate_api_server_args(args)
    except Exception as exc:  # noqa: BLE001 - the engine's own refusal, as it would end the process
        return {"accepted": False, "stage": "validate", "error": _exception_line(exc)}
    try:
        if args.reasoning_parser:
            ReasoningParserManager.get_reasoning_parser(args.reasoning_parser)
        if args.distributed_executor_backend is not None:
            executor_backend(args.distributed_executor_backend)
    except Exception as exc:  # noqa: BLE001
        return {"accepted": False, "stage": "config", "error": _exception_line(exc)}
    return {"accepted": True, "stage": None, "error": None}


def main() -> int:
    argvs = json.load(sys.stdin)
    top, cmd = parser()
    verdicts = [verdict(top, cmd, argv) for argv in argvs]
    sys.stdout.write("\n" + json.dumps(verdicts) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
