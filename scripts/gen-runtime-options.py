#!/usr/bin/env python3
"""Write src/envlayers/data/apptainer-options.json and pyxis-options.json from the two projects' own source.

Apptainer and Pyxis cannot be installed where the suite runs, so what envlayers renders for them is checked
against the option definitions their source declares, read from a git checkout of each:

    scripts/gen-runtime-options.py APPTAINER_GIT_DIR PYXIS_GIT_DIR [--rev-apptainer REV] [--rev-pyxis REV]
    scripts/gen-runtime-options.py ... --check     # exit 1 with a diff when the committed tables differ

(a bare clone is fine: the files are read with ``git show REV:PATH``; REV defaults to HEAD). Each table's
``source`` names the repository, the commit, the newest tag that commit contains (``tag``) and
``git describe --tags`` of it (``describe``: the tag itself for a release, ``TAG-N-gHASH`` past one).

- Apptainer: every ``cmdline.Flag`` of the ``cli`` package (cmd/internal/cli/*.go) that a
  ``RegisterFlagForCmd`` call registers for ``exec``: with the ``actions`` or ``actions_instance`` command
  group of action_flags.go's ``init`` (both hold ExecCmd), or ExecCmd itself. Flags defined in another file
  of the package count too (apptainer.go's ``--tmpdir``, ``--authfile``, ``--docker-*``...). For each: its
  ``Name``, ``ShortHand``, ``Usage``, the pflag kind, ``Hidden``, ``Deprecated``, the variables it is read from
  (``EnvKeys`` under the ``APPTAINER_`` prefix, and bare when ``WithoutPrefix``) and where it is defined.
  The kind is what pkg/cmdline/flag.go's ``registerFlagForCmd`` picks by the Go type of ``DefaultValue``:
  ``bool`` takes no value (pflag also takes ``--flag=VALUE`` for one of strconv.ParseBool's spellings,
  ``bool_values``); ``string``, ``stringSlice`` (``[]string``: split at commas), ``stringArray``
  (``cmdline.StringArray``: one value per use), ``stringToString``, ``int``, ``uint32`` take one. Also the
  prefixes of internal/pkg/util/env/env.go: ``env_prefix`` (``ApptainerEnvPrefix``, the prefix under which a
  host variable passes into the container), ``legacy_env_prefix`` (``LegacySingularityEnvPrefix``) and
  ``flag_env_prefix`` (``ApptainerPrefix``, the flags' own variables), each with the line it is defined at.
- Pyxis: every entry of the ``spank_opts`` table in args.c (name, the argument's description or none,
  ``has_arg``: 1 takes a value, 0 none, the help text, the callback and the ``val`` it is called with, the
  line; two options of one callback with different vals are the two sides of one switch, which Pyxis
  refuses together) and the ``PYXIS_CONTAINER_*`` variables
  ``pyxis_args_check_environment_variables`` hands to the same callback (a boolean variable sets either
  option of a pair: ``PYXIS_CONTAINER_ENTRYPOINT=0`` is ``--no-container-entrypoint``).

A flag whose kind cannot be told, or a table that comes out empty, stops the script: the source changed
shape and the parsing here needs a look. Deterministic: sorted keys, one trailing newline; written
atomically.
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
CLI = "cmd/internal/cli"
# the names RegisterFlagForCmd's targets take in action_flags.go's init when they include ExecCmd
EXEC_GROUPS = {"actionsCmd", "actionsInstanceCmd", "ExecCmd"}
ENV_GO = "internal/pkg/util/env/env.go"
# pkg/cmdline/flag.go registerFlagForCmd: the Go type of DefaultValue -> the pflag kind it registers
GO_KINDS = {"bool": "bool", "string": "string", "[]string": "stringSlice", "cmdline.StringArray": "stringArray",
            "StringArray": "stringArray", "map[string]string": "stringToString", "int": "int", "uint32": "uint32"}
# pflag's boolValue.Set is strconv.ParseBool: the spellings `--flag=VALUE` of a bool flag takes
PARSE_BOOL = ["0", "1", "F", "FALSE", "False", "T", "TRUE", "True", "f", "false", "t", "true"]


class SourceChanged(SystemExit):
    def __init__(self, what: str):
        super().__init__(f"gen-runtime-options: {what}; the source changed shape, read it and adjust this script")


def git(git_dir: str, *args: str, check: bool = True) -> str:
    return subprocess.run(["git", f"--git-dir={git_dir}", *args], check=check, capture_output=True,
                          text=True).stdout


def show(git_dir: str, rev: str, path: str) -> str:
    return git(git_dir, "show", f"{rev}:{path}")


def line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def source_block(git_dir: str, rev: str, repo: str) -> dict:
    commit = git(git_dir, "rev-parse", f"{rev}^{{commit}}").strip()
    tag = git(git_dir, "describe", "--tags", "--abbrev=0", commit, check=False).strip() or None
    described = git(git_dir, "describe", "--tags", commit, check=False).strip() or None
    return {"repo": repo, "commit": commit, "tag": tag, "describe": described}


def go_var_types(text: str) -> dict[str, str]:
    """``name -> Go type`` of the package-level ``var ( ... )`` blocks of one file."""
    types: dict[str, str] = {}
    for block in re.findall(r"^var \(\n(.*?)^\)", text, re.S | re.M):
        for name, kind in re.findall(r"^\s+(\w+)\s+([\w\[\]\.]+)", block, re.M):
            types[name] = kind
    return types


def default_kind(default: str, value: str, var_types: dict[str, str]) -> str | None:
    """The pflag kind of a flag, from its ``DefaultValue`` expression, else from the type of ``*Value``."""
    default = re.sub(r"\s*//.*$", "", default).strip().rstrip(",")
    if default in ("true", "false"):
        return "bool"
    if default.startswith('"') or default.startswith("`"):
        return "string"
    for prefix, kind in (("cmdline.StringArray{", "stringArray"), ("StringArray{", "stringArray"),
                         ("[]string{", "stringSlice"), ("map[string]string{", "stringToString"),
                         ("uint32(", "uint32")):
        if default.startswith(prefix):
            return kind
    if re.fullmatch(r"-?\d+", default):
        return "int"
    return GO_KINDS.get(var_types.get(value.lstrip("&"), ""))


def apptainer_prefixes(git_dir: str, rev: str) -> dict:
    text = show(git_dir, rev, ENV_GO)
    out = {}
    for key, const in (("env_prefix", "ApptainerEnvPrefix"), ("legacy_env_prefix", "LegacySingularityEnvPrefix"),
                       ("flag_env_prefix", "ApptainerPrefix")):
        m = re.search(rf'^\s*{const}\s*=\s*"(\w+)"', text, re.M)
        if not m:
            raise SourceChanged(f"no {const} in {ENV_GO}")
        out[key] = {"const": const, "value": m.group(1), "at": f"{ENV_GO}:{line_of(text, m.start(1))}"}
    return out


def apptainer_table(git_dir: str, rev: str) -> dict:
    files = sorted(f for f in git(git_dir, "ls-tree", "--name-only", f"{rev}:{CLI}").split()
                   if f.endswith(".go") and not f.endswith("_test.go"))
    texts = {f"{CLI}/{f}": show(git_dir, rev, f"{CLI}/{f}") for f in files}
    var_types: dict[str, str] = {}
    for text in texts.values():
        var_types.update(go_var_types(text))
    flags: dict[str, dict] = {}
    registered: set[str] = set()
    for path, text in texts.items():
        for m in re.finditer(r"^var (\w+) = cmdline\.Flag\{\n(.*?)^\}", text, re.S | re.M):
            field = dict(re.findall(r"^\s+(\w+):\s+(.*?)\s*$", m.group(2), re.M))
            name = field.get("Name", "").rstrip(",").strip('"')
            short = field.get("ShortHand", "").rstrip(",").strip('"')
            deprecated = re.match(r'"(.*)"', field.get("Deprecated", ""))
            flags[m.group(1)] = {
                "name": name, "short": short or None, "at": f"{path}:{line_of(text, m.start())}",
                "kind": default_kind(field.get("DefaultValue", ""), field.get("Value", "").rstrip(","), var_types),
                "env_keys": re.findall(r'"(\w+)"', field.get("EnvKeys", "")),
                "without_prefix": field.get("WithoutPrefix", "").rstrip(",") == "true",
                "hidden": field.get("Hidden", "").rstrip(",") == "true",
                "usage": "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', field.get("Usage", ""))).replace('\\"', '"'),
                "deprecated": deprecated.group(1) if deprecated else None}
        for ident, targets in re.findall(r"RegisterFlagForCmd\(&(\w+),\s*([^)]*)\)", text):
            if {w.strip().removesuffix("...") for w in targets.split(",")} & EXEC_GROUPS:
                registered.add(ident)
    prefixes = apptainer_prefixes(git_dir, rev)
    flag_prefix = prefixes["flag_env_prefix"]["value"]
    options = {}
    for ident in sorted(registered):
        flag = flags.get(ident)
        if flag is None or not flag["name"]:
            raise SourceChanged(f"{ident} is registered for exec but its cmdline.Flag was not found in {CLI}")
        if flag["kind"] is None:
            raise SourceChanged(f"the kind of --{flag['name']} ({flag['at']}) cannot be told")
        env = [flag_prefix + k for k in flag["env_keys"]] + (flag["env_keys"] if flag["without_prefix"] else [])
        if "--" + flag["name"] in options:
            raise SourceChanged(f"two flags named --{flag['name']} are registered for exec")
        options["--" + flag["name"]] = {"short": "-" + flag["short"] if flag["short"] else None,
                                       "kind": flag["kind"], "takes_value": flag["kind"] != "bool", "env": env,
                                       "hidden": flag["hidden"], "deprecated": flag["deprecated"],
                                       "usage": flag["usage"], "at": flag["at"]}
    if not options:
        raise SourceChanged(f"no flag of {CLI} is registered for exec")
    pflag = re.search(r"^\s*github\.com/spf13/pflag\s+(\S+)", show(git_dir, rev, "go.mod"), re.M)
    return {"source": source_block(git_dir, rev, "apptainer/apptainer"), "command": "exec", **prefixes,
            "bool_values": {"values": PARSE_BOOL,
                            "why": f"github.com/spf13/pflag {pflag.group(1) if pflag else '?'} (go.mod): a bool "
                                   "flag's --flag=VALUE is strconv.ParseBool(VALUE)"},
            "options": options}


def pyxis_table(git_dir: str, rev: str) -> dict:
    text = show(git_dir, rev, "args.c")
    begin = text.index("struct spank_option spank_opts[]")
    table = text[begin:text.index("SPANK_OPTIONS_TABLE_END", begin)]
    env_fn = text[text.index("void pyxis_args_check_environment_variables"):]
    env_fn = env_fn[:env_fn.index("\n}\n")]
    env_by_cb: dict[str, list[str]] = {}
    for var, body in re.findall(r'get_env_var\(sp, "(PYXIS_\w+)"[^;]*;(.*?)(?=get_env_var\(|\Z)', env_fn, re.S):
        cb = re.search(r"\b(spank_option_\w+)\(", body)
        if cb:
            env_by_cb.setdefault(cb.group(1), []).append(var)
    options = {}
    for m in re.finditer(r"\{\s*(\".*?)\n\s*\}", table, re.S):
        entry = re.match(r'"([\w-]+)",\s*(NULL|"[^"]*"),(.*),\s*(\d),\s*(-?\d+),\s*(\w+)\s*$', m.group(1), re.S)
        if not entry:
            raise SourceChanged(f"args.c:{line_of(text, begin + m.start())}: an spank_opts entry not understood")
        usage = "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', entry.group(3))).replace('\\"', '"')
        options["--" + entry.group(1)] = {
            "arg": None if entry.group(2) == "NULL" else entry.group(2).strip('"'),
            "takes_value": entry.group(4) == "1", "usage": usage, "callback": entry.group(6),
            "val": int(entry.group(5)),
            "env": sorted(env_by_cb.get(entry.group(6), [])), "at": f"args.c:{line_of(text, begin + m.start(1))}"}
    if not options:
        raise SourceChanged("no entry in args.c's spank_opts")
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
