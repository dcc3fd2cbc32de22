"""The core-dump guard.

The cluster's machine-global ``core_pattern`` drops multi-GB core files into the working directory
of a crashing server, so every server step runs with ``ulimit -c 0`` and records the limit it ran
with in the run directory as ``core-limit.txt``, one line per rank::

    rank=0 limit=0
    rank=1 limit=0

:func:`check_cores` reports core files left in a folder and any recorded limit that is not ``0``.
It only reads; it never deletes a core (someone may want it).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from .errors import EnvLayersError
from .rundir import CORE_LIMIT
_LIMIT_LINE = re.compile(r"^rank=(?P<rank>\d+)\s+limit=(?P<value>\S+)$")
_PID_CORE = re.compile(r"^core\.\d+$")
ET_CORE = 4


@dataclass(frozen=True)
class CoreFile:
    path: str
    size_bytes: int
    elf_core: bool  # False: named like a core file but not an ELF core (still reported)

    def to_dict(self) -> dict:
        return {"path": self.path, "size_bytes": self.size_bytes, "elf_core": self.elf_core}


@dataclass(frozen=True)
class CoreLimit:
    rank: int
    value: str
    where: str  # file:line

    @property
    def ok(self) -> bool:
        return self.value == "0"

    def to_dict(self) -> dict:
        return {"rank": self.rank, "value": self.value, "where": self.where, "ok": self.ok}


@dataclass
class CoreReport:
    folder: str
    cores: list[CoreFile] = field(default_factory=list)
    limits: list[CoreLimit] = field(default_factory=list)
    limit_file: str | None = None  # None: no core-limit.txt was found

    @property
    def bad_limits(self) -> list[CoreLimit]:
        return [limit for limit in self.limits if not limit.ok]

    @property
    def ok(self) -> bool:
        return not self.cores and not self.bad_limits

    def to_dict(self) -> dict:
        return {
            "folder": self.folder, "ok": self.ok, "cores": [c.to_dict() for c in self.cores],
            "limit_file": self.limit_file, "limits": [lim.to_dict() for lim in self.limits],
            "bad_limits": [lim.to_dict() for lim in self.bad_limits],
        }


def is_elf_core(path: str | os.PathLike) -> bool:
    """True when the file starts with an ELF header whose type is ET_CORE."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(18)
    except OSError:
        return False
    if len(head) < 18 or head[:4] != b"\x7fELF":
        return False
    byteorder = "little" if head[5] == 1 else "big"
    return int.from_bytes(head[16:18], byteorder) == ET_CORE


def _named_like_core(name: str) -> bool:
    return name == "core" or bool(_PID_CORE.match(name)) or (name.endswith(".core") and name != ".core")


def find_core_files(folder: str | os.PathLike) -> list[CoreFile]:
    """Core files directly in ``folder`` (not below it), sorted by name.

    A regular file counts when it is named ``core``, ``core.<pid>`` or ``*.core``, or when it is
    named ``core.<anything>`` and really is an ELF core (core_pattern variants such as
    ``core.python3.4711``). Symlinks are not followed.
    """
    base = Path(folder)
    try:
        entries = sorted(os.scandir(base), key=lambda e: e.name)
    except OSError as err:
        raise EnvLayersError(f"cannot list {base}: {err.strerror}") from None
    found = []
    for entry in entries:
        if not entry.is_file(follow_symlinks=False):
            continue
        named = _named_like_core(entry.name)
        if not named and not entry.name.startswith("core."):
            continue
        elf = is_elf_core(entry.path)
        if named or elf:
            try:
                size = entry.stat(follow_symlinks=False).st_size
            except OSError:  # removed while we looked
                continue
            found.append(CoreFile(path=str(base / entry.name), size_bytes=size, elf_core=elf))
    return found


def parse_core_limits(text: str, origin: str = CORE_LIMIT) -> list[CoreLimit]:
    """``rank=<r> limit=<value>`` lines; blank lines and ``#`` comments are skipped."""
    limits = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _LIMIT_LINE.match(line)
        if not m:
            raise EnvLayersError(
                f"expected 'rank=<r> limit=<value>', got {line!r}", where=f"{origin}:{number}",
                hint="the job writes one line per rank: echo \"rank=$SLURM_PROCID limit=$(ulimit -c)\"",
            )
        limits.append(CoreLimit(rank=int(m["rank"]), value=m["value"], where=f"{origin}:{number}"))
    return limits


def check_cores(folder: str | os.PathLike, limit_file: str | os.PathLike | None = None) -> CoreReport:
    """Cores in ``folder`` and the limits recorded in ``limit_file`` (default: folder/core-limit.txt)."""
    base = Path(folder)
    if not base.is_dir():
        raise EnvLayersError(f"no such directory: {base}")
    report = CoreReport(folder=str(base), cores=find_core_files(base))
    limits_path = Path(limit_file) if limit_file is not None else base / CORE_LIMIT
    if limit_file is not None and not limits_path.is_file():
        raise EnvLayersError(f"no such file: {limits_path}")
    if limits_path.is_file():
        report.limit_file = str(limits_path)
        try:
            text = limits_path.read_text(encoding="utf-8", errors="replace")
        except OSError as err:
            raise EnvLayersError(f"cannot read {limits_path}: {err.strerror}") from None
        report.limits = parse_core_limits(text, origin=str(limits_path))
    return report
