"""An endpoint's two URLs, each made from the other: the OpenAI base URL clients use
(``http://host:port/v1``) and the server's root (``http://host:port``), where ``/health`` and
``/metrics`` are. The one place that adds or removes ``/v1``.

Pure text: no check that the text is a URL (the commands that take one from the operator check it
first: ``access/ping``, ``verify/target``).
"""

from __future__ import annotations

API_PATH = "/v1"


def server_root(url: str) -> str:
    """A base URL (``http://host:port/v1``, a trailing ``/`` or not) -> the server's root
    (``http://host:port``); a URL without ``/v1`` is taken as the root already."""
    base = url.rstrip("/")
    return base[:-len(API_PATH)] if base.endswith(API_PATH) else base


def api_base(url: str) -> str:
    """A server's root or a base URL (a trailing ``/`` or not) -> the base URL, ending in ``/v1``."""
    return server_root(url) + API_PATH


def host_port_base(host: str, port: int) -> str:
    """The base URL of a server on ``host:port`` (plain HTTP, as the engines serve)."""
    return api_base(f"http://{host}:{port}")
