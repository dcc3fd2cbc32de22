"""The ``ray start`` command lines of the ``ray`` and ``gateway`` shapes: the head's and a worker's.

Pure: the launch keys and the plan in, argv words out. The keys (docs/keys.md): ``RAY_PORT_BASE`` (the
fixed Ray ports, one block of 1000 from it; empty: Ray's own defaults) and ``RAY_NUM_CPUS``
(``--num-cpus`` of every Ray node). The head's own port is the plan's rendezvous port (``RDZV_PORT``).
How the job runs these lines is :mod:`envlayers.launch.raycluster`'s business.
"""

from __future__ import annotations

from typing import Mapping

from .. import keys
from ..errors import EnvLayersError

PORT_BLOCK = 1000

# RAY_PORT_BASE + offset: every port a Ray node would otherwise take at a fixed default (10001, 52365,
# 10002-19999) or at random, so two jobs sharing a node's port space never collide and a firewall
# can be told which ports a job uses
PORT_OFFSETS: tuple[tuple[str, int, bool], ...] = (  # flag, offset, head only
    ("--dashboard-agent-listen-port", 0, False),
    ("--ray-client-server-port", 1, True),
    ("--node-manager-port", 2, False),
    ("--object-manager-port", 3, False),
    ("--metrics-export-port", 4, False),
    ("--dashboard-agent-grpc-port", 5, False),
    ("--runtime-env-agent-port", 6, False),
    ("--dashboard-port", 7, True),
)
WORKER_PORTS = (100, PORT_BLOCK - 1)  # --min-worker-port / --max-worker-port offsets


class RayKeyError(EnvLayersError):
    """A Ray launch key the cluster cannot be started with."""


def port_base(env: Mapping[str, str]) -> int | None:
    """``RAY_PORT_BASE``: absent -> 28000, empty -> None (Ray's own port defaults), a value -> it."""
    return keys.value(env, "RAY_PORT_BASE")


def num_cpus(env: Mapping[str, str]) -> int | None:
    """``RAY_NUM_CPUS``: absent or empty -> None (Ray counts the node's CPUs), a value -> it."""
    return keys.value(env, "RAY_NUM_CPUS")


def check_ports(env: Mapping[str, str], plan) -> None:
    """The plan's own ports (the service, the Ray head) must lie outside the Ray port block."""
    base = port_base(env)
    if base is None:
        return
    for key, value in (("SERVER_PORT", plan.api_port), ("RDZV_PORT", plan.rdzv_port)):
        if base <= value < base + PORT_BLOCK:
            raise RayKeyError(f"{key} = {value} lies in the Ray port block {base}-{base + PORT_BLOCK - 1}",
                              where=f"RAY_PORT_BASE, {key}",
                              hint=f"set RAY_PORT_BASE outside {max(1024, value - PORT_BLOCK + 1)}-{value}")


def node_flags(env: Mapping[str, str], plan, head: bool) -> list[str]:
    """The ``ray start`` flags of one node (without ``--head``, ``--address`` and ``--block``)."""
    flags = [f"--num-gpus={plan.gpus_per_node}"]
    cpus = num_cpus(env)
    if cpus is not None:
        flags.append(f"--num-cpus={cpus}")
    if head:
        flags += ["--include-dashboard=false", "--disable-usage-stats"]
    base = port_base(env)
    if base is not None:
        flags += [f"{name}={base + offset}" for name, offset, head_only in PORT_OFFSETS if head or not head_only]
        flags += [f"--min-worker-port={base + WORKER_PORTS[0]}", f"--max-worker-port={base + WORKER_PORTS[1]}"]
    return flags


def worker_argv(env: Mapping[str, str], plan, master_addr: str) -> tuple[str, ...]:
    """A rank > 0: a Ray worker node joining the head on node 0."""
    check_ports(env, plan)
    return ("ray", "start", f"--address={master_addr}:{plan.rdzv_port}", *node_flags(env, plan, head=False),
            "--block")


def head_argv(env: Mapping[str, str], plan, node_ip: str | None = None) -> tuple[str, ...]:
    """Node 0: the Ray head on the rendezvous port (``--node-ip-address`` when the job knows it)."""
    check_ports(env, plan)
    ip = [f"--node-ip-address={node_ip}"] if node_ip else []
    return ("ray", "start", "--head", f"--port={plan.rdzv_port}", *ip, *node_flags(env, plan, head=True),
            "--block")
