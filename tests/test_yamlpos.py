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


# -- the depth bound before any parser -------------------------------------------------------------------

class _NoParser:
    """A loader that fails the test if it is ever made: the depth bound must refuse the text before."""

    def __init__(self, text):
        raise AssertionError("the parser was given a document nested too deep")


AUDIT_DEEP = "experiments: {}\nmodels: {}\ndescription: " + "[" * 50_000 + "]" * 50_000 + "\n"  # 100 KB


@pytest.mark.parametrize("text, line", [
    pytest.param(AUDIT_DEEP, 3, id="flow-50000-deep-100kb"),
    pytest.param("a: " + "[" * 3000 + "]" * 3000 + "\n", 1, id="flow-3000-deep"),
    pytest.param("a: " + "{k: " * 65 + "1" + "}" * 65 + "\n", 1, id="flow-mappings"),
    pytest.param("a: " + "[" * 50_000 + "\n", 1, id="unclosed"),
    pytest.param("a: 1\n" + "[\n" * 66 + "]\n" * 66, 66, id="one-bracket-a-line"),
    pytest.param("a: 'it''s' # [[[\nb: " + "[" * 65 + "]" * 65, 2, id="after-quotes-and-comments"),
])
def test_deep_flow_nesting_is_refused_before_the_parser_sees_it(text, line):
    with pytest.raises(CatalogError) as err:
        yamlpos.parse(text, "f.yaml", CatalogError, loader=(_NoParser, Exception))
    assert str(err.value) == f"f.yaml:{line}: nested more than 64 levels deep; hint: flatten the document"


@pytest.mark.parametrize("libyaml", LOADERS)
@pytest.mark.parametrize("text", [
    pytest.param("a: '" + "[" * 100 + "'\n", id="single-quoted"),
    pytest.param('a: "' + "{" * 100 + '\\" ["\n', id="double-quoted"),
    pytest.param("# " + "[" * 100 + "\na: 1\n", id="comment"),
    pytest.param("a: b" + "[" * 100 + "\n", id="inside-a-plain-word"),
    pytest.param("a:\n" + "  - [x, {k: [v]}]\n" * 100, id="many-shallow"),
    pytest.param("a: [" + "[1], " * 100 + "[2]]\n", id="many-in-one-list"),
])
def test_brackets_that_are_text_or_shallow_are_read(libyaml, text):
    data = yamlpos.parse(text, "f.yaml", CatalogError, loader=yamlpos._compose_class(libyaml))
    assert data.file == "f.yaml" and data.root is not None and data.root.value[0][0].value == "a"


def test_the_depth_bound_reads_a_file_of_the_limit_in_one_linear_pass():
    """4 MiB of the worst shapes (every byte a bracket; every token a quoted scalar) are judged without
    the parser, and every file of ours is passed over by a count alone."""
    assert yamlpos.flow_depth_line("[" * yamlpos.MAX_BYTES) == 1
    assert yamlpos.flow_depth_line("[]" * (yamlpos.MAX_BYTES // 2)) is None
    assert yamlpos.flow_depth_line("['a'," * (yamlpos.MAX_BYTES // 5)) == 1
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    for path in [root / "experiments" / "setups.yaml", *sorted((root / "containers" / "edfs").glob("*.yaml"))]:
        assert yamlpos.flow_depth_line(path.read_text()) is None, path
