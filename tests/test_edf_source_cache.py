"""The parse cache of the container sources (envlayers.edf.source_cache): a hit is the validated source of the
very same text, at the very same path, by the very same code; anything else is parsed.

Each test works on a copy of the repository's catalog and its own XDG_CACHE_HOME. A hit is told from a parse by
making the parse fail (``schema._validated`` replaced); a source from the cache must equal a fresh parse.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from envlayers import catalog_cache
from envlayers.edf import load_catalog, schema, source_cache
from envlayers.errors import EdfError

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def root(tmp_path, monkeypatch):
    dst = tmp_path / "cat"
    shutil.copytree(REPO / "experiments", dst / "experiments")
    shutil.copytree(REPO / "containers", dst / "containers")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("ENVLAYERS_NO_CACHE", raising=False)
    return dst


def source_file(root: Path, role: str = "vllm-mi300") -> Path:
    return root / schema.SOURCE_DIR / f"{role}.yaml"


def cache_path(root: Path, role: str = "vllm-mi300") -> Path:
    return Path(catalog_cache.cache_file(str(source_file(root, role)), source_cache.KIND))


def counting(monkeypatch) -> list:
    calls = []
    real = schema._validated
    monkeypatch.setattr(schema, "_validated", lambda *a: calls.append(a[2]) or real(*a))
    return calls


def fresh(root: Path, monkeypatch) -> dict:
    with monkeypatch.context() as m:
        m.setenv("ENVLAYERS_NO_CACHE", "1")
        return load_catalog(root)


def test_a_hit_equals_a_parse_and_skips_it(root, monkeypatch):
    first = load_catalog(root)
    assert all(cache_path(root, role).is_file() for role in first)
    monkeypatch.setattr(schema, "_validated", lambda *a: pytest.fail("parsed although the cache holds this text"))
    hit = load_catalog(root)
    assert hit == first
    for role, src in hit.items():
        assert (src.lines, src.file, type(src)) == (first[role].lines, first[role].file, schema.RoleSource)
        assert list(src.edf) == list(first[role].edf)  # the order the EDF is rendered in
    monkeypatch.undo()
    assert hit == fresh(root, monkeypatch)


def test_an_edit_is_parsed_for_real(root, monkeypatch):
    load_catalog(root)
    path = source_file(root)
    path.write_text(path.read_text().replace("entrypoint: false", "entrypoint: true"))
    calls = counting(monkeypatch)
    edited = load_catalog(root)
    assert calls == [f"{schema.SOURCE_DIR.as_posix()}/vllm-mi300.yaml"]
    assert edited["vllm-mi300"].edf["entrypoint"] is True
    assert edited == fresh(root, monkeypatch)


def test_an_error_after_a_cached_text_names_file_and_line(root):
    load_catalog(root)
    path = source_file(root)
    lines = path.read_text().splitlines(keepends=True)
    n = next(i for i, line in enumerate(lines) if line.startswith("engine:"))
    lines.insert(n + 1, "bogus: 1\n")
    path.write_text("".join(lines))
    for _ in range(2):  # an error is never cached: the second load fails the same way
        with pytest.raises(EdfError, match=rf"^containers/edfs/vllm-mi300.yaml:{n + 2}: bogus: unknown key"):
            load_catalog(root)


def test_a_source_moved_to_another_catalog_is_parsed_there(root, tmp_path, monkeypatch):
    load_catalog(root)
    other = tmp_path / "other"
    shutil.copytree(root, other)
    calls = counting(monkeypatch)
    assert load_catalog(other) == load_catalog(root)
    assert len(calls) == len(list((other / schema.SOURCE_DIR).glob("*.yaml")))  # each parsed once, in `other`


@pytest.mark.parametrize("damage", [
    pytest.param("not-json", id="not-json"),
    pytest.param("foreign-code", id="foreign-code"),
    pytest.param("other-path", id="other-path"),
    pytest.param("edf-value", id="edf-value-of-a-wrong-type"),
    pytest.param("lines", id="lines-not-pairs"),
    pytest.param("missing-key", id="missing-key"),
    pytest.param("fifo", id="a-fifo-does-not-block"),
])
def test_a_broken_or_foreign_cache_is_ignored_and_replaced(root, monkeypatch, damage):
    good = load_catalog(root)
    path = cache_path(root)
    data = json.loads(path.read_text())
    if damage == "not-json":
        path.write_text("{not json")
    elif damage == "fifo":
        path.unlink()
        os.mkfifo(path)
    else:
        if damage == "foreign-code":
            data["code"] = "another envlayers|" + data["code"]
        elif damage == "other-path":
            data["path"] = str(source_file(root, "vllm-mi200"))
        elif damage == "edf-value":
            data["source"]["edf"]["entrypoint"] = 0
        elif damage == "lines":
            data["source"]["lines"] = {"role": 1}
        elif damage == "missing-key":
            del data["source"]["engine"]
        path.write_text(json.dumps(data))
    calls = counting(monkeypatch)
    assert load_catalog(root) == good  # parsed, as if there were no cache
    assert load_catalog(root) == good  # and the cache is whole again: a hit
    assert calls == [f"{schema.SOURCE_DIR.as_posix()}/vllm-mi300.yaml"]


def test_no_cache_means_a_parse_every_time(root, monkeypatch, tmp_path):
    monkeypatch.setenv("ENVLAYERS_NO_CACHE", "1")
    calls = counting(monkeypatch)
    load_catalog(root)
    load_catalog(root)
    assert len(calls) == 2 * len(list((root / schema.SOURCE_DIR).glob("*.yaml")))
    assert not (tmp_path / "xdg").exists()


def test_the_fingerprint_names_existing_parsing_code():
    here = Path(source_cache.__file__).parents[1]
    assert all((here / name).is_file() for name in source_cache.CODE)
    assert str(here / "edf/schema.py") in catalog_cache.fingerprint(source_cache.CODE)


def test_a_dry_run_with_a_warm_cache_imports_no_yaml_click_or_jinja2(root, tmp_path):
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg"), "PYTHONPATH": str(REPO / "src"),
           "EDF_PATH": str(tmp_path)}
    env.pop("ENVLAYERS_NO_CACHE", None)
    code = ("import sys, atexit; atexit.register(lambda: sys.stderr.write("
            "'imported: ' + ' '.join(m for m in ('yaml', 'click', 'jinja2') if m in sys.modules)));"
            "from envlayers.cli import main; main()")
    runs = [subprocess.run([sys.executable, "-c", code, "--root", str(root), "serve", "--model", "glm53",
                            "--dry-run"], env=env, capture_output=True, text=True, timeout=60) for _ in range(2)]
    assert [r.returncode for r in runs] == [0, 0], runs[0].stderr
    assert runs[0].stderr.endswith("imported: yaml")  # a cold cache: parsed
    assert runs[1].stderr.endswith("imported: ")  # a warm one: nothing of the three
    assert runs[1].stdout == runs[0].stdout
