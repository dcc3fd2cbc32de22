#!/usr/bin/env python3
"""Write src/envlayers/data/sglang-choices.json from the real SGLang's own argument parser.

SGLang does not run here (its kernels need a GPU) and its package pulls CUDA builds, but its argument parser
loads without a GPU: scripts/real-vllm.sh puts the SGLang wheel (no dependencies) and the three modules its
parser imports beyond torch (orjson, IPython, traitlets) in ``VENV/sglang-parser``, beside the real vLLM's
CPU torch. Run:

    PYTHONPATH=VENV/sglang-parser VENV/bin/python scripts/gen-sglang-choices.py          # rewrite the table
    PYTHONPATH=VENV/sglang-parser VENV/bin/python scripts/gen-sglang-choices.py --check  # exit 1 and a diff

It builds the parser the way ``python -m sglang.launch_server`` does (``ServerArgs.add_cli_args`` on an
``argparse.ArgumentParser``) and writes, deterministic and atomically: ``choices``, the fixed argparse choices
of every option that has them (SGLang refuses any other value at parsing, exit 2), and ``options``, every
option string it accepts.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TABLE = REPO / "src" / "envlayers" / "data" / "sglang-choices.json"
GENERATED_BY = "scripts/gen-sglang-choices.py"


def parser() -> argparse.ArgumentParser:
    from sglang.srt.server_args import ServerArgs

    p = argparse.ArgumentParser(prog="sglang.launch_server")
    ServerArgs.add_cli_args(p)
    return p


def table() -> dict:
    p = parser()
    choices, options = {}, set()
    for action in p._actions:
        options.update(action.option_strings)
        if action.choices is not None and action.option_strings:
            names = sorted(str(c) for c in action.choices)
            for flag in action.option_strings:
                if flag.startswith("--"):
                    choices[flag] = names
    return {"engine": "sglang", "version": version("sglang"), "generated_by": GENERATED_BY,
            "choices": dict(sorted(choices.items())), "options": sorted(options)}


def text(data: dict) -> str:
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with the committed table; exit 1 on a difference")
    ap.add_argument("--output", type=Path, default=TABLE,
                    help=f"the table (default {TABLE.relative_to(REPO)}; a pinned release's is sglang-choices-X.Y.Z.json)")
    args = ap.parse_args()
    out = args.output
    new = text(table())
    if args.check:
        old = out.read_text(encoding="utf-8") if out.exists() else ""
        if old == new:
            return 0
        sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), new.splitlines(True), str(out), "fresh"))
        return 1
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=".sglang-choices.")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(new)
    os.chmod(tmp, 0o644)
    os.replace(tmp, out)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
