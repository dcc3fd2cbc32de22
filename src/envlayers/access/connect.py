"""``connect``: what a client needs to use a job's endpoint (base URLs, model name, key or key file).

A dict built from :class:`envlayers.access.job.JobAccess` (cli.access_format prints it); the key itself
appears only when the caller asks for it and owns the key file. A job of a chain (``SUCCESSORS``) whose successor serves is
followed to the newest live link (``job.newest_live``): its details are given, with a ``moved:`` line.
"""

from __future__ import annotations

from ..apikey import mode_warning
from ..urls import host_port_base
from .gateway import route_url
from .job import JobAccess


def connect_info(acc: JobAccess, *, show_key: bool = False, uid: int | None = None, follow: bool = True) -> dict:
    info = acc.job.info
    moved = acc.job.newest_live() if follow else None
    if moved:  # a successor serves now: what a client needs is the successor's
        from .job import open_job

        data = connect_info(open_job(moved["to"], run_dir=moved["run_dir"], uid=uid), show_key=show_key, uid=uid,
                            follow=False)
        data["moved"] = {**moved, "from_state": info.state if info else None}
        return data
    tunnel = acc.tunnel()  # settled: a tunnel that ended with its job or step says closed
    gateway = closed = None
    if tunnel is not None and tunnel.state in ("open", "closed") and tunnel.gateway:
        route = {"destination": tunnel.gateway["destination"],
                 "base_url": route_url(tunnel.remote_bind, tunnel.remote_port), "provider_model_id": acc.served}
        if tunnel.state == "open":
            gateway = route
        else:
            closed = {**route, "closed_at": tunnel.closed_at, "closed_why": tunnel.closed_why}
    data = {
        "job_id": acc.job_id,
        "state": info.state if info else None,
        "live": acc.live,
        "base_urls": acc.base_urls,
        "reachable_urls": acc.reachable_urls,
        "served_model_name": acc.served,
        "api_key_required": acc.key_required,
        "api_key_file": acc.key_file if acc.key_required else None,
        "gateway": gateway,  # an open tunnel's route
        "tunnel_closed": closed,  # a closed tunnel's route, with when and why it closed
        "run_dir": str(acc.run_dir) if acc.run_dir else None,
        "moved": None,
        "laptop": laptop_route(acc, gateway),
        "warnings": [],
    }
    if acc.key_required and acc.key_file:
        warning = mode_warning(acc.key_file, "the key file")
        if warning:
            data["warnings"].append(warning)
    if show_key:
        if not acc.key_required:
            data["warnings"].append("the endpoint takes no key: there is none to show")
        elif not acc.key_file:
            data["warnings"].append("the key's file is not recorded in the run directory")
        else:
            data["api_key"] = acc.read_key(uid)
    return data


def laptop_route(acc: JobAccess, gateway: dict | None, login: str | None = None, user: str | None = None) -> dict | None:
    """From a laptop outside the cluster: an ssh local forward through the host this runs on (the login
    node, which reaches the compute nodes), and the base URL the laptop then uses. With a gateway tunnel
    open, through the gateway host instead; a server bound to its node's loopback (SERVER_HOST=127.0.0.1)
    is reached by jumping through the login node to the compute node itself. None before the endpoint
    has an address."""
    import getpass
    import socket
    from urllib.parse import urlsplit

    user = user or getpass.getuser()
    login = login or socket.getfqdn()
    if gateway:
        parts = urlsplit(gateway["base_url"])
        port = parts.port
        ssh = ["ssh", "-N", "-L", f"{port}:{parts.hostname}:{port}", gateway["destination"]]
        return {"ssh": ssh, "base_url": host_port_base("127.0.0.1", port), "through": gateway["destination"]}
    urls = acc.reachable_urls
    if not urls:
        return None
    parts = urlsplit(urls[0])
    if parts.hostname is None or parts.port is None:
        return None
    port, host = parts.port, parts.hostname
    node_local = acc.endpoint is not None and acc.endpoint.node_local
    nodes = acc.endpoint.nodes if acc.endpoint is not None else []
    if node_local and nodes:  # only the node itself reaches it: forward from the node, jumping through login
        ssh = ["ssh", "-N", "-J", f"{user}@{login}", "-L", f"{port}:127.0.0.1:{port}", f"{user}@{nodes[0]}"]
    else:
        ssh = ["ssh", "-N", "-L", f"{port}:{host}:{port}", f"{user}@{login}"]
    return {"ssh": ssh, "base_url": host_port_base("127.0.0.1", port), "through": login}
