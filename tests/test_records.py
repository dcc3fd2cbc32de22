"""envlayers.records.NamedTuple behaves as typing.NamedTuple for the record classes the CLI defines with it."""

from __future__ import annotations

import pickle
import typing

import pytest

from envlayers import records


def define(base):
    class Point(base):
        """A point."""

        x: int
        y: int = 0
        label: "str | None" = None

        def norm1(self) -> int:
            return abs(self.x) + abs(self.y)

    return Point


Mine, Typing = define(records.NamedTuple), define(typing.NamedTuple)


@pytest.mark.parametrize("probe", [
    pytest.param(lambda P: repr(P(1)), id="repr-with-defaults"),
    pytest.param(lambda P: P(1, 2)._replace(y=5), id="replace"),
    pytest.param(lambda P: P._fields, id="fields"),
    pytest.param(lambda P: P._field_defaults, id="defaults"),
    pytest.param(lambda P: P(3, -4).norm1(), id="method"),
    pytest.param(lambda P: P.__doc__, id="docstring"),
    pytest.param(lambda P: P(1, 2) == (1, 2, None), id="a-tuple"),
    pytest.param(lambda P: P._make([1, 2, "a"])._asdict(), id="make-asdict"),
    pytest.param(lambda P: (P.__name__, P.__qualname__.rsplit(".", 1)[-1], P.__module__), id="names"),
    pytest.param(lambda P: hasattr(P(1), "__dict__"), id="no-instance-dict"),
])
def test_same_as_typing(probe):
    assert probe(Mine) == probe(Typing)


def test_pickles_as_itself():
    from envlayers.envfile import Origin

    o = Origin("a.env", 3)
    assert pickle.loads(pickle.dumps(o)) == o and str(o) == "a.env:3"


@pytest.mark.parametrize("body, error", [
    pytest.param("a: int = 1\n    b: int", TypeError, id="non-default-after-default"),
    pytest.param("a: int\n    def _replace(self): pass", AttributeError, id="prohibited-attribute"),
])
def test_refuses_what_typing_refuses(body, error):
    for base in (records.NamedTuple, typing.NamedTuple):
        with pytest.raises(error):
            exec(f"class Bad(base):\n    {body}\n", {"base": base})
