"""The Ray Serve gateway of the ``gateway`` shape: one endpoint in front of NUMBER_OF_INSTANCES vLLM servers.

Runs only inside a job, on node 0, after every node joined the Ray cluster (launch/raynode.py starts it);
the launcher copies this file into the run directory, so the ranks need Ray Serve but not envlayers.
Nothing imports it outside the job.

    python3 gateway_app.py --address HEAD:PORT --replicas N --max-per-node C --served NAME \\
                           --ready-timeout S -- vllm serve MODEL ... --host H --port P ...

One Serve deployment with N replicas, at most C on a node (the instances a node's GPUs fit). Each
replica starts its own copy of the ``vllm serve`` command after ``--`` (the Ray executor joins the
same cluster through RAY_ADDRESS), on a free port of its node's loopback, waits until it answers, and
then proxies every request to it, streaming the answer back. Serve's HTTP proxy listens on the
command's ``--host``/``--port`` on the head node, so clients see one endpoint. The gateway adds no
limit of its own: no request timeout, no cap on requests in flight or queued, no connection-pool limit.
It exits non-zero (and so ends the job) when the deployment fails or a replica's server dies.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

APP = "envlayers"
NO_LIMIT = 1_000_000  # Serve needs a number for requests in flight per replica; this one is never reached
HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding", "host", "upgrade",
       "proxy-connection", "te", "trailer"}
CHECK_EVERY_S = 2.0


def say(line: str) -> None:
    print(line, flush=True)


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


class Replica:
    """One instance: its own ``vllm serve`` on this node's loopback, and the proxy in front of it."""

    def __init__(self, argv: list[str], address: str, ready_timeout_s: float):
        import urllib.error
        import urllib.request

        self.port = free_port()
        self.argv = with_host_port(argv, "127.0.0.1", self.port)
        self.proc = subprocess.Popen(self.argv, env=dict(os.environ, RAY_ADDRESS=address), start_new_session=True)
        self.session = None
        deadline = time.monotonic() + ready_timeout_s
        url = f"http://127.0.0.1:{self.port}/v1/models"
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the replica's vllm serve exited with code {self.proc.returncode} before it "
                                   "answered")
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
        print(f"gateway replica: vllm serve pid {self.proc.pid} answers on 127.0.0.1:{self.port}", flush=True)

    async def __call__(self, request):
        import aiohttp
        from starlette.responses import StreamingResponse

        if self.session is None:  # made in the replica's event loop; no pool limit, no timeout
            self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                                 timeout=aiohttp.ClientTimeout(total=None), auto_decompress=False)
        url = f"http://127.0.0.1:{self.port}{request.url.path}"
        if request.url.query:
            url += "?" + request.url.query
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
        upstream = await self.session.request(request.method, url, headers=headers, data=await request.body())

        async def body():
            try:
                async for chunk in upstream.content.iter_any():
                    yield chunk
            finally:
                upstream.release()

        out = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP or k.lower() == "content-encoding"}
        return StreamingResponse(body(), status_code=upstream.status, headers=out)

    def check_health(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"the replica's vllm serve exited with code {self.proc.returncode}")

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass

    def __del__(self):
        self.stop()


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


def main(argv: list[str]) -> int:
    opts, server = parse(argv)
    import ray
    from ray import serve

    host, port = flag_value(server, "--host", "0.0.0.0"), int(flag_value(server, "--port", "8000"))
    replicas, cap = int(opts["replicas"]), int(opts["max-per-node"])
    ray.init(address=opts["address"], namespace="envlayers-gateway", logging_level="WARNING")
    serve.start(proxy_location="HeadOnly", http_options={"host": host, "port": port, "request_timeout_s": None})
    deployment = serve.deployment(
        Replica, name="vllm", num_replicas=replicas, max_replicas_per_node=cap, max_ongoing_requests=NO_LIMIT,
        max_queued_requests=-1, max_constructor_retry_count=1, ray_actor_options={"num_cpus": 0},
        health_check_period_s=2, health_check_timeout_s=30)
    say(f"ENVLAYERS-STAGE: gateway: deploying {replicas} replica(s), at most {cap} per node, behind "
        f"{host}:{port}")
    t0 = time.monotonic()
    try:
        serve.run(deployment.bind(server, opts["address"], float(opts["ready-timeout"])), name=APP, route_prefix="/")
    except Exception as err:
        say(f"ENVLAYERS-ERROR: gateway: the Serve deployment failed: {str(err).splitlines()[0] if str(err) else err!r}")
        return 1
    say(f"ENVLAYERS-STAGE: gateway: {replicas} replica(s) ready after {time.monotonic() - t0:.1f}s; Serve listens "
        f"on {host}:{port}")
    while True:
        time.sleep(CHECK_EVERY_S)
        app = serve.status().applications.get(APP)
        status = getattr(app, "status", "MISSING")
        status = str(getattr(status, "value", status))
        if status != "RUNNING":
            message = getattr(app, "message", "") or ""
            say(f"ENVLAYERS-ERROR: gateway: the Serve application is {status}: {message.splitlines()[0] if message else ''}")
            return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
