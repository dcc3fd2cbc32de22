"""Running the router (ROUTER=smg) on node 0: start it once every replica is live, watch it, read its counters.

The launcher runs on node 0 outside any container, so the router runs there too, beside rank 0's
engine, with every ``CONTAINER_RUNTIME``: it is smg's Python entry in the launcher's own Python (the
``router`` extra installs it), never inside the engine's image. Its output goes to
``$RUN_DIR/router.log``. Its argv comes from ``engines.router``; the API key reaches it in its
environment (never its command line).

Its port is checked free on node 0 before it starts, as the rendezvous port is: the first free port
from ``ROUTER_PORT`` up (and the one above it, for the metrics) is taken, and a line says when it moved.
:meth:`Router.start` waits until smg answers ``/v1/models`` with every replica registered (or at least
one after :data:`READY_TIMEOUT_S`); :meth:`tick` ends the job when the router exits; :meth:`counters`
reads the router's ``/metrics`` for idle release and the GPU-hour report: a request through the router
counts once, however many workers smg tried for it, and the launcher's own health probes (sent to the
replicas directly) never show there.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Mapping, Sequence

from ..engines.router import ENTRY, KEY_ENV, RouterPlan, plan_router, worker_root
from ..errors import EnvLayersError, LaunchFailure
from ..joblines import STAGE, TOPOLOGY, WARN
from ..procgroup import stop_group
from ..rundir import ROUTER_LOG, ROUTER_STATE, RecordWriter, RouterState
from .idle import Counters, parse_prometheus
from .ports import port_free
from ..urls import host_port_base

READY_TIMEOUT_S = 60.0
PORT_SCAN = 64
# the answers that are client requests: on every path under /v1 but the model list, and SGLang's native one;
# a request refused for its key (401, 403) is nobody's use of the endpoint, so it keeps no job from idle release
_REQUEST_PATH_RE = re.compile(r'^smg_http_responses_total\{[^}]*path="(/v1/(?!models)[^"]*|/generate)"')
_REFUSED_RE = re.compile(r'status_code="40[13]"')
_HEALTH_RE = re.compile(r'^smg_worker_health\{worker="([^"]*)"\}\s+(\S+)')
_ACTIVE = "smg_worker_requests_active"


def choose_port(first: int, avoid: Sequence[int], free: Callable[[int], bool] = port_free,
                span: int = PORT_SCAN) -> int:
    """The first port from ``first`` up whose port and the one above it are free and not in ``avoid``."""
    for port in range(first, min(first + span, 65535)):
        if port in avoid or port + 1 in avoid:
            continue
        if free(port) and free(port + 1):
            return port
    raise LaunchFailure(f"no free router port on node 0 in {first}-{first + span - 1} (ROUTER_PORT and the ports "
                        "above it are in use); set ROUTER_PORT to a free range in your SERVE_ENV_FILE")


def read_counters(text: str) -> Counters | None:
    """The router's client requests: finished = every answer on a request path (``smg_http_responses_total``,
    every status but a refused key's 401/403), in flight = ``smg_worker_requests_active`` summed. None without the family."""
    finished, seen = 0.0, False
    for line in text.splitlines():
        if _REQUEST_PATH_RE.match(line) and not _REFUSED_RE.search(line):
            finished += float(line.rsplit(None, 1)[1])
        if line.startswith("smg_http_responses_total"):
            seen = True
    values = parse_prometheus(text)
    in_flight = values.get(_ACTIVE, 0.0)
    if not seen and _ACTIVE not in values and "smg_http_requests_total" not in text:
        return None
    return Counters(finished, in_flight)


def worker_health(text: str) -> dict[str, bool]:
    """Each worker URL smg knows and whether its own health checks call it healthy."""
    return {m.group(1): float(m.group(2)) > 0 for m in map(_HEALTH_RE.match, text.splitlines()) if m}


_OUTCOME_RE = re.compile(r'^smg_worker_cb_outcomes_total\{worker="([^"]*)"[^}]*\}\s+(\S+)')
_ACTIVE_RE = re.compile(r'^smg_worker_requests_active\{worker="([^"]*)"\}\s+(\S+)')


def worker_requests(text: str) -> dict[str, float]:
    """Each worker URL smg routed to and a count that moves with every request it got: the requests
    finished (``smg_worker_cb_outcomes_total``, every outcome) plus those in flight."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _OUTCOME_RE.match(line) or _ACTIVE_RE.match(line)
        if m:
            try:
                out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
            except ValueError:
                continue
    return out


def _call(method: str, url: str, api_key: str | None, body: dict | None = None,
          timeout_s: float = 5.0) -> tuple[int | None, str]:
    """(status, text) of one request to smg's control API (an error body too); (None, what failed) when
    nothing answered."""
    from ..httpclient import request

    answer = request(method, url, timeout_s, json_body=body, api_key=api_key)
    return answer.status, answer.text() if answer.status is not None else f"{url}: {answer.reason}"


def _get(url: str, api_key: str | None, timeout_s: float = 2.0) -> tuple[int | None, str]:
    """(status, text) of a GET through the one HTTP client; (None, "") when nothing answered."""
    from ..httpclient import get

    answer = get(url, timeout_s, api_key=api_key, accept=None)
    return answer.status, answer.text()


class Router:
    """One router process beside the launcher on node 0."""

    def __init__(self, keys: Mapping[str, str], shape: str, api_port: int, worker_urls: Sequence[str],
                 run_dir: Path, api_key: str | None, say: Callable[[str], None], *, url_host: str,
                 python: str = sys.executable, popen: Callable = subprocess.Popen,
                 get: Callable[..., tuple[int | None, str]] = _get, free: Callable[[int], bool] = port_free,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 wall: Callable[[], float] = time.time, write: Callable[[Path, dict], object] | None = None,
                 call: Callable[..., tuple[int | None, str]] = _call):
        self.keys, self.shape, self.api_port = keys, shape, api_port
        self.workers = [worker_root(u) for u in worker_urls]
        self.run_dir, self.api_key, self.say, self.url_host = run_dir, api_key, say, url_host
        self.python, self.popen, self.get, self.free = python, popen, get, free
        self.clock, self.sleep, self.wall, self.call = clock, sleep, wall, call
        self.write = write if write is not None else RecordWriter(say).write_json
        self.health: dict[str, bool] | None = None  # what smg's health checks said at the last read
        self.proc = None
        self.plan: RouterPlan | None = None

    @property
    def url(self) -> str:
        return host_port_base(self.url_host, self.plan.port)

    @property
    def metrics_url(self) -> str:
        """The router's Prometheus text, where clients reach it: node 0, the port above the router's."""
        return f"http://{self.url_host}:{self.plan.metrics_port}/metrics"

    @property
    def local(self) -> str:
        """Where the launcher reaches it: loopback for a wildcard or loopback bind, else the bound host."""
        host = self.plan.host
        if host in ("0.0.0.0", "0", "::", "") or host.startswith("127.") or host in ("localhost", "::1"):
            return "127.0.0.1"
        return host

    def start(self) -> None:
        """Choose the port, start smg, wait until it routes to the replicas; LaunchFailure when it cannot."""
        try:
            wanted = plan_router(self.keys, self.shape, self.api_port, self.workers, self.api_key is not None)
        except EnvLayersError as err:
            raise LaunchFailure(str(err)) from None
        port = choose_port(wanted.port, [self.api_port], self.free)
        self.plan = plan_router(self.keys, self.shape, self.api_port, self.workers, self.api_key is not None,
                                port=port)
        if port != wanted.port:
            self.say(TOPOLOGY.line(f"router_port={port} (ROUTER_PORT={wanted.port} or the port above it is in "
                                   "use on node 0; the first free pair above it)"))
        self.say(STAGE.line(f"starting the router on node 0: {self.plan.line()}"))
        env = {k: v for k, v in os.environ.items() if k != "SERVER_API_KEY"}
        env["NO_COLOR"] = "1"
        if self.api_key is not None:
            env[KEY_ENV] = self.api_key
        log = open(self.run_dir / ROUTER_LOG, "ab")  # noqa: SIM115 - the child holds it
        try:
            self.proc = self.popen([self.python, "-c", ENTRY, *self.plan.argv[2:]], stdout=log,
                                   stderr=subprocess.STDOUT, env=env, start_new_session=True)
        finally:
            log.close()
        self.wait_ready()

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        deadline = self.clock() + timeout_s
        models = host_port_base(self.local, self.plan.port) + "/models"
        healthy: dict[str, bool] = {}
        while True:
            code = self.proc.poll()
            if code is not None:
                raise LaunchFailure(f"the router exited with code {code} before it answered; see "
                                    f"{self.run_dir / ROUTER_LOG} (is smg installed in {self.python}? "
                                    "pip install 'envlayers[router]')")
            status, _ = self.get(models, self.api_key)
            if status == 200:
                _, text = self.get(f"http://{self.local}:{self.plan.metrics_port}/metrics", None)
                healthy = worker_health(text)
                if sum(healthy.values()) >= len(self.workers):
                    break
            if self.clock() >= deadline:
                if status == 200 and any(healthy.values()):
                    self.say(WARN.line(f"the router routes to {sum(healthy.values())} of {len(self.workers)} "
                                       f"replicas after {timeout_s:.0f}s; it adds the others once their "
                                       "/health answers"))
                    break
                self.stop()
                raise LaunchFailure(f"the router did not route to any replica within {timeout_s:.0f}s (last "
                                    f"answer on /v1/models: {status}); see {self.run_dir / ROUTER_LOG}")
            self.sleep(0.5)
        self.say(STAGE.line(f"router live at {self.url} in front of {len(self.workers)} replica(s) "
                            f"(policy {self.plan.policy}; metrics at "
                            f"http://127.0.0.1:{self.plan.metrics_port}/metrics on node 0)"))

    def record(self) -> dict:
        """The ``router`` entry of endpoint.json."""
        return {"kind": "smg", "base_url": self.url, "port": self.plan.port, "policy": self.plan.policy,
                "metrics_url": self.metrics_url, "workers": list(self.workers),
                "log": str(self.run_dir / ROUTER_LOG), "pid": self.proc.pid if self.proc is not None else None}

    def tick(self) -> None:
        """Once per supervision pass: the job ends when the router is gone (its one URL is the endpoint)."""
        if self.proc is not None and self.proc.poll() is not None:
            raise LaunchFailure(f"the router exited with code {self.proc.returncode} after the endpoint was live; "
                                f"see {self.run_dir / ROUTER_LOG}")

    def metrics(self) -> str | None:
        status, text = self.get(f"http://{self.local}:{self.plan.metrics_port}/metrics", None)
        return text if status == 200 else None

    def counters(self) -> Counters | None:
        """The router's request counters (None when its /metrics did not answer); on the way, what its
        health checks say of each worker goes to ``router-state.json`` for ``status``, and a change is said."""
        text = self.metrics()
        if text is None:
            return None
        self.note_health(worker_health(text))
        return read_counters(text)

    def note_health(self, health: dict[str, bool]) -> None:
        """Record smg's view of its workers when it changed; one line per worker that went down or came back."""
        if not health or health == self.health:
            return
        before = self.health or {}
        for url, ok in health.items():
            if before.get(url, True) != ok:
                self.say((STAGE if ok else WARN).line(
                    f"router: {url} {'healthy again' if ok else 'marked down'} by its health checks "
                    f"({sum(health.values())} of {len(health)} replica(s) healthy)"))
        self.health = dict(health)
        self.write(self.run_dir / ROUTER_STATE, RouterState(dict(health), round(self.wall(), 3)).to_dict())

    # smg's worker API (``POST /workers``, ``GET /workers``, ``DELETE /workers/{id}``): the elastic pool's
    # replicas join and leave the rotation while the router runs (launch/pool.py)
    def add_worker(self, url: str) -> str | None:
        """Ask smg to route to ``url`` too (it checks the worker, then adds it); None when it accepted, else why not."""
        body = {"url": worker_root(url)}
        if self.api_key is not None:
            body["api_key"] = self.api_key  # what smg sends to this worker, as to the others
        status, text = self.call("POST", f"http://{self.local}:{self.plan.port}/workers", self.api_key, body)
        return None if status in (200, 201, 202) else f"POST /workers answered {status}: {text.strip()[:200]}"

    def listed(self) -> dict[str, tuple[str, bool]] | None:
        """smg's workers: URL -> (its id, ready and healthy); None when smg did not answer."""
        import json

        status, text = self.call("GET", f"http://{self.local}:{self.plan.port}/workers", self.api_key)
        if status != 200:
            return None
        try:
            rows = json.loads(text).get("workers") or []
        except (ValueError, AttributeError):
            return None
        return {str(w.get("url")): (str(w.get("id")), bool(w.get("is_healthy")) and w.get("status") == "ready")
                for w in rows if isinstance(w, dict)}

    def remove_worker(self, url: str) -> str | None:
        """Take ``url`` out of the rotation (smg drains it); None when done or it was not there, else why not."""
        listed = self.listed()
        if listed is None:
            return "GET /workers did not answer"
        entry = listed.get(worker_root(url))
        if entry is None:
            return None
        status, text = self.call("DELETE", f"http://{self.local}:{self.plan.port}/workers/{entry[0]}", self.api_key)
        return None if status in (200, 202, 204, 404) else f"DELETE /workers answered {status}: {text.strip()[:200]}"

    def stop(self, grace_s: float = 8.0) -> None:
        if self.proc is not None:
            stop_group(self.proc, signal.SIGTERM, grace_s)
