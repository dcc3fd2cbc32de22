"""The router's command line: ``ROUTER=smg`` puts one base URL in front of the replicas shape's servers.

Pure: keys + the plan + the replicas' URLs -> a :class:`RouterPlan` (the ``smg launch`` argv, its
ports, the URL clients use). ``launch.router`` runs it on node 0 once every replica is live.

The router is the Shepherd Model Gateway (``smg``, the continuation of ``sglang-router``), pinned
below like an image is pinned in ``containers/edfs/``; docs/topology.md ("One URL in front of the
replicas") says why this one. It routes to any OpenAI-compatible worker (vLLM and SGLang alike),
checks the workers' ``/health`` itself, retries a failed request on another worker and opens a
circuit breaker on one that keeps failing, and serves its Prometheus text on a port of its own.

Keys (docs/keys.md): ``ROUTER`` (``smg`` or ``none``; absent or empty: no router, an URL per replica),
``ROUTER_PORT`` (default 30000, smg's own), ``ROUTER_POLICY`` (default ``cache_aware``), ``MAX_REPLICAS``
(the elastic pool, ``launch.pool``: checked here against the replicas the plan starts). The metrics
port is ``ROUTER_PORT`` + 1, bound where the router is (SERVER_HOST), as the engines serve theirs: the
launcher reads it for idle release and accounting, ``verify`` and Prometheus scrapers from outside.

The API key never enters the argv: ``launch.router`` hands it to smg through the process environment
(``--api-key`` is set by a two-line Python entry, :data:`ENTRY`), so ``/proc/<pid>/cmdline`` does not
show it. smg checks that key on the clients' inference requests and sends it to the workers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from .. import keys as launch_keys
from ..urls import server_root

PACKAGE, VERSION = "smg", "1.13.0"
PIN = f"{PACKAGE}=={VERSION}"  # the `router` extra of pyproject.toml says the same (tests/test_router.py)
ROUTERS = launch_keys.allowed("ROUTER")  # the keys table declares the choices
DEFAULT_PORT = 30000
POLICIES = launch_keys.allowed("ROUTER_POLICY")
DEFAULT_POLICY = launch_keys.BY_NAME["ROUTER_POLICY"].default
# smg's defaults probe every 60 s and mark a worker down after 3 failures (3 minutes); its retries and
# circuit breaker cover the gap, but a dead replica should leave the rotation within ~10 s
HEALTH_INTERVAL_S = 5
HEALTH_FAILURES = 2
SHUTDOWN_GRACE_S = 5  # smg waits 180 s for requests in flight at SIGTERM by default; the job's end is sooner
LOG_LEVEL = "warn"
KEY_ENV = "ENVLAYERS_ROUTER_API_KEY"
# what the launcher runs: smg's own `launch` parser, then the key from the environment, never the argv
ENTRY = ("import os, sys; from smg.launch_router import launch_router, parse_router_args; "
         f"args = parse_router_args(sys.argv[1:]); args.api_key = os.environ.pop({KEY_ENV!r}, None); "
         "launch_router(args)")


@dataclass(frozen=True)
class RouterPlan:
    """One router: ``argv`` is the ``smg launch ...`` line without the key; ``workers`` the replicas' roots."""

    port: int
    metrics_port: int
    host: str
    policy: str
    workers: tuple[str, ...]
    argv: tuple[str, ...]
    api_key: bool

    def line(self) -> str:
        from .. import shell

        return shell.words(self.argv) + (f"  # --api-key from SERVER_API_KEY_FILE, in ${KEY_ENV}" if self.api_key else "")


def router_choice(keys: Mapping[str, str]) -> str | None:
    """``ROUTER``: ``smg`` -> ``"smg"``; absent, empty or ``none`` -> None (no router); else an error."""
    value = launch_keys.text(keys, "ROUTER")
    if value in (None, "none"):
        return None
    if value not in ROUTERS:
        raise launch_keys.error(keys, "ROUTER", f"{value!r} is not a router this launcher starts",
                                "ROUTER=smg (one URL in front of the replicas) or ROUTER=none")
    return value


def router_port(keys: Mapping[str, str]) -> int:
    return launch_keys.value(keys, "ROUTER_PORT")


def router_policy(keys: Mapping[str, str]) -> str:
    value = launch_keys.text(keys, "ROUTER_POLICY") or DEFAULT_POLICY
    if value not in POLICIES:
        raise launch_keys.error(keys, "ROUTER_POLICY", f"{value!r} is not one of smg's policies",
                                f"one of {', '.join(POLICIES)} (default {DEFAULT_POLICY})")
    return value


def check(keys: Mapping[str, str], shape: str, api_port: int) -> str | None:
    """The router this plan runs (``"smg"``) or None; an error when ROUTER asks for one the plan cannot have."""
    choice = router_choice(keys)
    if choice is None:
        if launch_keys.value(keys, "MAX_REPLICAS") is not None:
            raise launch_keys.error(keys, "MAX_REPLICAS", "the pool grows behind the router, and ROUTER is not set",
                                    "set ROUTER=smg (and INFERENCE_MODE=replicas), or leave MAX_REPLICAS empty")
        return None
    if shape != "replicas":
        raise launch_keys.error(keys, "ROUTER", f"{choice} routes between replicas, and this plan is the {shape} shape",
                                "set INFERENCE_MODE=replicas, or ROUTER=none")
    port = router_port(keys)
    if api_port in (port, port + 1):
        raise launch_keys.error(keys, "ROUTER_PORT", f"{port} collides with SERVER_PORT={api_port} on node 0 (the "
                                "router and its metrics take ROUTER_PORT and the port above it)",
                                f"e.g. ROUTER_PORT={DEFAULT_PORT}")
    router_policy(keys)
    return choice


def max_replicas(keys: Mapping[str, str], replicas: int) -> int | None:
    """``MAX_REPLICAS``: how many replicas the elastic pool may grow to (None: it does not grow); fewer than
    the ``replicas`` the job starts with is an error naming the key (its line on the login node)."""
    n = launch_keys.value(keys, "MAX_REPLICAS")
    if n is not None and n < replicas:
        raise launch_keys.error(keys, "MAX_REPLICAS", f"{n} is fewer than the {replicas} replicas the job starts with",
                                f"MAX_REPLICAS={replicas + 1} or more to let the pool grow, or empty for no growth")
    return n


def bind_host(keys: Mapping[str, str]) -> str:
    """Where the router binds: SERVER_HOST as the engines take it (default every interface)."""
    raw = keys.get("SERVER_HOST")
    return "0.0.0.0" if raw is None else raw.strip()


def router_argv(*, host: str, port: int, metrics_port: int, workers: Sequence[str], policy: str) -> list[str]:
    """``smg launch`` for the replicas' roots (``http://host:port``, no ``/v1``)."""
    return ["smg", "launch", "--host", host, "--port", str(port), "--worker-urls", *workers,
            "--policy", policy, "--prometheus-host", host, "--prometheus-port", str(metrics_port),
            "--health-check-interval-secs", str(HEALTH_INTERVAL_S),
            "--health-failure-threshold", str(HEALTH_FAILURES),
            "--shutdown-grace-period-secs", str(SHUTDOWN_GRACE_S),
            # pure load balancing: no tokenizer (a hub id would be fetched from the network)
            "--disable-tokenizer-autoload", "--log-level", LOG_LEVEL]


def plan_router(keys: Mapping[str, str], shape: str, api_port: int, workers: Sequence[str],
                api_key: bool, port: int | None = None) -> RouterPlan | None:
    """The router for these replicas, or None without ``ROUTER``. ``port``: a free port chosen at launch
    (``launch.router``) instead of ``ROUTER_PORT``."""
    if check(keys, shape, api_port) is None:
        return None
    max_replicas(keys, len(workers))
    port = router_port(keys) if port is None else port
    host, policy = bind_host(keys), router_policy(keys)
    argv = router_argv(host=host, port=port, metrics_port=port + 1, workers=workers, policy=policy)
    return RouterPlan(port, port + 1, host, policy, tuple(workers), tuple(argv), api_key)


def worker_root(url: str) -> str:
    """A replica's base URL without ``/v1`` (``urls.server_root``): what smg takes as a worker URL."""
    return server_root(url)
