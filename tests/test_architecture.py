"""docs/architecture.md stays true: every module under src/envlayers is on the map, and the imports go
the way the map says (every import, those inside functions included). And the tests hold to their own
rules: each asserts something, and none imports another test module."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src" / "envlayers"
MAP = REPO / "docs" / "architecture.md"

# The layer of each top-level module or package, as docs/architecture.md places it. A name listed here
# that does not exist (yet) is harmless; a module that exists and is missing here fails
# test_every_top_level_module_has_a_layer, so a new module must be placed on the map.
LAYERS = {
    "base": {"errors", "defaults", "paths", "filetrust", "durations", "yamlpos", "jobid", "urls", "tail", "joblines"},
    "core": {"envfile", "layers", "catalog", "sites", "shell", "keys", "topology", "topology_checks", "engines",
             "runtimes", "edf", "jobscript", "scripttext", "weights", "exposure", "apikey", "allocation",
             "phases", "rootcause", "accounting"},
    "edge": {"slurm", "rundir", "http", "httpclient", "readiness", "fsutil", "edfinstall", "imagearchive", "job", "procgroup"},
    "injob": {"launch", "gateway_app", "fabric", "cores"},
    "operator": {"ops", "access", "diagnose", "verify", "bench", "batch"},
    "cli": {"cli"},
    "package": {"__init__", "__main__"},
}
LAYER_OF = {name: layer for layer, names in LAYERS.items() for name in names}

# Imports that break a rule today and are being moved (each to the run-directory module); remove an entry
# when its import goes. A new import that breaks a rule fails, whether or not its module is listed here.
PENDING: set[tuple[str, str]] = set()


def _modules() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if "__pycache__" not in p.parts)


def _name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts)


def _imports(path: Path) -> set[str]:
    """Every envlayers module ``path`` imports, anywhere in it (``from .x import y`` gives ``x.y`` when
    ``y`` is a module, else ``x``)."""
    name = _name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "envlayers"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "envlayers":
                continue
            for alias in node.names:
                sub = SRC.parent.joinpath(*f"{target}.{alias.name}".split("."))
                found.add(f"{target}.{alias.name}" if sub.with_suffix(".py").exists() or sub.is_dir() else target)
    return found


def _top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _edges() -> list[tuple[str, str]]:
    return sorted((_name(p), target) for p in _modules() for target in _imports(p))


def _mentions(path: Path) -> str:
    """How the map names a module: ``access/`` for a package, ``access/ping.py`` for a module in it."""
    rel = path.relative_to(SRC)
    if path.name == "__init__.py" and len(rel.parts) > 1:
        return "/".join(rel.parts[:-1]) + "/"
    return rel.as_posix()


def test_every_module_is_on_the_map():
    text = MAP.read_text()
    named = set(re.findall(r"^\| `([^`]+)` \|", text, re.M))  # the first cell of a row of a table
    missing = [_mentions(p) for p in _modules() if _mentions(p) not in named]
    assert not missing, f"docs/architecture.md does not name: {', '.join(missing)} (add a line saying what it owns)"


def test_every_name_on_the_map_is_in_the_code():
    # the map is the code both ways: a module deleted or renamed leaves no line behind
    named = set(re.findall(r"^\| `([^`]+)` \|", MAP.read_text(), re.M))
    src = Path(__file__).resolve().parents[1] / "src" / "envlayers"
    gone = sorted(n for n in named if not (src / n).exists())
    assert not gone, f"docs/architecture.md names what src/envlayers does not have: {', '.join(gone)}"


def test_every_top_level_module_has_a_layer():
    unplaced = sorted({_top(_name(p)) for p in _modules()} - LAYER_OF.keys())
    assert not unplaced, f"place {unplaced} in LAYERS and on docs/architecture.md"


def test_the_map_names_its_folders():
    text = MAP.read_text()
    for folder in ("templates/", "data/"):
        assert f"| `{folder}` |" in text


def _broken(rule) -> list[str]:
    return [f"{src} imports {dst}" for src, dst in _edges() if (src, dst) not in PENDING and rule(src, dst)]


def _layer(module: str) -> str:
    return LAYER_OF[_top(module)]


OPERATOR_OR_CLI = ("operator", "cli")


@pytest.mark.parametrize("rule_name, rule", [
    pytest.param("nothing outside cli imports cli",
                 lambda s, d: _layer(d) == "cli" and _layer(s) not in ("cli", "package"),
                 id="only-cli-imports-cli"),
    pytest.param("operator packages import nothing of launch",
                 lambda s, d: _layer(s) == "operator" and _top(d) == "launch",
                 id="operator-not-launch"),
    pytest.param("cli imports of launch only its entry point",
                 lambda s, d: _layer(s) == "cli" and _top(d) == "launch" and d != "envlayers.launch.launcher",
                 id="cli-only-launch-entry"),
    pytest.param("launch imports neither operator packages nor cli",
                 lambda s, d: _layer(s) == "injob" and _layer(d) in OPERATOR_OR_CLI,
                 id="injob-not-operator"),
    pytest.param("engines import no launch, edge, operator or cli module",
                 lambda s, d: _top(s) == "engines" and _layer(d) in ("injob", "edge", *OPERATOR_OR_CLI),
                 id="engines-pure"),
    pytest.param("the core imports nothing above it but slurm's argv builders and rundir's file names",
                 lambda s, d: _layer(s) == "core" and _layer(d) in ("injob", "edge", *OPERATOR_OR_CLI)
                 and d not in ("envlayers.slurm", "envlayers.rundir"),
                 id="core-below-edges"),
    pytest.param("the base imports only the base",
                 lambda s, d: _layer(s) == "base" and _layer(d) != "base",
                 id="base-alone"),
])
def test_import_direction(rule_name, rule):
    broken = _broken(rule)
    assert not broken, f"{rule_name} (docs/architecture.md): {'; '.join(broken)}"


def test_the_import_reader_sees_imports_inside_functions():
    """The rules are only as good as the reader: an import at the top (ping's errors), a relative one
    (release's job) and one only inside a function (access_cmds' access_format) are all seen."""
    edges = set(_edges())
    assert ("envlayers.access.ping", "envlayers.errors") in edges
    assert ("envlayers.access.release", "envlayers.access.job") in edges
    assert ("envlayers.cli.access_cmds", "envlayers.cli.access_format") in edges


def test_a_broken_rule_is_reported():
    """A rule that every import breaks lists them: the checker can fail."""
    assert _broken(lambda s, d: True)


def _asserting(src: str) -> bool:
    return "assert" in src or "raises(" in src or "fail(" in src


def test_every_test_asserts_something():
    """A test that only calls the code passes whatever the code returns: each test asserts, expects a raise,
    or calls a helper of its module that does."""
    silent = []
    for path in sorted((SRC.parents[1] / "tests").rglob("test_*.py")):
        tree = ast.parse(path.read_text(), str(path))
        helpers = {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("test_")
                   and _asserting(ast.unparse(n))}
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
                calls = {c.func.id for c in ast.walk(node) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}
                if not _asserting(ast.unparse(node)) and not calls & helpers:
                    silent.append(f"{path.relative_to(SRC.parents[1])}:{node.lineno} {node.name}")
    assert silent == []


# --- no two top-level packages or modules import each other, through any chain of imports -----------------

# Package cycles that exist and are being removed, each the set of top-level names that import one another
# (none now: access <-> ops went when both took a job from the one handle, envlayers/job.py). An entry that
# no longer forms a cycle fails the test, so it cannot outlive what it excuses.
ALLOWED_PACKAGE_CYCLES: list[frozenset[str]] = []


def _package_cycles(edges, key=_top) -> list[frozenset[str]]:
    """The groups of more than one top-level package or module (``key``: of a module, the node it belongs
    to) that reach each other through imports: the strongly connected components of the graph of ``edges``
    between those nodes (Tarjan's algorithm)."""
    graph: dict[str, set[str]] = {}
    for src, dst in edges:
        a, b = key(src), key(dst)
        graph.setdefault(a, set())
        graph.setdefault(b, set())
        if a != b:
            graph[a].add(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                cycles.append(frozenset(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def _cycle_imports(group: frozenset[str], edges) -> str:
    return "; ".join(sorted({f"{s} imports {d}" for s, d in edges if _top(s) in group and _top(d) in group
                             and _top(s) != _top(d)}))


def test_no_package_imports_itself_through_another():
    edges = _edges()
    cycles = _package_cycles(edges)
    new = [c for c in cycles if c not in ALLOWED_PACKAGE_CYCLES]
    assert not new, "packages that import each other: " + " | ".join(
        f"{' <-> '.join(sorted(c))}: {_cycle_imports(c, edges)}" for c in new)
    gone = [" <-> ".join(sorted(c)) for c in ALLOWED_PACKAGE_CYCLES if c not in cycles]
    assert not gone, f"no longer a cycle, remove it from ALLOWED_PACKAGE_CYCLES: {', '.join(gone)}"


def test_no_module_imports_itself_through_another():
    """The same finder, one node per module: no cycle at all, inside a package or across packages."""
    cycles = _package_cycles(_edges(), key=lambda module: module)
    assert not cycles, "modules that import each other: " + " | ".join(" <-> ".join(sorted(c)) for c in cycles)


@pytest.mark.parametrize("edges, cycles", [
    pytest.param([("envlayers.a.x", "envlayers.b"), ("envlayers.b", "envlayers.a.y")], [{"a", "b"}], id="two"),
    pytest.param([("envlayers.a", "envlayers.b.x"), ("envlayers.b.y", "envlayers.c"), ("envlayers.c", "envlayers.a")],
                 [{"a", "b", "c"}], id="three"),
    pytest.param([("envlayers.a.x", "envlayers.a.y"), ("envlayers.a.y", "envlayers.a.x"),
                  ("envlayers.a", "envlayers.b")], [], id="inside-one-package-only"),
    pytest.param([("envlayers.a", "envlayers.b"), ("envlayers.b", "envlayers.c")], [], id="one-way"),
])
def test_the_package_cycle_finder(edges, cycles):
    """The check can fail: a cycle through two or three packages is found; imports inside one package (the
    module check's business) or one way only are not a package cycle."""
    assert sorted(map(sorted, _package_cycles(edges))) == sorted(map(sorted, cycles))


def test_the_module_cycle_finder():
    edges = [("envlayers.a.x", "envlayers.a.y"), ("envlayers.a.y", "envlayers.a.x"), ("envlayers.a", "envlayers.b")]
    assert _package_cycles(edges, key=lambda module: module) == [frozenset({"envlayers.a.x", "envlayers.a.y"})]


# --- the pure layers (the base, the core) act on nothing: no process, no written file, no Slurm -----------

PURE = ("base", "core")
# Modules of a pure layer allowed to act, each with why; none today: what acts lives at the edges
# (fsutil.py, rundir.py, slurm.py, edfinstall.py, imagearchive.py), in launch/, or in the operator packages.
PURE_ALLOWED: dict[str, str] = {}

_OS_ACTS = {"system", "popen", "replace", "rename", "renames", "remove", "unlink", "rmdir", "removedirs", "mkdir",
            "makedirs", "symlink", "link", "truncate", "write", "chmod", "fchmod", "chown", "mkfifo", "fork",
            "posix_spawn", "posix_spawnp", "startfile"}
_OS_ACT_PREFIXES = ("exec", "spawn")
_SHUTIL_ACTS = {"copy", "copy2", "copyfile", "copytree", "copymode", "copystat", "copyfileobj", "move", "rmtree",
                "chown", "make_archive", "unpack_archive"}
_PATH_ACTS = {"write_text", "write_bytes", "mkdir", "unlink", "touch", "rmdir", "symlink_to", "hardlink_to", "chmod",
              "lchmod"}
_WRITE_FLAGS = {"O_WRONLY", "O_RDWR", "O_CREAT", "O_APPEND", "O_TRUNC"}
_FSUTIL_WRITERS = {"atomic_write", "write_output"}
_PROCESS_MODULES = {"subprocess", "multiprocessing", "pty"}
_TEMPFILE_WRITERS = {"mkstemp", "mkdtemp", "NamedTemporaryFile", "TemporaryFile", "SpooledTemporaryFile",
                     "TemporaryDirectory"}


def _slurm_runners() -> set[str]:
    """slurm.py's functions that run a Slurm command through their ``run`` parameter (its default: slurm.run)."""
    tree = ast.parse((SRC / "slurm.py").read_text())
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef)
            and any(a.arg == "run" for a in n.args.args + n.args.kwonlyargs)}


def _write_mode(node: ast.Call) -> bool:
    """Whether ``open(file, mode)`` or ``path.open(mode)`` opens for writing."""
    at = 0 if isinstance(node.func, ast.Attribute) else 1
    mode = node.args[at] if len(node.args) > at else next((k.value for k in node.keywords if k.arg == "mode"), None)
    return isinstance(mode, ast.Constant) and isinstance(mode.value, str) and bool(set(mode.value) & set("wax+"))


def _acts(source: str, filename: str = "<source>") -> list[str]:
    """Where ``source`` acts, as ``line: what``: imports subprocess (or another way to start processes), writes,
    moves or removes a file or folder (os, shutil, pathlib, ``open`` for writing, ``os.open`` with a writing flag,
    tempfile, fsutil's writers), or runs Slurm (slurm.run, or one of slurm's runners without a ``run=`` given)."""
    found = []
    runners = _slurm_runners()
    from_slurm: set[str] = set()
    for node in ast.walk(ast.parse(source, filename)):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Import):
            found += [f"{line}: imports {a.name}" for a in node.names if a.name.split(".")[0] in _PROCESS_MODULES]
        elif isinstance(node, ast.ImportFrom):
            module = (node.module or "").split(".")
            names = {a.name for a in node.names}
            if module[0] in _PROCESS_MODULES and not node.level:
                found.append(f"{line}: imports {node.module}")
            elif module[-1] == "fsutil" and names & _FSUTIL_WRITERS:
                found.append(f"{line}: imports fsutil's {', '.join(sorted(names & _FSUTIL_WRITERS))}")
            elif module[-1] == "slurm":
                from_slurm |= names & runners
                if "run" in names:
                    found.append(f"{line}: imports slurm.run")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "slurm" \
                and node.attr == "run":
            found.append(f"{line}: uses slurm.run")
        elif isinstance(node, ast.Call):
            func = node.func
            owner = func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else None
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            given_run = any(k.arg == "run" for k in node.keywords)
            if owner == "os" and (name in _OS_ACTS or name.startswith(_OS_ACT_PREFIXES)):
                found.append(f"{line}: os.{name}")
            elif owner == "os" and name == "open" and _WRITE_FLAGS & {n.attr for n in ast.walk(node)
                                                                        if isinstance(n, ast.Attribute)}:
                found.append(f"{line}: os.open for writing")
            elif owner == "shutil" and name in _SHUTIL_ACTS:
                found.append(f"{line}: shutil.{name}")
            elif owner == "tempfile" and name in _TEMPFILE_WRITERS:
                found.append(f"{line}: tempfile.{name}")
            elif owner == "fsutil" and name in _FSUTIL_WRITERS:
                found.append(f"{line}: fsutil.{name}")
            elif owner == "slurm" and name in runners and not given_run:
                found.append(f"{line}: slurm.{name} with slurm's own runner")
            elif isinstance(func, ast.Name) and name in from_slurm and not given_run:
                found.append(f"{line}: slurm's {name} with slurm's own runner")
            elif isinstance(func, ast.Attribute) and owner not in ("os", "shutil") and name in _PATH_ACTS:
                found.append(f"{line}: .{name}()")
            elif name == "open" and owner != "os" and _write_mode(node):
                found.append(f"{line}: open for writing")
    return found


def test_the_pure_layers_act_on_nothing():
    """docs/architecture.md: the base and the core are data in, data out. A module there that starts a
    process, writes a file or runs Slurm belongs at the edges (or hands the effect to its caller)."""
    acting = []
    for path in _modules():
        name = _name(path)
        if _layer(name) in PURE and name not in PURE_ALLOWED:
            acting += [f"{path.relative_to(SRC)}:{where}" for where in _acts(path.read_text(), str(path))]
    assert not acting, f"a pure layer acts (move it to an edge, or let its caller act): {'; '.join(acting)}"


def test_the_pure_allowances_name_pure_modules_that_act():
    stale = [name for name in PURE_ALLOWED
             if not (SRC.parent / name.replace(".", "/")).with_suffix(".py").exists()
             or not _acts((SRC.parent / name.replace(".", "/")).with_suffix(".py").read_text())]
    assert not stale, f"PURE_ALLOWED names a module that is gone or acts no more: {stale}"


@pytest.mark.parametrize("source, acts", [
    pytest.param("import subprocess", True, id="subprocess"),
    pytest.param("from subprocess import run", True, id="from-subprocess"),
    pytest.param("def f():\n    import subprocess\n    subprocess.run(['x'])", True, id="inside-a-function"),
    pytest.param("import os\nos.system('x')", True, id="os-system"),
    pytest.param("import os\nos.replace(a, b)", True, id="os-replace"),
    pytest.param("import os\nos.open(p, os.O_WRONLY | os.O_CREAT, 0o600)", True, id="os-open-write"),
    pytest.param("import shutil\nshutil.rmtree(p)", True, id="shutil-rmtree"),
    pytest.param("Path(p).write_text('x')", True, id="write-text"),
    pytest.param("p.write_bytes(b'x')", True, id="write-bytes"),
    pytest.param("p.mkdir(parents=True)", True, id="mkdir"),
    pytest.param("open(p, 'w')", True, id="open-w"),
    pytest.param("open(p, mode='a')", True, id="open-a"),
    pytest.param("p.open('x')", True, id="path-open-x"),
    pytest.param("from .fsutil import atomic_write", True, id="fsutil-writer"),
    pytest.param("from . import fsutil\nfsutil.write_output(p, t)", True, id="fsutil-attribute"),
    pytest.param("from . import slurm\nslurm.partition_max_times(['p'])", True, id="slurm-own-runner"),
    pytest.param("from . import slurm\nx = run or slurm.run", True, id="slurm-run"),
    pytest.param("open(p, 'rb')", False, id="open-read"),
    pytest.param("open(p)", False, id="open-default"),
    pytest.param("import os\nos.open(p, os.O_RDONLY)", False, id="os-open-read"),
    pytest.param("text.replace('a', 'b')", False, id="str-replace"),
    pytest.param("import shutil\nshutil.which('podman')", False, id="shutil-which"),
    pytest.param("import tempfile\ntempfile.gettempdir()", False, id="tempdir-name"),
    pytest.param("import tempfile\ntempfile.mkstemp()", True, id="mkstemp"),
    pytest.param("from . import slurm\nslurm.partition_max_times(['p'], run=run)", False, id="slurm-runner-given"),
    pytest.param("from .slurm import sbatch_argv\nsbatch_argv([])", False, id="slurm-argv"),
    pytest.param("from .filetrust import unsafe_folder", False, id="reads-stat"),
])
def test_what_counts_as_acting(source, acts):
    """The check can fail, and reading is not acting."""
    assert bool(_acts(source)) is acts, _acts(source)


def _imported_test_modules(src: str) -> list[str]:
    """The test modules (a name starting with test_, at any level of a dotted path) ``src`` imports, at its top
    or inside a function, by an import statement or by name (importlib.import_module, pytest.importorskip)."""
    found = []
    for node in ast.walk(ast.parse(src)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""] + [f"{node.module or ''}.{a.name}" for a in node.names]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("import_module", "importorskip") and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            names = [node.args[0].value]
        found += [n for n in names if any(part.startswith("test_") for part in n.split("."))]
    return found


def test_no_test_module_imports_another():
    """What tests share lives in helper modules (tests/*tools.py, tests/slurm/labtools.py, labruns.py) or in a
    conftest fixture, never in a test module: importing one runs its tests' module code and ties two files'
    meaning together."""
    tests = SRC.parents[1] / "tests"
    importing = [f"{path.relative_to(SRC.parents[1])}: {', '.join(names)}"
                 for path in sorted(tests.rglob("*.py"))
                 if (names := _imported_test_modules(path.read_text()))]
    assert importing == []


@pytest.mark.parametrize("src", [
    "import test_launch", "from test_launch import Clock", "from .test_pool import world",
    "from tests.test_ops import fake", "from tests import test_ops", "def f():\n    from test_verify import standins\n",
    "import importlib\nimportlib.import_module('test_ops')",
])
def test_an_import_of_a_test_module_is_seen(src):
    assert _imported_test_modules(src)


def test_helper_modules_are_not_taken_for_test_modules():
    assert _imported_test_modules("import launchtools\nfrom envlayers.launch import supervise\n"
                                  "from slurmtools import FakeSlurm\nimport pytest\n") == []
