"""Slurm's duration format: ``parse_duration`` (``D-HH:MM:SS``, ``MM:SS``, bare minutes, ``UNLIMITED``...)
and ``format_duration``, its inverse.

Pure text in, seconds out, used by the job script's ``--time`` check, the successor and the Slurm
records; ``envlayers.slurm.parse_duration`` is this function.
"""

from __future__ import annotations

import re

_NO_LIMIT = frozenset({"", "UNLIMITED", "NOT_SET", "INVALID", "INFINITE", "N/A", "NONE", "PARTITION_LIMIT",
                       "(NULL)"})
_DURATION_RE = re.compile(r"^(?:(?P<d>\d+)-)?(?P<rest>\d+(?::\d+){0,2})$")


def parse_duration(text: str | None) -> int | None:
    """Seconds in a Slurm duration, or ``None`` for no limit / not a duration.

    Forms (as Slurm prints and accepts them): ``D-HH:MM:SS``, ``D-HH:MM``, ``D-HH``, ``HH:MM:SS``,
    ``MM:SS``, and a bare number of minutes (``sacct -c`` prints ``Timelimit`` that way).
    ``UNLIMITED``, ``NOT_SET``, ``INVALID``, ``INFINITE``, ``N/A`` and anything else -> ``None``.
    """
    if text is None:
        return None
    text = text.strip()
    if text.upper() in _NO_LIMIT:
        return None
    m = _DURATION_RE.match(text)
    if not m:
        return None
    parts = [int(p) for p in m.group("rest").split(":")]
    days = m.group("d")
    if days is not None:
        # after "D-": hours, hours:minutes, or hours:minutes:seconds
        h, mi, s = (parts + [0, 0])[:3]
        return int(days) * 86400 + h * 3600 + mi * 60 + s
    if len(parts) == 1:
        return parts[0] * 60  # bare minutes
    if len(parts) == 2:
        return parts[0] * 60 + parts[1]
    return parts[0] * 3600 + parts[1] * 60 + parts[2]


def format_duration(seconds: int) -> str:
    """Seconds as Slurm writes a time limit: ``HH:MM:SS``, or ``D-HH:MM:SS`` from a day on."""
    days, rest = divmod(int(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    text = f"{hours:02d}:{rest // 60:02d}:{rest % 60:02d}"
    return f"{days}-{text}" if days else text


def spoken(seconds: int) -> str:
    """Seconds as a person says them, largest units first: ``4 min``, ``2 h``, ``1 h 30 min``, ``45 s``."""
    days, rest = divmod(int(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{n} {unit}" for n, unit in ((days, "d"), (hours, "h"), (minutes, "min"), (secs, "s")) if n]
    return " ".join(parts) or "0 s"

