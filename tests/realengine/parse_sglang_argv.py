"""Ask the real SGLang's argument parser whether it takes each of a list of command lines (no model, no GPU).

Run with the real vLLM's interpreter and ``PYTHONPATH=VENV/sglang-parser`` (scripts/real-vllm.sh puts the
SGLang wheel and what its parser imports there); standard input is a JSON list of argv (the words after
``python3 -m sglang.launch_server``), the last line of standard output one JSON list of verdicts in the same
order: ``{"accepted": bool, "error": str | null}``. The parser is built as ``sglang.launch_server`` builds it
(``ServerArgs.add_cli_args``); a refusal is argparse's error line (SGLang exits 2 at parsing).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys


def main() -> None:
    from sglang.srt.server_args import ServerArgs

    argvs = json.load(sys.stdin)
    verdicts = []
    for argv in argvs:
        parser = argparse.ArgumentParser(prog="sglang.launch_server")
        ServerArgs.add_cli_args(parser)
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                parser.parse_args(argv)
            verdicts.append({"accepted": True, "error": None})
        except SystemExit:
            lines = [line for line in err.getvalue().splitlines() if ": error: " in line]
            verdicts.append({"accepted": False, "error": lines[-1] if lines else err.getvalue().strip()[-300:]})
    print(json.dumps(verdicts))


if __name__ == "__main__":
    main()
