"""Reading a file that grows (a job's output, a rank's server log): :class:`Tail` gives what was appended
since the last read, as text, as bytes or as whole lines; :func:`last_lines` gives a file's last lines
without reading all of it. The one reader of growing files, on the login node and in the job.

Tolerant by construction: a file that is not there yet (or cannot be read now) reads as nothing; a file that
shrank (truncated) or was replaced by another (a new inode: rotated, or a new run's file at the same path)
is read again from its start; a read can be bounded (``chunk``: the rest comes with the next read), and so
can an unfinished line held for its newline (``max_line``: its end is kept).
"""

from __future__ import annotations

import os
from pathlib import Path

_BACK_STEP = 65536  # how far back one step reads, to find a line's start or a file's last lines


class Tail:
    """What ``path`` gained since the last read.

    ``start``: the byte to begin at (``line_start``: at the start of the line that byte is in, so a reader
    taking over mid-line sees that line whole); ``max_first_read``: on a first read from byte 0, at most
    this many bytes from the end; ``chunk``: at most this many bytes per read. ``path`` may be set to
    another file later (a job output found once Slurm says where): that file is read from its start.

    Read a tail one way: :meth:`read` (text, an unfinished line included) or :meth:`lines` (whole lines,
    an unfinished one held back until its newline; :meth:`rest` gives it at the end). :meth:`read` after
    :meth:`lines` returns the held line first; :meth:`read_bytes` is the raw stream under both.
    """

    def __init__(self, path: str | os.PathLike | None, *, start: int = 0, line_start: bool = False,
                 max_first_read: int | None = None, chunk: int | None = None, max_line: int | None = None):
        self.path = Path(path) if path is not None else None
        self.offset = start
        self._align = line_start and start > 0
        self._max_first, self._chunk, self._max_line = max_first_read, chunk, max_line
        self._file: tuple[Path, int, int] | None = None  # (path, device, inode) last read
        self._held = b""  # an unfinished last line (lines()); its start (line_start)

    def read_bytes(self) -> bytes:
        """The bytes appended since the last read (at most ``chunk``); ``b""`` while there is no file."""
        if self.path is None:
            return b""
        try:
            with open(self.path, "rb") as fh:
                st = os.fstat(fh.fileno())
                this = (self.path, st.st_dev, st.st_ino)
                if (self._file is not None and this != self._file) or st.st_size < self.offset:
                    self.offset, self._held, self._align = 0, b"", False  # truncated or replaced: from its start
                self._file = this
                if self.offset == 0 and self._max_first and st.st_size > self._max_first:
                    self.offset = st.st_size - self._max_first
                if self._align:
                    self._held, self._align = _line_head(fh, self.offset), False
                fh.seek(self.offset)
                data = fh.read(self._chunk if self._chunk else -1)
        except OSError:  # not there (yet), a folder, not readable now
            return b""
        self.offset += len(data)
        return data

    def read(self) -> str:
        """The text appended since the last read (UTF-8, a bad byte as U+FFFD), unfinished last line included."""
        new = self.read_bytes()  # first: it may set what is held (a line's start) or drop it (a replaced file)
        data, self._held = self._held + new, b""
        return data.decode("utf-8", errors="replace")

    def lines(self) -> list[str]:
        """The whole lines appended since the last call, without their ``\\n`` (a ``\\r`` stays)."""
        data = self.read_bytes()
        if not data:
            return []
        *done, held = (self._held + data).split(b"\n")
        self._held = held[-self._max_line:] if self._max_line else held
        return [line.decode("utf-8", errors="replace") for line in done]

    def rest(self) -> str:
        """The unfinished last line :meth:`lines` holds back (``""`` for none), given once: at the end of a
        file that will not grow."""
        held, self._held = self._held, b""
        return held.decode("utf-8", errors="replace")

    def last(self, n: int) -> list[str]:
        """The file's last ``n`` lines now; the next read begins after them. ``[]`` (and the next read from
        the start) while there is no file."""
        if self.path is None:
            return []
        try:
            with open(self.path, "rb") as fh:
                st = os.fstat(fh.fileno())
                lines = _last_lines(fh, st.st_size, n)
        except OSError:
            return []
        self.offset, self._held, self._align = st.st_size, b"", False
        self._file = (self.path, st.st_dev, st.st_ino)
        return lines


def last_lines(path: str | os.PathLike, n: int, *, step: int = _BACK_STEP) -> list[str]:
    """The last ``n`` lines of a file, read back from its end ``step`` bytes at a time, not all of it (an
    ``OSError`` when it cannot be read)."""
    with open(path, "rb") as fh:
        return _last_lines(fh, os.fstat(fh.fileno()).st_size, n, step)


def _last_lines(fh, end: int, n: int, step: int = _BACK_STEP) -> list[str]:
    if n <= 0:
        return []
    data = b""
    pos = end
    while pos > 0 and data.count(b"\n") <= n:
        size = min(step, pos)
        pos -= size
        fh.seek(pos)
        data = fh.read(size) + data
    return data.decode("utf-8", errors="replace").splitlines()[-n:]


def _line_head(fh, pos: int, step: int = _BACK_STEP) -> bytes:
    """The bytes from the start of the line that byte ``pos`` is in, up to ``pos``."""
    head = b""
    while pos > 0:
        size = min(step, pos)
        pos -= size
        fh.seek(pos)
        head = fh.read(size) + head
        if b"\n" in head:
            return head.rpartition(b"\n")[2]
    return head
