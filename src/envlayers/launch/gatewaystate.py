"""The gateway shape's replicas as data for ``status`` and ``wait``: how many Ray Serve reports healthy,
and the last things that happened to them (a replica died, was replaced), read from the gateway's own
lines and kept in ``endpoint.json`` under ``gateway`` (cli.serving_format puts it in words).

The gateway (gateway_app.py, in the job on node 0) says ``ENVLAYERS-STAGE: gateway: N of M replica(s)
healthy (...; the job ends after Gs below MIN_REPLICAS=K)`` whenever the count changes; the meter relays
its lines once live and hands each one to :meth:`GatewayState.feed`.
"""

from __future__ import annotations

import re

READY_RE = re.compile(r"^ENVLAYERS-STAGE: gateway: (\d+) replica\(s\) ready after .*the job ends after (\d+)s with "
                      r"fewer than MIN_REPLICAS=(\d+) healthy\)")
DIED_RE = re.compile(r"^ENVLAYERS-ERROR: gateway: replica \d+ on \S+: its vllm serve ")
REPLACED_RE = re.compile(r"^ENVLAYERS-STAGE: gateway: replica \d+ on \S+ replaced: ")
HEALTHY_RE = re.compile(r"^ENVLAYERS-STAGE: gateway: (\d+) of (\d+) replica\(s\) healthy \(Serve application "
                        r"(\w+); the job ends after (\d+)s below MIN_REPLICAS=(\d+)\)")
REPLICA_RE = re.compile(r"^ENVLAYERS-(?:ERROR|STAGE): gateway: replica \d+ ")
KEEP_EVENTS = 5


class GatewayState:
    """The ``gateway`` record of endpoint.json, updated from the gateway's lines."""

    def __init__(self):
        self.record: dict = {"healthy": None, "replicas": None, "min_replicas": None, "grace_s": None,
                             "serve_status": None, "events": []}

    def feed(self, line: str) -> bool:
        """Take one of the gateway's lines; True when the record changed. The count starts at the ready
        line, follows each death and replacement, and is set outright by the gateway's own count (which
        it prints only when its two-second look sees a change: a fast replacement can fall between)."""
        m = READY_RE.match(line)
        if m:
            replicas, grace, minimum = map(int, m.groups())
            self.record.update(healthy=replicas, replicas=replicas, grace_s=grace, min_replicas=minimum)
            return True
        rec = self.record
        if rec["healthy"] is not None and (DIED_RE.match(line) or REPLACED_RE.match(line)):
            step = -1 if DIED_RE.match(line) else 1
            rec["healthy"] = max(0, min(rec["replicas"] or 0, rec["healthy"] + step))
        m = HEALTHY_RE.match(line)
        if m:
            healthy, replicas, status, grace, minimum = m.groups()
            self.record.update(healthy=int(healthy), replicas=int(replicas), serve_status=status,
                               grace_s=int(grace), min_replicas=int(minimum))
            return True
        if REPLICA_RE.match(line):
            self.record["events"] = (self.record["events"] + [line.split(": ", 2)[2]])[-KEEP_EVENTS:]
            return True
        return False
