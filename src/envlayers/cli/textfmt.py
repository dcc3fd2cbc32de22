"""The small words every terminal record shares: durations (``1h02m05s``) and padded labels.

Both of ``status``'s formatters (``ops_format``, ``serving_format``) and ``report`` use them, so they live
here, below all three."""

from __future__ import annotations


def fmt_duration(seconds: float | None) -> str:
    """``75`` -> ``1m15s``, ``3725`` -> ``1h02m05s``; ``None`` -> ``-``."""
    if seconds is None:
        return "-"
    s = max(0, int(round(seconds)))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    if h:
        return f"{h}h{m:02d}m{s:02d}s"
    if m:
        return f"{m}m{s:02d}s"
    return f"{s}s"


def label(name: str) -> str:
    """``  served name: `` -- every label of the record padded to one width."""
    return f"  {name + ':':<13}"
