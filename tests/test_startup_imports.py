"""What `env_layers render` and `env_layers serve --dry-run` import, with warm parse caches: none of the modules
whose import alone costs a large part of their start-up budget (docs/layers.md, "Start-up"): dataclasses (which
brings inspect, ast and dis), typing, and the click, jinja2 and yaml packages. Each command runs as a real process
under ``python -X importtime``; a failure names the chain of module imports that brought the module in (one
imported inside a function, after start-up, stands alone).

The interpreter runs with ``-S``: an installation's ``.pth`` start-up hooks (certifi's is one) may import typing
before envlayers starts, which would hide an import of it here. The site-packages folders stay importable
through PYTHONPATH, so the commands find their dependencies as they do installed.
"""

from __future__ import annotations

import os
import site
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("dataclasses", "inspect", "ast", "typing", "click", "jinja2", "yaml")
MAIN = "from envlayers.cli import main; main()"


def imports(args: list[str], env: dict[str, str]) -> list[tuple[int, str]]:
    """(depth, module) of every module the command imported, in -X importtime's order (an import is listed
    after the imports it made, one level deeper)."""
    proc = subprocess.run([sys.executable, "-S", "-X", "importtime", "-c", MAIN, *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = []
    for line in proc.stderr.splitlines():
        if line.startswith("import time:") and not line.endswith("| imported package"):
            name = line.rsplit("|", 1)[1]
            rows.append(((len(name) - len(name.lstrip())) // 2, name.strip()))
    assert rows, proc.stderr[-2000:]
    return rows


def chain(rows: list[tuple[int, str]], i: int) -> str:
    """``a <- b <- c``: the module at row ``i`` and the modules that imported it, up to the top level."""
    depth, names = rows[i][0], [rows[i][1]]
    for d, name in rows[i + 1:]:
        if d < depth:
            depth = d
            names.append(name)
    return " <- ".join(names)


def heavy_imports(args: list[str], env: dict[str, str]) -> list[str]:
    rows = imports(args, env)
    return [chain(rows, i) for i, (_, name) in enumerate(rows) if name.split(".")[0] in HEAVY]


@pytest.fixture
def env(tmp_path):
    paths = [str(REPO / "src"), *site.getsitepackages(), site.getusersitepackages()]
    out = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "XDG_CACHE_HOME": str(tmp_path / "xdg"),
           "EDF_PATH": str(tmp_path / "edf")}
    for name in ("ENVLAYERS_NO_CACHE", "ENVLAYERS_DEBUG", "PYTHONDONTWRITEBYTECODE"):
        out.pop(name, None)
    return out


@pytest.mark.parametrize("args", [
    pytest.param(["render", "experiment:glm53"], id="render"),
    pytest.param(["render", "experiment:glm53", "-o", "{tmp}/render.sh"], id="render-to-a-file"),
    pytest.param(["serve", "--model", "glm53", "--dry-run"], id="dry-run-sglang-pipeline"),
    pytest.param(["serve", "--model", "oss120b", "--dry-run", "--json"], id="dry-run-vllm-json"),
    pytest.param(["serve", "--model", "oss20bdp", "--dry-run"], id="dry-run-vllm-data-parallel"),
    pytest.param(["serve", "--model", "llama405bray", "--dry-run"], id="dry-run-vllm-ray"),
    pytest.param(["serve", "--model", "llama405bgateway", "--dry-run"], id="dry-run-vllm-gateway"),
])
def test_a_warm_start_imports_none_of_the_heavy_modules(env, args, tmp_path):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    cold = heavy_imports(args, env)  # fills the parse caches
    assert any(c.startswith("yaml") for c in cold), cold  # the probe sees an import the command makes
    assert heavy_imports(args, env) == []


def test_the_probe_sees_the_click_path(env):
    """``--help`` is click's to answer: the probe sees click, and the chain of a module click imports."""
    found = heavy_imports(["render", "--help"], env)
    assert "click" in found and "click.core <- click" in found, found
