"""The parse cache of experiments/setups.yaml (envlayers.catalog_cache): a hit is the parse of the very same
text by the very same code, and nothing else is ever used.

Each test works on a copy of the repository's catalog and its own XDG_CACHE_HOME. A hit is told from a parse
by making the parse fail (``catalog._parse`` replaced); the catalog from the cache must equal a fresh parse.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from envlayers import catalog, catalog_cache
from envlayers.errors import CatalogError

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def root(tmp_path, monkeypatch):
    dst = tmp_path / "cat"
    shutil.copytree(REPO / "experiments", dst / "experiments")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("ENVLAYERS_NO_CACHE", raising=False)
    return dst


def cache_path(root: Path) -> Path:
    return Path(catalog_cache.cache_file(str(root / catalog.SETUPS)))


def no_parse(monkeypatch):
    monkeypatch.setattr(catalog, "_parse", lambda *a: pytest.fail("parsed although the cache holds this text"))


def parsed(root: Path, monkeypatch) -> catalog.Catalog:
    """A fresh parse, the cache off."""
    with monkeypatch.context() as m:
        m.setenv("ENVLAYERS_NO_CACHE", "1")
        return catalog.load(root)


def test_a_hit_equals_a_parse_and_skips_it(root, monkeypatch):
    first = catalog.load(root)
    assert cache_path(root).is_file()
    no_parse(monkeypatch)
    hit = catalog.load(root)
    assert hit == first
    assert hit.models["glm53"].env == first.models["glm53"].env  # Assignments with their origins
    assert [type(e).__name__ for e in hit.models.values()] == ["Entry"] * len(hit.models)
    monkeypatch.undo()
    assert hit == parsed(root, monkeypatch)


def test_an_edit_is_parsed_for_real(root, monkeypatch):
    catalog.load(root)
    setups = root / catalog.SETUPS
    setups.write_text(setups.read_text() + "\n# an edit: a comment changes the text\n")
    calls = []
    real = catalog._parse
    monkeypatch.setattr(catalog, "_parse", lambda *a: calls.append(1) or real(*a))
    edited = catalog.load(root)
    assert calls == [1]
    assert edited == parsed(root, monkeypatch)


def test_an_error_after_a_cached_text_names_file_and_line(root, monkeypatch):
    catalog.load(root)
    setups = root / catalog.SETUPS
    text = setups.read_text()
    setups.write_text(text.replace("models:\n", "models:\n  bad name!: {}\n", 1))
    line = setups.read_text().splitlines().index("  bad name!: {}") + 1
    for _ in range(2):  # an error is never cached: the second load fails the same way
        with pytest.raises(CatalogError, match=rf"^experiments/setups.yaml:{line}: "):
            catalog.load(root)


def test_layer_file_models_are_found_on_every_load(root):
    before = catalog.load(root)
    assert "foo" not in before.models
    (root / "experiments/layers/model-foo.env").write_text("# foo: a model by its file alone\n")
    assert catalog.load(root).models["foo"].description == "foo: a model by its file alone"
    (root / "experiments/layers/model-foo.env").unlink()
    assert catalog.load(root) == before


@pytest.mark.parametrize("content", [
    pytest.param("{not json", id="not-json"),
    pytest.param("[]", id="a-list"),
    pytest.param('{"format": 1}', id="no-text"),
    pytest.param("\udcff", id="not-utf8"),
    pytest.param(None, id="foreign-code"),
    pytest.param(2, id="another-format"),
    pytest.param("fifo", id="a-fifo-does-not-block"),
    pytest.param("entries", id="text-and-code-right-entries-broken"),
])
def test_a_broken_or_foreign_cache_is_ignored_and_replaced(root, monkeypatch, content):
    good = catalog.load(root)
    path = cache_path(root)
    data = json.loads(path.read_text())
    if content is None:
        data["code"] = "another envlayers|" + data["code"]
        path.write_text(json.dumps(data))
    elif content == "fifo":
        path.unlink()
        os.mkfifo(path)
    elif content == 2:
        data["format"] = 2
        path.write_text(json.dumps(data))
    elif content == "entries":
        data["models"]["glm53"] = ["models", "glm53", ["experiments/setups.yaml", "7"]]
        path.write_text(json.dumps(data))
    else:
        path.write_bytes(content.encode("utf-8", "surrogateescape"))
    calls = []
    real = catalog._parse
    monkeypatch.setattr(catalog, "_parse", lambda *a: calls.append(1) or real(*a))
    assert catalog.load(root) == good  # parsed, as if there were no cache
    assert catalog.load(root) == good  # and the cache is whole again: a hit
    assert calls == [1]


def test_the_code_fingerprint_follows_the_parsing_code_and_pyyaml(tmp_path, monkeypatch):
    import yaml

    assert os.path.abspath(yaml.__file__) in catalog_cache.fingerprint()
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    for name in catalog_cache._CODE:
        shutil.copy(Path(catalog_cache.__file__).with_name(name), pkg / name)
    monkeypatch.setattr(catalog_cache, "__file__", str(pkg / "catalog_cache.py"))
    before = catalog_cache.fingerprint()
    for name in catalog_cache._CODE:
        st = os.stat(pkg / name)
        os.utime(pkg / name, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
        after = catalog_cache.fingerprint()
        assert after != before, name
        before = after


@pytest.mark.parametrize("how", [
    pytest.param("no-cache", id="ENVLAYERS_NO_CACHE=1"),
    pytest.param("unwritable", id="cache-folder-cannot-be-made"),
])
def test_no_cache_means_a_parse_every_time(root, monkeypatch, tmp_path, how):
    if how == "no-cache":
        monkeypatch.setenv("ENVLAYERS_NO_CACHE", "1")
        assert catalog_cache.cache_file(str(root / catalog.SETUPS)) is None
    else:
        blocker = tmp_path / "a-file"
        blocker.write_text("")
        monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))  # a file: no folder can be made under it
    calls = []
    real = catalog._parse
    monkeypatch.setattr(catalog, "_parse", lambda *a: calls.append(1) or real(*a))
    first = catalog.load(root)
    assert catalog.load(root) == first
    assert calls == [1, 1]
    assert not (tmp_path / "xdg").exists()


def test_the_cli_renders_the_same_with_and_without_the_cache(root, tmp_path):
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg"), "PYTHONPATH": str(REPO / "src")}
    env.pop("ENVLAYERS_NO_CACHE", None)

    def render(**extra):
        proc = subprocess.run([sys.executable, "-m", "envlayers", "--root", str(root), "render", "experiment:glm53"],
                              capture_output=True, text=True, env={**env, **extra})
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    written = render()  # a miss: parses and writes the cache
    assert cache_path(root).is_file()
    assert render() == written == render(ENVLAYERS_NO_CACHE="1")
