"""docs/architecture.md stays true: every module under src/envlayers is on the map, and the imports go
the way the map says (every import, those inside functions included)."""

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
    "base": {"errors", "defaults", "paths", "filetrust", "durations", "yamlpos", "jobid", "urls"},
    "core": {"envfile", "layers", "catalog", "sites", "shell", "keys", "topology", "topology_checks", "engines",
             "runtimes", "edf", "jobscript", "scripttext", "weights", "exposure", "apikey", "allocation",
             "phases", "rootcause", "accounting"},
    "edge": {"slurm", "rundir", "http", "httpclient", "readiness", "fsutil", "edfinstall", "imagearchive"},
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
