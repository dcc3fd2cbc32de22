"""The Ray Serve gateway of the ``gateway`` shape: one endpoint in front of NUMBER_OF_INSTANCES vLLM servers.

Runs inside a job only, on node 0, once every node joined the Ray cluster (launch/raynode.py starts it),
from the run directory: the ranks need Ray Serve, not envlayers.

    python3 gateway_app.py --address HEAD:PORT --replicas N --max-per-node C --served NAME --ready-timeout S
        [--min-replicas M] [--replace-timeout R] -- vllm serve MODEL ... --host H --port P ...

One Serve deployment with N replicas, at most C on a node. Each replica runs its own copy of the command
after ``--`` (its Ray executor joins through RAY_ADDRESS) on a free loopback port of its node and streams
every request to it. Serve listens on the command's ``--host``/``--port`` on the head node: one endpoint,
with no limit of the gateway's own (no request timeout, no cap on requests in flight or queued, no pool limit).

``GET /metrics`` is answered by the gateway itself: every replica's metrics in one Prometheus text
exposition, each sample labelled ``replica="<i>"`` (:func:`merge_expositions`). No node can reach
another's loopback, so each replica starts a reader actor pinned to its node and registers it with the
named :class:`MetricsRegistry` (made by ``main``), which reads them all with a bounded timeout.

A replica's server dies with the replica's actor: it runs in a process group of its own, which the
actor's shutdown stops (SIGTERM, SIGKILL after ``SERVER_GRACE_S``), and when the actor is killed outright
(Serve or Ray force-kills it, SIGKILL) a small guard process the actor started (:data:`GUARD`, outside the
actor's process tree) sees the actor's end of a pipe close and stops that group the same way.

Replicas survive a peer: a replica whose server dies reports it (``ENVLAYERS-ERROR: gateway: replica
<i> on <node>: ...``, with the exit code) and ends its actor, and Serve starts a new replica (a new
server) while the others serve on. The job ends only when fewer than ``--min-replicas`` are healthy
for longer than ``--replace-timeout`` seconds (:class:`Survival`), or when Serve gives up (DEPLOY_FAILED).

What the gateway sees of its replicas (how many Serve reports healthy, the latest replica events) it also
keeps in ``gateway-state.json`` beside this script in the run directory (:class:`StateFile`, replaced
atomically), which the launcher and ``status`` read (envlayers/rundir.py owns that file's name and record;
this script runs with the standard library only, so it repeats the name, and a test keeps the two equal).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

APP = "envlayers"
KEY_ENV = "VLLM_API_KEY"  # where each replica's vllm serve reads the endpoint's key
KEY_VARS = ("VLLM_API_KEY", "SERVER_API_KEY")  # never inherited from Ray's worker processes
NO_LIMIT = 1_000_000  # Serve needs a number for requests in flight per replica; this one is never reached
HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding", "host", "upgrade",
       "proxy-connection", "te", "trailer"}
CHECK_EVERY_S = 2.0
REGISTRY = "envlayers-metrics"  # the named actor replicas register their metrics readers with
NAMESPACE = "envlayers-gateway"
READ_TIMEOUT_S = 3.0  # one replica's /metrics read, through its reader actor
READER_START_S = 60.0  # at least this long for a replica's reader actor to start before it registers
SERVER_GRACE_S = 5.0  # a replica's server: SIGTERM, then SIGKILL to what is left of its group after this
RECOVERED_AFTER_S = 30.0  # enough replicas healthy this long: a recovery, not a replacement about to die again
PROMETHEUS = "text/plain; version=0.0.4; charset=utf-8"
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_:")
_SUFFIXES = ("_bucket", "_sum", "_count", "_total", "_created", "_info", "_gcount", "_gsum")
STATE_FILE = "gateway-state.json"  # the name envlayers/rundir.py owns (GATEWAY_STATE); a test keeps them equal
KEEP_EVENTS = 5  # the latest replica events the state file keeps (rundir.GatewayState.KEEP_EVENTS)


def say(line: str) -> None:
    print(line, flush=True)


class StateFile:
    """``gateway-state.json``: the replicas Serve reports healthy of how many, the survival settings, the
    Serve application's status and the latest replica events (``replica 1 on n2: ...``), rewritten
    atomically (a temporary file renamed over it) whenever one of them changes. A write the OS refuses is
    said once (until one succeeds again); the gateway serves on."""

    def __init__(self, path: str, say=say):
        self.path, self.say = path, say
        self.record = {"healthy": None, "replicas": None, "min_replicas": None, "grace_s": None,
                       "serve_status": None, "events": []}
        self.failing: str | None = None

    def update(self, **fields) -> None:
        if any(self.record.get(k) != v for k, v in fields.items()):
            self.record.update(fields)
            self.write()

    def event(self, line: str) -> None:
        """One of the gateway's replica lines (``ENVLAYERS-ERROR: gateway: replica 1 on n2: ...``)."""
        self.record["events"] = (self.record["events"] + [line.split(": ", 2)[-1]])[-KEEP_EVENTS:]
        self.write()

    def write(self) -> None:
        tmp = f"{self.path}.tmp{os.getpid()}"
        try:
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write(json.dumps(self.record, indent=2) + "\n")
            os.replace(tmp, self.path)
        except OSError as err:
            why = err.strerror or str(err)
            if why != self.failing:
                self.say(f"ENVLAYERS-WARN: gateway: cannot write {self.path}: {why}; status shows no replica count")
            self.failing = why
            return
        self.failing = None


def with_host_port(argv: list[str], host: str, port: int) -> list[str]:
    """``argv`` with every ``--host``/``--port`` (both spellings) replaced by ``host`` and ``port``."""
    out, skip = [], False
    for i, word in enumerate(argv):
        if skip:
            skip = False
            continue
        if word in ("--host", "--port"):
            skip = True
            continue
        if word.startswith(("--host=", "--port=")):
            continue
        out.append(word)
    return out + ["--host", host, "--port", str(port)]


def flag_value(argv: list[str], name: str, default: str) -> str:
    value = default
    for i, word in enumerate(argv):
        if word == name and i + 1 < len(argv):
            value = argv[i + 1]
        elif word.startswith(name + "="):
            value = word.split("=", 1)[1]
    return value


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _sample_name(line: str) -> str:
    end = 0
    while end < len(line) and line[end] in _NAME_CHARS:
        end += 1
    return line[:end]


def _labelled(line: str, name: str, replica: str) -> str:
    """A sample line with ``replica="<replica>"`` first in its label set (one is made when it has none)."""
    rest = line[len(name):]
    label = f'replica="{replica}"'
    if rest.startswith("{"):
        inner = rest[1:]
        return f"{name}{{{label}{'' if inner.lstrip().startswith('}') else ','}{inner}"
    return f"{name}{{{label}}}{rest}"


def merge_expositions(texts: list[tuple[str, str | None]], why: dict[str, str] | None = None) -> str:
    """Prometheus text expositions of several replicas -> one: every sample gets a ``replica`` label
    (first in its label set), each family's HELP and TYPE lines appear once, families in first-seen
    order with all their samples together. ``texts`` is ``(replica, text or None)``; a replica whose
    text is None is named in a comment line (``why[replica]`` says what happened). Pure."""
    families: dict[str, dict] = {}  # name -> {"help": line, "type": line, "samples": [...]}, insertion ordered
    missing = []
    for replica, text in texts:
        if text is None:
            missing.append(replica)
            continue
        current = None  # the family the last HELP/TYPE line named: its samples may carry suffixes
        for raw in text.splitlines():
            line = raw.rstrip()
            if not line.strip():
                continue
            if line.startswith("#"):
                words = line.split(None, 3)
                if len(words) >= 3 and words[1] in ("HELP", "TYPE"):
                    current = words[2]
                    fam = families.setdefault(current, {"help": None, "type": None, "samples": []})
                    key = words[1].lower()
                    if fam[key] is None:
                        fam[key] = line
                continue  # other comments (and # EOF) are dropped
            name = _sample_name(line)
            if not name or name[0].isdigit():
                continue  # not a sample line
            if current is None or not (name == current or (name.startswith(current) and
                                                           name[len(current):] in _SUFFIXES)):
                current = name
            fam = families.setdefault(current, {"help": None, "type": None, "samples": []})
            fam["samples"].append(_labelled(line, name, replica))
    out = [f'# replica="{r}" did not answer: {(why or {}).get(r) or "no metrics"}' for r in missing]
    for fam in families.values():
        out += [line for line in (fam["help"], fam["type"]) if line is not None]
        out += fam["samples"]
    return "\n".join(out) + "\n" if out else ""


class MetricsReader:
    """Made by a replica on its own node (Ray actor, node-pinned): reads that node's server's /metrics."""

    def __init__(self, port: int):
        self.port = port

    def ping(self) -> bool:
        return True

    def read(self, timeout_s: float) -> str:
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=timeout_s) as resp:
            return resp.read(16 << 20).decode("utf-8", "replace")


class MetricsRegistry:
    """The named actor ``main`` makes: which replica holds which index and reader, and what happened to
    the replicas (lines ``main`` prints). An index freed by a dead replica goes to its replacement."""

    def __init__(self):
        self.readers: dict[int, tuple] = {}  # index -> (reader actor, node)
        self.seen: set[int] = set()
        self.events: list[str] = []

    def _prune(self) -> None:
        import ray

        refs = {i: reader.ping.remote() for i, (reader, _node) in self.readers.items()}
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=5) if refs else ([], [])
        for i, ref in refs.items():
            if ref in ready:
                try:
                    ray.get(ref)
                except Exception:  # the reader died with the replica that made it
                    self.readers.pop(i, None)

    def register(self, reader, node: str, pid: int, port: int) -> int:
        self._prune()
        index = 0
        while index in self.readers:
            index += 1
        self.readers[index] = (reader, node)
        if index in self.seen:
            self.events.append(f"ENVLAYERS-STAGE: gateway: replica {index} on {node} replaced: its new vllm serve "
                               f"(pid {pid}) answers on 127.0.0.1:{port}")
        self.seen.add(index)
        return index

    def died(self, index: int, line: str) -> None:
        self.readers.pop(index, None)
        self.events.append(line)

    def take_events(self) -> list[str]:
        out, self.events = self.events, []
        return out

    def gather(self, timeout_s: float) -> tuple[list[tuple[str, str | None]], dict[str, str]]:
        """Every registered replica's /metrics text (None where it did not answer in time), and why not."""
        import ray

        refs = {i: reader.read.remote(timeout_s) for i, (reader, _node) in sorted(self.readers.items())}
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s + 1) if refs else ([], [])
        texts, why = [], {}
        for i, ref in refs.items():
            text = None
            if ref not in ready:
                why[str(i)] = f"no answer within {timeout_s + 1:.0f}s"
            else:
                try:
                    text = ray.get(ref)
                except Exception as err:
                    why[str(i)] = (str(err).strip().splitlines() or [type(err).__name__])[-1][:200]
            texts.append((str(i), text))
        return texts, why


# The guard of one replica's server, run as ``python3 -c GUARD FD GRACE_S ACTOR_PID``. It forks and the first
# process exits, so the guard is nobody's child in the actor's tree (Ray kills a dying worker's children).
# It reads the server's process group id from the pipe FD, then waits for the pipe to close: that happens
# when the actor process ends, however it ends (the kernel closes its descriptors, SIGKILL included).
# Whatever is then left of the group gets SIGTERM, and SIGKILL after GRACE_S. Standard library only.
GUARD = r"""
import os, signal, sys, time
if os.fork():
    os._exit(0)
fd, grace, actor = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
data = b""
while True:
    chunk = os.read(fd, 64)
    if not chunk:
        break
    data += chunk
words = data.split()
if not words:
    sys.exit(0)  # the actor ended before it started its server
group = int(words[0])


def left():
    try:
        os.killpg(group, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


if not left():
    sys.exit(0)  # the actor stopped its server itself
how = "SIGTERM"
try:
    os.killpg(group, signal.SIGTERM)
except ProcessLookupError:
    sys.exit(0)
deadline = time.monotonic() + grace
while left() and time.monotonic() < deadline:
    time.sleep(0.1)
if left():
    how = f"SIGTERM, then SIGKILL after {grace:.0f}s"
    try:
        os.killpg(group, signal.SIGKILL)
    except ProcessLookupError:
        pass
print(f"gateway guard: the replica's actor (pid {actor}) ended with its vllm serve (pid {group}) still running; "
      f"stopped its process group ({how})", file=sys.stderr, flush=True)
"""


def start_guard(grace_s: float) -> int:
    """Start the guard of a server this process is about to start (:data:`GUARD`); the returned pipe end
    is written the server's process group id and kept open for as long as this process lives."""
    r, w = os.pipe()  # neither end is inherited by a server this process starts (close-on-exec)
    try:
        launcher = subprocess.Popen([sys.executable, "-c", GUARD, str(r), str(grace_s), str(os.getpid())],
                                    pass_fds=(r,), start_new_session=True, stdin=subprocess.DEVNULL)
        launcher.wait()  # it forked the guard and returned at once
    except BaseException:
        os.close(w)
        raise
    finally:
        os.close(r)
    return w


def start_guarded(argv: list[str], env: dict[str, str]) -> tuple[subprocess.Popen, int]:
    """``argv`` started in a process group of its own, with a guard that stops that group once this process
    ends (:data:`GUARD`); the guard's pipe end is returned, to be kept open (closing it ends the server)."""
    guard = start_guard(SERVER_GRACE_S)
    try:
        proc = subprocess.Popen(argv, env=env, start_new_session=True)
    except BaseException:
        os.close(guard)
        raise
    try:
        os.write(guard, f"{proc.pid}\n".encode())
    except OSError as err:  # the guard is gone: no server runs unguarded
        os.close(guard)
        stop_group(proc, SERVER_GRACE_S)
        raise RuntimeError(f"the guard of the replica's vllm serve is gone ({err.strerror}); stopped the server")
    return proc, guard


def stop_group(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM to ``proc``'s process group (``proc`` leads it), SIGKILL after ``grace_s`` to what is left;
    returns once the group is empty (at most ``grace_s`` more after the SIGKILL)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            proc.poll()  # reaps the leader: a zombie would still count as a member of its group
            try:
                os.killpg(proc.pid, 0)
            except (ProcessLookupError, PermissionError):
                return
            time.sleep(0.1)


def exit_words(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name} (exit code {128 - code})"
        except ValueError:
            return f"was killed by signal {-code} (exit code {128 - code})"
    return f"exited with code {code}"


class Replica:
    """One instance: its own ``vllm serve`` on this node's loopback, and the proxy in front of it."""

    def __init__(self, argv: list[str], address: str, ready_timeout_s: float, key_file: str | None = None):
        import urllib.error
        import urllib.request

        self.port = free_port()
        self.argv = with_host_port(argv, "127.0.0.1", self.port)
        env = {k: v for k, v in os.environ.items() if k not in KEY_VARS}
        env["RAY_ADDRESS"] = address
        if key_file:  # the endpoint's key, read from its 0600 file: Ray's processes never carry it
            env[KEY_ENV] = read_key(key_file)
        # its own process group; a guard stops that group if this actor is killed outright
        self.proc, self.guard = start_guarded(self.argv, env)
        self.session = None
        self.index, self.registry, self.reported, self.closing = None, None, False, False
        self.node = socket.gethostname()
        deadline = time.monotonic() + ready_timeout_s
        url = f"http://127.0.0.1:{self.port}/v1/models"
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the replica's vllm serve {exit_words(self.proc.returncode)} before it answered")
            try:
                urllib.request.urlopen(url, timeout=2).close()
                break
            except urllib.error.HTTPError as err:  # 401 without the key: the server is up
                if err.code < 500:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the replica's vllm serve did not answer on port {self.port} within "
                                   f"{ready_timeout_s:.0f}s")
            time.sleep(0.5)
        self._register(max(READER_START_S, deadline - time.monotonic()))
        print(f"gateway replica {self.index}: vllm serve pid {self.proc.pid} answers on 127.0.0.1:{self.port} "
              f"(replica actor pid {os.getpid()})", flush=True)
        threading.Thread(target=self._watch, name="envlayers-server-watch", daemon=True).start()

    def _watch(self) -> None:
        """The server's exit: reported, and this actor ends at once, so Serve stops routing to it and replaces it."""
        code = self.proc.wait()
        if self.closing:
            return
        self._report(code)
        self.stop()
        os._exit(1)

    def _report(self, code: int) -> None:
        if self.reported or self.registry is None:
            return
        self.reported = True  # once; Serve then stops this replica
        line = (f"ENVLAYERS-ERROR: gateway: replica {self.index} on {self.node}: its vllm serve (pid {self.proc.pid}) "
                f"{exit_words(code)}; Ray Serve replaces the replica, the others keep serving")
        print(line, flush=True)
        try:
            import ray

            ray.get(self.registry.died.remote(self.index, line), timeout=5)
        except Exception:  # the gateway's main is gone (the job ends): nothing to tell
            pass

    def _register(self, bound_s: float) -> None:
        """A reader actor on this node, registered once it answers (so every registered replica can be read
        at once; a new actor's worker process can take many seconds to start on a busy node): the index
        this replica is labelled with in /metrics."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        node_id = ray.get_runtime_context().get_node_id()
        self.reader = ray.remote(MetricsReader).options(
            num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
        ).remote(self.port)
        try:
            ray.get(self.reader.ping.remote(), timeout=bound_s)
        except Exception as err:
            self.stop()
            raise RuntimeError(f"the replica's metrics reader did not start within {bound_s:.0f}s: "
                               f"{type(err).__name__}") from None
        self.registry = ray.get_actor(REGISTRY, namespace=NAMESPACE)
        self.index = ray.get(self.registry.register.remote(self.reader, self.node, self.proc.pid, self.port))

    async def metrics(self):
        from starlette.responses import Response

        texts, why = await self.registry.gather.remote(READ_TIMEOUT_S)
        return Response(merge_expositions(texts, why), status_code=200, headers={"content-type": PROMETHEUS})

    async def __call__(self, request):
        import aiohttp
        from starlette.responses import JSONResponse, StreamingResponse

        if request.method == "GET" and request.url.path.rstrip("/") == "/metrics":
            return await self.metrics()
        if self.session is None:  # made in the replica's event loop; no pool limit, no timeout
            self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                                 timeout=aiohttp.ClientTimeout(total=None), auto_decompress=False)
        url = f"http://127.0.0.1:{self.port}{request.url.path}"
        if request.url.query:
            url += "?" + request.url.query
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
        try:
            upstream = await self.session.request(request.method, url, headers=headers, data=await request.body())
        except aiohttp.ClientConnectionError:  # this replica's server died under the request: the client retries
            return JSONResponse({"error": {"message": "this gateway replica's server is gone; Ray Serve replaces it, "
                                                      "retry", "type": "ServiceUnavailable", "code": 503}},
                                status_code=503, headers={"retry-after": "1"})

        async def body():
            try:
                async for chunk in upstream.content.iter_any():
                    yield chunk
            finally:
                upstream.release()

        out = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP or k.lower() == "content-encoding"}
        return StreamingResponse(body(), status_code=upstream.status, headers=out)

    def check_health(self) -> None:
        code = self.proc.poll()
        if code is not None and not self.closing:
            self._report(code)
            raise RuntimeError(f"the replica's vllm serve {exit_words(code)}")

    def stop(self) -> None:
        """The server's whole process group: SIGTERM, SIGKILL after SERVER_GRACE_S (Serve calls this on a
        graceful shutdown, through ``__del__``)."""
        self.closing = True
        stop_group(self.proc, SERVER_GRACE_S)

    def __del__(self):
        if getattr(self, "proc", None) is not None:
            self.stop()


def read_key(path: str) -> str:
    """The endpoint's API key from its file (the launcher checked it before srun)."""
    with open(path, encoding="utf-8") as fh:
        key = fh.read().strip()
    if not key:
        raise RuntimeError(f"the API key file {path} is empty")
    return key


def parse(argv: list[str]) -> tuple[dict, list[str]]:
    if "--" not in argv:
        raise SystemExit("gateway_app.py: expected `-- vllm serve ...` after the options")
    cut = argv.index("--")
    head, server = argv[:cut], argv[cut + 1:]
    opts = {k[2:]: v for k, v in zip(head[::2], head[1::2])}
    missing = [k for k in ("address", "replicas", "max-per-node", "ready-timeout") if k not in opts]
    if missing or not server:
        raise SystemExit(f"gateway_app.py: missing --{', --'.join(missing) or ' the server command'}")
    return opts, server


def healthy_count(app) -> int:
    """Replicas of the deployment Serve reports RUNNING (its health check passes)."""
    dep = (getattr(app, "deployments", None) or {}).get("vllm")
    states = getattr(dep, "replica_states", None) or {}
    return sum(n for state, n in states.items() if str(getattr(state, "value", state)) == "RUNNING")


class Survival:
    """The job's policy for dying replicas: end only after fewer than ``minimum`` replicas were healthy for
    longer than ``grace_s``; a recovery resets that clock once it has held for ``RECOVERED_AFTER_S``. Pure."""

    def __init__(self, minimum: int, grace_s: float):
        self.minimum, self.grace_s = minimum, grace_s
        self.below_since: float | None = None
        self.enough_since: float | None = None

    def feed(self, now: float, healthy: int) -> float | None:
        """Seconds below ``minimum`` once that is past the grace (the job ends), else None."""
        if healthy >= self.minimum:
            if self.enough_since is None:
                self.enough_since = now
            if now - self.enough_since >= RECOVERED_AFTER_S:
                self.below_since = None
            return None
        self.enough_since = None
        if self.below_since is None:
            self.below_since = now
        return now - self.below_since if now - self.below_since > self.grace_s else None


def main(argv: list[str]) -> int:
    opts, server = parse(argv)
    import ray
    from ray import serve

    host, port = flag_value(server, "--host", "0.0.0.0"), int(flag_value(server, "--port", "8000"))
    replicas, cap = int(opts["replicas"]), int(opts["max-per-node"])
    minimum = int(opts.get("min-replicas", "1"))
    grace_s = float(opts.get("replace-timeout", opts["ready-timeout"]))
    ray.init(address=opts["address"], namespace=NAMESPACE, logging_level="WARNING")
    registry = ray.remote(MetricsRegistry).options(name=REGISTRY, namespace=NAMESPACE, num_cpus=0).remote()
    serve.start(proxy_location="HeadOnly", http_options={"host": host, "port": port, "request_timeout_s": None})
    deployment = serve.deployment(
        Replica, name="vllm", num_replicas=replicas, max_replicas_per_node=cap, max_ongoing_requests=NO_LIMIT,
        max_queued_requests=-1, max_constructor_retry_count=1, ray_actor_options={"num_cpus": 0},
        health_check_period_s=2, health_check_timeout_s=30)
    say(f"ENVLAYERS-STAGE: gateway: deploying {replicas} replica(s), at most {cap} per node, behind "
        f"{host}:{port}")
    t0 = time.monotonic()
    try:
        serve.run(deployment.bind(server, opts["address"], float(opts["ready-timeout"]), opts.get("api-key-file")),
                  name=APP, route_prefix="/")
    except Exception as err:
        say(f"ENVLAYERS-ERROR: gateway: the Serve deployment failed: {str(err).splitlines()[0] if str(err) else err!r}")
        return 1
    say(f"ENVLAYERS-STAGE: gateway: {replicas} replica(s) ready after {time.monotonic() - t0:.1f}s; Serve listens "
        f"on {host}:{port}; GET /metrics answers every replica's metrics; replicas survive a peer (the job ends "
        f"after {grace_s:.0f}s with fewer than MIN_REPLICAS={minimum} healthy)")
    state = StateFile(os.path.join(os.path.dirname(os.path.abspath(__file__)), STATE_FILE))
    state.update(healthy=replicas, replicas=replicas, min_replicas=minimum, grace_s=round(grace_s))
    policy, last = Survival(minimum, grace_s), replicas
    while True:
        time.sleep(CHECK_EVERY_S)
        try:
            for line in ray.get(registry.take_events.remote(), timeout=10):
                say(line)
                state.event(line)
        except Exception as err:  # the registry is the gateway's own actor: report, keep watching Serve
            say(f"ENVLAYERS-WARN: gateway: the replica registry did not answer: {type(err).__name__}")
        app = serve.status().applications.get(APP)
        status = getattr(app, "status", "MISSING")
        status = str(getattr(status, "value", status))
        if status in ("DEPLOY_FAILED", "MISSING", "DELETING"):  # Serve gave up on the application
            state.update(serve_status=status)
            message = getattr(app, "message", "") or ""
            say(f"ENVLAYERS-ERROR: gateway: the Serve application is {status}: {message.splitlines()[0] if message else ''}")
            return 1
        healthy = healthy_count(app)
        state.update(healthy=healthy, serve_status=status)
        if healthy != last:
            say(f"ENVLAYERS-STAGE: gateway: {healthy} of {replicas} replica(s) healthy (Serve application "
                f"{status}; the job ends after {grace_s:.0f}s below MIN_REPLICAS={minimum})")
            last = healthy
        below = policy.feed(time.monotonic(), healthy)
        if below is not None:
            say(f"ENVLAYERS-ERROR: gateway: {healthy} of {replicas} replica(s) healthy, fewer than MIN_REPLICAS="
                f"{minimum} for {below:.0f}s, longer than the {grace_s:.0f}s Serve is given to replace them "
                "(GATEWAY_REPLACE_TIMEOUT_S): ending the job")
            return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
