"""urls.py is the one place that adds or removes ``/v1``: a base URL and a server's root, each from the other."""

from __future__ import annotations

import re

import pytest

from envlayers import urls
from srcscan import lines_matching


@pytest.mark.parametrize("url, root", [
    pytest.param("http://n1:8000/v1", "http://n1:8000", id="v1"),
    pytest.param("http://n1:8000/v1/", "http://n1:8000", id="v1-slash"),
    pytest.param("http://n1:8000", "http://n1:8000", id="root"),
    pytest.param("http://n1:8000/", "http://n1:8000", id="root-slash"),
    pytest.param("https://gw.example/llm/v1", "https://gw.example/llm", id="path-v1"),
])
def test_server_root_of_a_base_url(url, root):
    assert urls.server_root(url) == root


@pytest.mark.parametrize("url, base", [
    pytest.param("http://n1:8000", "http://n1:8000/v1", id="root"),
    pytest.param("http://n1:8000/", "http://n1:8000/v1", id="root-slash"),
    pytest.param("http://n1:8000/v1", "http://n1:8000/v1", id="v1"),
    pytest.param("http://n1:8000/v1/", "http://n1:8000/v1", id="v1-slash"),
    pytest.param("https://gw.example/llm", "https://gw.example/llm/v1", id="path"),
])
def test_api_base_of_a_root_or_a_base_url(url, base):
    assert urls.api_base(url) == base
    assert urls.server_root(urls.api_base(url)) == urls.server_root(url)  # the two are each other's inverse


def test_a_base_url_of_a_host_and_port():
    assert urls.host_port_base("n1", 8000) == "http://n1:8000/v1"


# "/v1" at the end of a string or an f-string: a URL made or taken apart by hand
_BY_HAND = re.compile(r"""["']/v1["']|/v1["']\s*(?:[,)\]]|$)|\[:-3\]""")
# the standalone scripts copied into the job (standard library only), and the owner itself
_ALLOWED = {"urls.py", "gateway_app.py", "launch/raynode.py"}


def test_no_module_but_urls_adds_or_removes_v1():
    offenders = lines_matching(_BY_HAND, _ALLOWED, ("e.g.", "such as"))  # examples in hints
    assert offenders == []


@pytest.mark.parametrize("line", [
    pytest.param('return f"http://{host}:{port}/v1"', id="f-string"),
    pytest.param('result = generate(root + "/v1", served)', id="concatenated"),
    pytest.param('root = base[:-3] if base.endswith("/v1") else base', id="cut"),
])
def test_the_v1_check_sees_a_url_made_by_hand(line):  # the test above can fail
    assert _BY_HAND.search(line)
