#!/usr/bin/env python3
"""Write src/envlayers/data/vllm-choices.json from the real vLLM's own argument parser.

Run with the real engine's interpreter (scripts/real-vllm.sh installs it and prints its path):

    VENV/bin/python scripts/gen-vllm-choices.py            # rewrite the table
    VENV/bin/python scripts/gen-vllm-choices.py --check    # exit 1 with a diff when the committed one differs

It builds the parser exactly as ``vllm`` does (vllm/entrypoints/cli/main.py: a FlexibleArgumentParser with
the ``serve`` subcommand's ``ServeSubcommand().subparser_init(subparsers)``, which is
vllm/entrypoints/launchers/cli_args.py's ``make_arg_parser``), without loading a model, and writes:

- ``options``: every option string ``vllm serve`` accepts (``--tensor-parallel-size``, ``-tp``, ``--no-...``
  of the boolean flags, ``-h``...). FlexibleArgumentParser also takes ``--snake_case`` spellings and
  ``--json-arg.key`` forms of these; those are spellings of the same options, not listed.
- ``choices``: the names three flags take. None of them has argparse ``choices`` in this version; each is
  checked after parsing, against a registry, before any weight is loaded:

  ``--tool-call-parser``: ``ToolParserManager.list_registered()`` (vllm/tool_parsers), the list
  ``validate_api_server_args`` (vllm/entrypoints/launchers/launcher.py) checks the name against when
  ``--enable-auto-tool-choice`` is given (without it the name is not checked at start-up). A name registered
  by a ``--tool-parser-plugin`` file is accepted too: plugins are outside the table.

  ``--reasoning-parser``: ``ReasoningParserManager.list_registered()`` (vllm/reasoning), the registry
  ``ReasoningParserManager.get_reasoning_parser`` looks the name up in while the engine config is made
  (``Reasoning parser 'nope' not found``). Names from a ``--reasoning-parser-plugin`` are outside the table.

  ``--distributed-executor-backend``: the ``DistributedExecutorBackend`` literal (vllm/config/parallel.py),
  the names ``Executor.get_class`` (vllm/v1/executor/abstract.py) knows. Any other value is taken as the
  dotted path of an Executor subclass to import (``resolve_obj_by_qualname``), a plugin too, outside the
  table: a bare word such as ``nope`` fails there.

Deterministic: sorted keys, sorted lists, one trailing newline; written atomically (a temporary file in the
same folder, then renamed).
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
import tempfile
import typing
from importlib.metadata import version
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TABLE = REPO / "src" / "envlayers" / "data" / "vllm-choices.json"
GENERATED_BY = "scripts/gen-vllm-choices.py"


def serve_parser():
    """``vllm serve``'s parser, built as the ``vllm`` command builds it (its serve subcommand only)."""
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    top = FlexibleArgumentParser(prog="vllm", description="vLLM CLI")
    subparsers = top.add_subparsers(required=False, dest="subparser")
    return ServeSubcommand().subparser_init(subparsers)


def table() -> dict:
    from vllm.config.parallel import DistributedExecutorBackend
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    parser = serve_parser()
    options = sorted({opt for action in parser._actions for opt in action.option_strings})
    choices = {
        "--tool-call-parser": sorted(ToolParserManager.list_registered()),
        "--reasoning-parser": sorted(ReasoningParserManager.list_registered()),
        "--distributed-executor-backend": sorted(typing.get_args(DistributedExecutorBackend)),
    }
    for flag in choices:
        assert flag in options, f"vllm serve has no {flag} any more"
    return {"engine": "vllm", "version": version("vllm"), "generated_by": GENERATED_BY, "choices": choices,
            "options": options}


def render(data: dict) -> str:
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 with a diff when the table differs from what the parser gives")
    ap.add_argument("--output", type=Path, default=TABLE, help=f"the table (default {TABLE.relative_to(REPO)})")
    args = ap.parse_args(argv)
    fresh = render(table())
    if args.check:
        try:
            committed = args.output.read_text(encoding="utf-8")
        except FileNotFoundError:
            committed = ""
        if committed == fresh:
            print(f"ok: {args.output} matches vLLM {version('vllm')}'s parser")
            return 0
        sys.stdout.writelines(difflib.unified_diff(committed.splitlines(True), fresh.splitlines(True),
                                                   str(args.output), "vllm's parser"))
        print(f"{args.output} differs from vLLM {version('vllm')}'s parser: rerun {GENERATED_BY} with the real "
              "engine's python", file=sys.stderr)
        return 1
    write_atomic(args.output, fresh)
    print(args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
