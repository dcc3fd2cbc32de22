"""The shared YAML reader: lines for every key path, one error format, hostile input refused, the same
with libyaml's parser and with PyYAML's pure-Python one."""

from __future__ import annotations

import pytest

from envlayers import yamlpos
from envlayers.errors import CatalogError

LOADERS = [pytest.param(True, id="libyaml"), pytest.param(False, id="pure-python")]

TEXT = """\
top:
  list:
    - a
    - {b: 1}
  key: "v"
"""


@pytest.mark.parametrize("libyaml", LOADERS)
def test_every_key_path_has_its_line_and_the_data_is_plain(libyaml):
    doc = yamlpos.parse(TEXT, "f.yaml", CatalogError, loader=yamlpos._compose_class(libyaml))
    assert doc.lines == {(): 1, ("top",): 1, ("top", "list"): 2, ("top", "list", 0): 3, ("top", "list", 1): 4,
                         ("top", "list", 1, "b"): 4, ("top", "key"): 5}
    assert doc.data() == {"top": {"list": ["a", {"b": 1}], "key": "v"}}


@pytest.mark.parametrize("libyaml", LOADERS)
@pytest.mark.parametrize("text, message", [
    pytest.param("a: 1\nb: &x [1]\nc: *x\n", "f.yaml:2: anchor &x is not allowed; hint: write the value out",
                 id="anchor"),
    pytest.param("a: 1\nc: *x\n", "f.yaml:2: alias *x is not allowed", id="alias"),
    pytest.param("a:\n  b: 1\n  b: 2\n", "f.yaml:3: a.b: duplicate key; hint: YAML would keep only the last one",
                 id="duplicate-key"),
    pytest.param("a: " + "[" * 65 + "]" * 65 + "\n", "f.yaml:1: nested more than 64 levels deep", id="too-deep"),
    pytest.param("a: [1\nb: 2\n", "f.yaml:2: invalid YAML: ", id="syntax"),
    pytest.param("? [a, b]\n: 1\n", "f.yaml:1: a key must be a plain name", id="complex-key"),
])
def test_refusals_name_file_and_line(libyaml, text, message):
    with pytest.raises(CatalogError) as err:
        yamlpos.parse(text, "f.yaml", CatalogError, loader=yamlpos._compose_class(libyaml))
    assert str(err.value).startswith(message)


def test_64_levels_are_still_read():
    doc = yamlpos.parse("a: " + "[" * 63 + "]" * 63 + "\n", "f.yaml", CatalogError)
    assert doc.lines[("a",)] == 1


def test_fail_bounds_the_message_and_uses_the_nearest_line():
    doc = yamlpos.parse(TEXT, "f.yaml", CatalogError)
    with pytest.raises(CatalogError) as err:
        doc.fail(("top", "list", 1, "nope"), "x" * 10_000, "h" * 10_000)
    text = str(err.value)
    assert text.startswith("f.yaml:4: top.list[1].nope: xxx") and len(text) < 2 * yamlpos.MAX_MESSAGE + 200


@pytest.mark.parametrize("value, shown", [
    pytest.param("short", "'short'", id="short"),
    pytest.param("y" * 500, "'" + "y" * 75 + "...'", id="long"),
    pytest.param(12, "12", id="int"),
])
def test_clip(value, shown):
    assert yamlpos.clip(value) == shown
