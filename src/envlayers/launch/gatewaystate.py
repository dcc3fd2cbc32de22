"""What ``status`` and ``wait`` show of the gateway shape's replicas: how many Ray Serve reports healthy,
and the last things that happened to them (a replica died, was replaced), read from the gateway's own
lines and kept in ``endpoint.json`` under ``gateway``.

The gateway (gateway_app.py, in the job on node 0) says ``ENVLAYERS-STAGE: gateway: N of M replica(s)
healthy (...; the job ends after Gs below MIN_REPLICAS=K)`` whenever the count changes; the meter relays
its lines once live and hands each one to :meth:`GatewayState.feed`.
"""

from __future__ import annotations

import re

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
        """Take one of the gateway's lines; True when the record changed."""
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


def gateway_lines(endpoint: dict) -> list[tuple[str, str]]:
    """(label, text) for status and wait: the replicas Serve reports healthy, and the latest events."""
    rec = endpoint.get("gateway") if isinstance(endpoint, dict) else None
    if not isinstance(rec, dict) or rec.get("healthy") is None:
        return []
    out = [("replicas", f"{rec['healthy']} of {rec.get('replicas')} healthy behind the gateway (Ray Serve "
                        f"replaces one that dies); the job ends after {rec.get('grace_s')}s below "
                        f"MIN_REPLICAS={rec.get('min_replicas')}")]
    out += [("replica", str(event)) for event in rec.get("events") or []]
    return out
