"""Times and durations as text: Slurm's forms read and written, the span an operator types, and the two
forms a person reads. Pure text in, seconds out (and back); every other module goes through these.

- Slurm's durations: :func:`parse_duration` (``D-HH:MM:SS``, ``MM:SS``, bare minutes, ``UNLIMITED``...),
  :func:`format_duration`, its inverse, and :func:`format_time_limit`, sbatch's ``--time`` (``26:00:00``).
  Used by the job script's ``--time`` check, the successor and the Slurm records;
  ``envlayers.slurm.parse_duration`` and ``format_time_limit`` are these functions.
- Slurm's timestamps: :func:`parse_time` (``2026-12-02T09:52:00``, local time, as ``scontrol`` and ``sacct``
  print ``StartTime`` and ``EndTime``) -> epoch seconds, and :func:`format_time`, what ``sacct --starttime``
  reads. Here rather than beside slurm.py's parsers: the terminal text and the report read the same
  timestamps from records, and this module is below all of them and starts no process. A record's own stamp
  in UTC (the tunnel's): :func:`format_utc`.
- A span an operator types (``report --since 7d``): :func:`parse_span`, grammar :data:`SPAN_GRAMMAR`.
- For people: :func:`spoken` (``1 h 30 min``, in sentences) and :func:`compact` (``1h02m05s``, in the
  terminal's records and tables).

``datetime`` is imported by the functions that need it: the job script's checks use this module and a dry
run does not load it.
"""

from __future__ import annotations

import re

_NO_LIMIT = frozenset({"", "UNLIMITED", "NOT_SET", "INVALID", "INFINITE", "N/A", "NONE", "PARTITION_LIMIT",
                       "(NULL)"})
_DURATION_RE = re.compile(r"^(?:(?P<d>\d+)-)?(?P<rest>\d+(?::\d+){0,2})$")
_NO_TIME = frozenset({"", "Unknown", "None"})  # what Slurm prints for a time it does not have

SPAN_GRAMMAR = "a number and a unit: s, m, h, d or w (7d, 12h, 30m, 2w, 1.5h)"
_SPAN_RE = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_SPAN_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


# -- Slurm's durations ----------------------------------------------------------------------------------

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


def format_time_limit(seconds: int) -> str:
    """Seconds -> sbatch's ``--time`` as ``H:MM:SS`` (hours past 24 as they are: ``26:00:00``)."""
    h, rem = divmod(int(seconds), 3600)
    return f"{h}:{rem // 60:02d}:{rem % 60:02d}"


# -- Slurm's timestamps ---------------------------------------------------------------------------------

def parse_time(text: str | None) -> float | None:
    """A timestamp as Slurm prints it (``2026-12-02T09:52:00``, local time; a date alone or an offset are
    read too) -> epoch seconds; ``None`` for ``Unknown``, ``None``, the empty text and anything else."""
    if text is None or text.strip() in _NO_TIME:
        return None
    from datetime import datetime

    try:
        return datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        return None


def format_time(epoch: float) -> str:
    """Epoch seconds as Slurm reads a time (``sacct --starttime``): ``2026-12-02T09:52:00``, local time."""
    from datetime import datetime

    return datetime.fromtimestamp(epoch).strftime("%Y-%m-%dT%H:%M:%S")


def format_utc(epoch: float) -> str:
    """Epoch seconds as a record's own stamp, in UTC with its offset: ``2026-12-02T08:52:00+00:00`` (the
    tunnel's records)."""
    from datetime import datetime, timezone

    return datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="seconds")


# -- a span an operator types ---------------------------------------------------------------------------

def parse_span(text: str) -> float | None:
    """Seconds in a span as :data:`SPAN_GRAMMAR` says (``7d`` -> 604800.0); ``None`` when ``text`` is not
    one (surrounding blanks are allowed)."""
    m = _SPAN_RE.match(text.strip())
    return float(m.group(1)) * _SPAN_UNIT_S[m.group(2)] if m else None


# -- for people -----------------------------------------------------------------------------------------

def spoken(seconds: int) -> str:
    """Seconds as a person says them, largest units first: ``4 min``, ``2 h``, ``1 h 30 min``, ``45 s``."""
    days, rest = divmod(int(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{n} {unit}" for n, unit in ((days, "d"), (hours, "h"), (minutes, "min"), (secs, "s")) if n]
    return " ".join(parts) or "0 s"


def compact(seconds: float | None) -> str:
    """Seconds in a record or a table cell: ``75`` -> ``1m15s``, ``3725`` -> ``1h02m05s``; ``None`` -> ``-``."""
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
