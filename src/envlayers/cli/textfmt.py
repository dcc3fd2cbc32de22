"""The small words every terminal record shares: padded labels and the one column-aligned table.

``status``'s formatters (``ops_format``, ``serving_format``), ``report`` and ``bench`` use them, so they live
here, below all of them. A duration in a record (``1h02m05s``) is ``durations.compact``: the job script's
messages say durations too, and one module writes them all."""

from __future__ import annotations


def label(name: str) -> str:
    """``  served name: `` -- every label of the record padded to one width."""
    return f"  {name + ':':<13}"


def table(rows: list[tuple[str, ...]] | list[list[str]], *, right: bool = False) -> list[str]:
    """``rows`` (the head first) as lines of columns two spaces apart, each column as wide as its widest
    cell; cells padded on the right (``right=False``, text) or on the left (``right=True``, numbers);
    trailing spaces dropped."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    pad = str.rjust if right else str.ljust
    return ["  ".join(pad(cell, w) for cell, w in zip(row, widths)).rstrip() for row in rows]
