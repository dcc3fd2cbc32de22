"""The gateway's own lines in the job output: once the endpoint is live, :class:`GatewayRelay` says
the lines gateway_app.py prints to rank 0's log (a replica died, was replaced, too few are healthy) in
the job output too, as they come. What ``status`` shows of the replicas comes from the gateway's state
file instead (``rundir.read_gateway_state``), not from these lines.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

GATEWAY_LINES = tuple(f"ENVLAYERS-{kind}: gateway: " for kind in ("ERROR", "WARN", "STAGE"))


class GatewayRelay:
    """Says the gateway's lines of ``log`` from byte ``start`` on (where the phase reader stopped: the lines
    before it were rank 0's startup and are not said again; a line it stopped inside is said whole)."""

    def __init__(self, log: Path, start: int, say: Callable[[str], None]):
        self.log, self.pos, self.say = log, start, say
        self._partial: bytes | None = None  # an unfinished last line; None until the first read

    def relay(self) -> None:
        try:
            with open(self.log, "rb") as fh:
                if self._partial is None:  # the start of a line the phase reader stopped inside
                    self._partial = fh.read(self.pos).rpartition(b"\n")[2]
                fh.seek(self.pos)
                chunk = fh.read(1 << 20)
        except FileNotFoundError:
            return
        self.pos += len(chunk)
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        for raw in lines:
            line = raw.decode("utf-8", "replace").rstrip()
            if line.startswith(GATEWAY_LINES):
                self.say(line)
