"""The gateway's own lines in the job output: once the endpoint is live, :class:`GatewayRelay` says
the lines gateway_app.py prints to rank 0's log (a replica died, was replaced, too few are healthy) in
the job output too, as they come. What ``status`` shows of the replicas comes from the gateway's state
file instead (``rundir.read_gateway_state``), not from these lines.
"""

from __future__ import annotations

from typing import Callable

from ..joblines import GATEWAY_LINES
from ..tail import Tail


class GatewayRelay:
    """Says the gateway's lines of rank 0's log as they come, reading on from ``tail``: the reader the phase
    reader used (``Timeline.log``), so the lines before were rank 0's startup and are not said again, and a
    line it stopped inside is said whole."""

    def __init__(self, tail: Tail, say: Callable[[str], None]):
        self.tail, self.say = tail, say

    def relay(self) -> None:
        for line in self.tail.lines():
            line = line.rstrip()
            if line.startswith(GATEWAY_LINES):
                self.say(line)
