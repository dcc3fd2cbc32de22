#!/usr/bin/env bash
# Mutation testing of envlayers' pure modules: which small changes to the code does no test catch?
#
#   scripts/mutation.sh [--tests "PYTEST ARGS"] [--keep DIR] [MODULE[:FUNCTION] ...]
#
# MODULE is a path under src/envlayers/ (layers.py, shell.py, engines, ...); `:FUNCTION` (or
# `:Class.method`) keeps only the mutants inside that function, e.g. jobscript.py:ready_timeout_s.
# Without modules: envfile.py layers.py shell.py topology.py phases.py engines.
# The tests run for a module come from scripts/mutation.toml ([tests]; else tests/test_<name>.py);
# --tests replaces them for every module given. Prints, per module and in all, the mutants, the killed
# ones, the kill ratio, and each surviving mutant as a diff: each is a change no test notices.
#
# It installs the pinned mutation tester (cosmic-ray, see mutation.toml) into its own virtual
# environment under ${MUTATION_HOME:-${XDG_CACHE_HOME:-~/.cache}/envlayers-mutation}, and mutates a
# copy of the working tree (tracked and untracked, not ignored, files), never the checkout itself.
# The tests run with the interpreter that runs this script's `python3` (PYTHON=... to choose), which
# needs the project's test dependencies (scripts/test.sh installs them). It is slow (each mutant is a
# test run): it is not part of the normal suite. docs/testing.md says more.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/.." && pwd)"
config="$here/mutation.toml"
tests_override=""
keep=""
modules=()
while [ $# -gt 0 ]; do
  case "$1" in
    --tests) tests_override="$2"; shift 2 ;;
    --keep) keep="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "mutation.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) modules+=("$1"); shift ;;
  esac
done
[ ${#modules[@]} -gt 0 ] || modules=(envfile.py layers.py shell.py topology.py phases.py engines)

python="$(${PYTHON:-python3} -c 'import sys; print(sys.executable)')"
home="${MUTATION_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/envlayers-mutation}"
package="$("$python" -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["tool"]["package"])' "$config")"
venv="$home/venv-${package//[^A-Za-z0-9.]/-}"
if [ ! -x "$venv/bin/cosmic-ray" ]; then
  echo "mutation.sh: installing $package into $venv" >&2
  mkdir -p "$home"
  "$python" -m venv "$venv"
  if ! env -u PYTHONPATH "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$package" \
      >"$home/pip.log" 2>&1; then
    tail -20 "$home/pip.log" >&2
    rm -rf "$venv"
    exit 3
  fi
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/envlayers-mutation.XXXXXX")"
cleanup() { if [ -z "$keep" ]; then rm -rf "$work"; fi; }
trap cleanup EXIT
(cd "$repo" && git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf -) | tar -xf - -C "$work"
export PYTHONPATH="$work/src" PYTHONDONTWRITEBYTECODE=1 XDG_CACHE_HOME="$work/.cache"
unset ENVLAYERS_ROOT

# a filter: mutants inside type annotations are left out, as they change nothing at run time
# (`from __future__ import annotations`: `Origin | None` -> `Origin - None` is never evaluated)
cat >"$work/skip_annotations.py" <<'EOF'
import ast, sys
from cosmic_ray.work_db import use_db
from cosmic_ray.work_item import WorkerOutcome, WorkResult

def annotation_spans(path):
    spans = []
    for node in ast.walk(ast.parse(open(path).read())):
        notes = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            notes = [x.annotation for x in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg] if x]
            notes.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            notes = [node.annotation]
        spans += [((n.lineno, n.col_offset), (n.end_lineno, n.end_col_offset)) for n in notes if n is not None]
    return spans

with use_db(sys.argv[1]) as db:
    cache = {}
    for item in list(db.pending_work_items):
        for m in item.mutations:
            spans = cache.setdefault(m.module_path, annotation_spans(m.module_path))
            if any(a <= tuple(m.start_pos) and tuple(m.end_pos) <= b for a, b in spans):
                db.set_result(item.job_id, WorkResult(output="in a type annotation",
                                                      worker_outcome=WorkerOutcome.SKIPPED))
                break
EOF

sessions=()
for spec in "${modules[@]}"; do
  name="${spec%%:*}"
  func=""
  [ "$name" = "$spec" ] || func="${spec#*:}"
  tag="$(printf '%s' "$spec" | tr -c 'A-Za-z0-9._-' '_')"
  cfg="$work/mutation-$tag.toml"
  # the session's config: the module, its tests, the operators left out, and the function's lines
  (cd "$work" && "$python" - "$config" "$name" "$func" "$tests_override" "$python" >"$cfg" <<'EOF'
import ast, json, shlex, sys, tomllib
from pathlib import Path
config, name, func, override, python = sys.argv[1:]
conf = tomllib.load(open(config, "rb"))
path = Path("src/envlayers") / name.rstrip("/")
if not path.exists():
    sys.exit(f"mutation.sh: {path} not found (a MODULE is a path under src/envlayers/)")
stem = path.stem if path.is_file() else path.name
tests = shlex.split(override) if override else conf["tests"].get(name.rstrip("/"), [f"tests/test_{stem}.py"])
for t in tests:
    if not t.startswith("-") and not Path(t.split("::")[0]).exists():
        sys.exit(f"mutation.sh: no tests for {name}: {t} not found; name them with --tests")
command = shlex.join([python, "-m", "pytest", *conf["run"]["pytest-args"], *tests])
q = json.dumps  # a TOML basic string is a JSON string here (no control characters)
out = ["[cosmic-ray]", f"module-path = {q(str(path))}", f"timeout = {float(conf['run']['timeout'])}",
       "excluded-modules = []", f"test-command = {q(command)}", "", "[cosmic-ray.distributor]", 'name = "local"', "",
       "[cosmic-ray.filters.operators-filter]",
       "exclude-operators = [" + ", ".join(q(e) for e in conf["operators"]["exclude"]) + "]"]
if func:
    if not path.is_file():
        sys.exit(f"mutation.sh: {name}:{func}: a function can be named in a file only")
    scope, found = ast.parse(path.read_text()).body, None
    for part in func.split("."):
        found = next((n for n in scope if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                      and n.name == part), None)
        if found is None:
            sys.exit(f"mutation.sh: no function {func} in {path}")
        scope = found.body
    first = min([found.lineno] + [d.lineno for d in found.decorator_list])
    out += ["", "[cosmic-ray.filters.line-filter]", f"lines = {{ {q(str(path))} = [\"{first}-{found.end_lineno}\"] }}"]
print("\n".join(out))
EOF
  )
  session="$work/mutation-$tag.sqlite"
  echo "== $spec: $(sed -n 's/^test-command = //p' "$cfg")" >&2
  (
    cd "$work"
    "$venv/bin/cosmic-ray" init "$cfg" "$session"
    "$venv/bin/cr-filter-operators" "$session" "$cfg"
    "$venv/bin/python" "$work/skip_annotations.py" "$session"
    if [ "$name" != "$spec" ]; then "$venv/bin/cr-filter-lines" --config "$cfg" "$session"; fi
    if ! "$venv/bin/cosmic-ray" baseline "$cfg" >"$work/baseline-$tag.log" 2>&1; then
      echo "mutation.sh: the tests for $spec fail without any mutant; fix them first:" >&2
      tail -20 "$work/baseline-$tag.log" >&2
      exit 3
    fi
    "$venv/bin/cosmic-ray" exec "$cfg" "$session"
  )
  sessions+=("$spec=$session")
done

# the report: per module and in all, from each session's results
cat >"$work/report.py" <<'EOF'
import json, sys
totals, survivors = {}, []
for line in sys.stdin:
    spec, record = line.rstrip("\n").split("\t", 1)
    item, result = json.loads(record)
    result = result or {}
    t = totals.setdefault(spec, {"killed": 0, "survived": 0, "other": 0})
    if result.get("worker_outcome") == "skipped":  # left out by the operator or line filter
        continue
    test = result.get("test_outcome")
    if test in ("killed", "survived"):
        t[test] += 1
    else:  # incompetent (the mutant does not even import) or not run
        t["other"] += 1
    if test == "survived":
        for m in item["mutations"]:
            survivors.append((m["module_path"], m["start_pos"][0], m["operator_name"], result.get("diff") or ""))
for path, line, op, diff in survivors:
    print(f"SURVIVED {path}:{line} {op}")
    for d in diff.splitlines():
        if d[:1] in "+-" and not d.startswith(("+++", "---")):
            print(f"    {d}")
print()
print(f"{'module':<32} {'mutants':>7} {'killed':>7} {'survived':>8} {'other':>6} {'kill ratio':>10}")
all_k = all_s = 0
for spec, t in totals.items():
    k, s = t["killed"], t["survived"]
    all_k, all_s = all_k + k, all_s + s
    ratio = f"{k / (k + s):.1%}" if k + s else "-"
    print(f"{spec:<32} {k + s:>7} {k:>7} {s:>8} {t['other']:>6} {ratio:>10}")
ratio = f"{all_k / (all_k + all_s):.1%}" if all_k + all_s else "-"
print(f"{'all':<32} {all_k + all_s:>7} {all_k:>7} {all_s:>8} {'':>6} {ratio:>10}")
print("kill ratio = killed / (killed + survived); other = mutants that do not import or did not run")
EOF
for s in "${sessions[@]}"; do
  "$venv/bin/cosmic-ray" dump "${s#*=}" | sed "s|^|${s%%=*}\t|"
done | "$python" "$work/report.py"
