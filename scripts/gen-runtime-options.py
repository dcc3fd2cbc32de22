#!/usr/bin/env python3
"""Write src/envlayers/data/apptainer-options.json and pyxis-options.json from the two projects' own source.

Apptainer and Pyxis cannot be installed where the suite runs, so what envlayers renders for them is checked
against the option definitions their source declares, read from a git checkout of each:

    scripts/gen-runtime-options.py APPTAINER_GIT_DIR PYXIS_GIT_DIR [--rev-apptainer REV] [--rev-pyxis REV]
    scripts/gen-runtime-options.py ... --check     # exit 1 with a diff when the committed tables differ

(a bare clone is fine: the files are read with ``git show REV:PATH``; REV defaults to HEAD).

- Apptainer: every ``cmdline.Flag`` in cmd/internal/cli/action_flags.go (its ``Name``, ``ShortHand``, and the
  Go type of the variable its ``Value`` points at: ``bool`` takes no value, everything else one) that the
  file's ``init`` registers for ``exec`` (the ``actions`` and ``actions_instance`` command groups, which hold
  ExecCmd, or ExecCmd itself); and the prefix under which host variables pass into the container
  (``ApptainerEnvPrefix`` and the legacy ``LegacySingularityEnvPrefix`` in internal/pkg/util/env/env.go).
- Pyxis: every entry of the ``spank_opts`` table in args.c (name, the argument's description or none, and
  ``has_arg``: 1 takes a value, 0 none).

Deterministic: sorted keys, one trailing newline; written atomically.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "src" / "envlayers" / "data"
EXEC_GROUPS = {"actionsCmd", "actionsInstanceCmd", "ExecCmd"}


def show(git_dir: str, rev: str, path: str) -> str:
    return subprocess.run(["git", f"--git-dir={git_dir}", "show", f"{rev}:{path}"], check=True,
                          capture_output=True, text=True).stdout


def source_block(git_dir: str, rev: str, repo: str) -> dict:
    commit = subprocess.run(["git", f"--git-dir={git_dir}", "rev-parse", rev], check=True, capture_output=True,
                            text=True).stdout.strip()
    described = subprocess.run(["git", f"--git-dir={git_dir}", "describe", "--tags", commit], capture_output=True,
                               text=True).stdout.strip()
    return {"repo": repo, "commit": commit, "describe": described}


def apptainer_table(git_dir: str, rev: str) -> dict:
    flags_go = "cmd/internal/cli/action_flags.go"
    text = show(git_dir, rev, flags_go)
    types: dict[str, str] = {}
    for block in re.findall(r"^var \(\n(.*?)^\)", text, re.S | re.M):
        for name, kind in re.findall(r"^\s+(\w+)\s+([\w\[\]\.]+(?:\[\w+\]\w+)?)", block, re.M):
            types[name] = kind
    flags = {}
    for ident, body in re.findall(r"^var (\w+) = cmdline\.Flag\{\n(.*?)^\}", text, re.S | re.M):
        field = dict(re.findall(r"^\s+(\w+):\s+(.*?),?\s*$", body, re.M))
        name = field.get("Name", "").strip('"')
        value = field.get("Value", "").lstrip("&")
        flags[ident] = {"name": name, "short": field.get("ShortHand", "").strip('"') or None,
                        "type": types.get(value, "?"), "env_keys": re.findall(r'"(\w+)"', field.get("EnvKeys", ""))}
    registered = set()
    for ident, targets in re.findall(r"RegisterFlagForCmd\(&(\w+),\s*([^)]*)\)", text):
        words = {w.strip().rstrip(".") for w in targets.split(",")}
        if words & EXEC_GROUPS:
            registered.add(ident)
    options = {}
    for ident in sorted(registered):
        flag = flags.get(ident)
        if flag is None or not flag["name"]:
            continue
        options["--" + flag["name"]] = {"short": "-" + flag["short"] if flag["short"] else None,
                                       "takes_value": flag["type"] != "bool", "type": flag["type"],
                                       "env": ["APPTAINER_" + k for k in flag["env_keys"]]}
    env_go = "internal/pkg/util/env/env.go"
    env_text = show(git_dir, rev, env_go)
    prefixes = {}
    for const in ("ApptainerEnvPrefix", "LegacySingularityEnvPrefix"):
        m = re.search(rf'^\s*{const}\s*=\s*"(\w+)"', env_text, re.M)
        line = env_text[:m.start()].count("\n") + 1 if m else None
        prefixes[const] = {"value": m.group(1) if m else None, "at": f"{env_go}:{line}" if line else None}
    return {"source": source_block(git_dir, rev, "apptainer/apptainer"), "command": "exec",
            "flags_file": flags_go, "env_prefixes": prefixes, "options": options}


def pyxis_table(git_dir: str, rev: str) -> dict:
    text = show(git_dir, rev, "args.c")
    table = text[text.index("struct spank_option spank_opts[]"):text.index("SPANK_OPTIONS_TABLE_END")]
    options = {}
    for entry in re.findall(r"\{\s*(\".*?)\n\s*\}", table, re.S):
        m = re.match(r'"([\w-]+)",\s*(NULL|"[^"]*"),(.*),\s*(\d),\s*(\d),\s*(\w+)\s*$', entry, re.S)
        if not m:
            continue
        usage = " ".join(re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(3))).replace('\\"', '"')
        options["--" + m.group(1)] = {"arg": None if m.group(2) == "NULL" else m.group(2).strip('"'),
                                      "takes_value": m.group(4) == "1", "usage": usage}
    return {"source": source_block(git_dir, rev, "NVIDIA/pyxis"), "file": "args.c", "options": options}


def dump(data: dict) -> str:
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("apptainer")
    ap.add_argument("pyxis")
    ap.add_argument("--rev-apptainer", default="HEAD")
    ap.add_argument("--rev-pyxis", default="HEAD")
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)
    tables = {DATA / "apptainer-options.json": dump(apptainer_table(args.apptainer, args.rev_apptainer)),
              DATA / "pyxis-options.json": dump(pyxis_table(args.pyxis, args.rev_pyxis))}
    bad = 0
    for path, text in tables.items():
        if args.check:
            have = path.read_text() if path.exists() else ""
            if have != text:
                sys.stdout.writelines(difflib.unified_diff(have.splitlines(True), text.splitlines(True), str(path),
                                                           "from the sources"))
                bad = 1
            continue
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
        print(f"wrote {path.relative_to(REPO)}")
    return bad


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
