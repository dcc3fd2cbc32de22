"""cli.textfmt.table: the one column-aligned table of the terminal (status's list, bench's report)."""

from __future__ import annotations

import pytest

from envlayers.cli.textfmt import table

ROWS = [("conc", "ok", "URL"), ("1", "12", "-"), ("16", "3", "http://n1:8001/v1")]


@pytest.mark.parametrize("right, expected", [
    pytest.param(False, ["conc  ok  URL", "1     12  -", "16    3   http://n1:8001/v1"], id="text-padded-right"),
    pytest.param(True, ["conc  ok                URL", "   1  12                  -", "  16   3  http://n1:8001/v1"],
                 id="numbers-padded-left"),
])
def test_columns_are_as_wide_as_their_widest_cell(right, expected):
    assert table(ROWS, right=right) == expected


def test_trailing_spaces_are_dropped():
    assert table([("a", "b"), ("long", "")]) == ["a     b", "long"]
