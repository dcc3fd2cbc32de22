"""The tests that keep one owner per concept: every line of src/envlayers that does by hand what one module owns."""

from __future__ import annotations

import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "envlayers"


def lines_matching(pattern: re.Pattern, allowed: set[str], examples: tuple[str, ...]) -> list[str]:
    """``path:line: text`` of each line of src/envlayers matching ``pattern``, outside the modules in ``allowed``
    (paths relative to the package) and skipping lines with any of ``examples`` (an example in a hint)."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel in allowed:
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if pattern.search(line) and not any(word in line for word in examples):
                found.append(f"{rel}:{n}: {line.strip()}")
    return found
