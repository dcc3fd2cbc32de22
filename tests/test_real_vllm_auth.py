"""Which paths the real vLLM answers without its API key (docs/access.md, "What the key guards").

vLLM checks ``--api-key`` only for paths under /v1, /v2, /inference and /cohere
(vllm/entrypoints/serve/middleware/authenticate.py, GUARDED_PREFIX). Measured here on the pinned CPU build,
so a new pin that changes it fails this test and the docs are revisited.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest

realvllm = pytest.importorskip("realvllm")

pytestmark = pytest.mark.real_vllm
KEY = "k-auth-probe-0123456789"
CHAT = {"model": realvllm.SERVED, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
COMPLETION = {"model": realvllm.SERVED, "prompt": "Hi", "max_tokens": 1}


def call(root: str, method: str, path: str, body=None, key: str | None = None) -> int:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    req = urllib.request.Request(root + path, data=None if body is None else json.dumps(body).encode(),
                                 method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code


@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    with realvllm.serve(tmp_path_factory.mktemp("auth"), "--api-key", KEY, wait=False) as server:
        root = f"http://127.0.0.1:{server.port}"
        end = time.monotonic() + realvllm.LIVE_TIMEOUT_S
        while True:  # live: the guarded /v1/models answers with the key (the unguarded /health comes first)
            try:
                if call(root, "GET", "/v1/models", key=KEY) == 200:
                    break
            except OSError:
                pass  # not listening yet
            assert server.proc.poll() is None and time.monotonic() < end, server.log_tail()
            time.sleep(0.5)
        yield root


@pytest.mark.parametrize("method, path, body", [
    pytest.param("GET", "/v1/models", None, id="models"),
    pytest.param("POST", "/v1/completions", COMPLETION, id="completions"),
    pytest.param("POST", "/v1/chat/completions", CHAT, id="chat"),
])
def test_the_v1_paths_want_the_key(keyed, method, path, body):
    assert call(keyed, method, path, body) == 401
    assert call(keyed, method, path, body, key=KEY) == 200


@pytest.mark.parametrize("method, path, body", [
    # generation without the key: the SageMaker route takes a completion or a chat body
    pytest.param("POST", "/invocations", COMPLETION, id="invocations-completion"),
    pytest.param("POST", "/invocations", CHAT, id="invocations-chat"),
    pytest.param("POST", "/tokenize", {"model": realvllm.SERVED, "prompt": "Hi"}, id="tokenize"),
    pytest.param("POST", "/detokenize", {"model": realvllm.SERVED, "tokens": [1, 2]}, id="detokenize"),
    pytest.param("GET", "/metrics", None, id="metrics"),
    pytest.param("GET", "/load", None, id="load"),
    pytest.param("GET", "/version", None, id="version"),
])
def test_the_paths_vllm_answers_without_the_key(keyed, method, path, body):
    assert call(keyed, method, path, body) == 200


@pytest.mark.parametrize("method, path, body", [
    # the pooling model's routes, without /v1: vLLM serves them only for a pooling or score model; the
    # catalog's models generate, so they are not there (a 404 with the key as without it)
    pytest.param("POST", "/pooling", {"model": realvllm.SERVED, "input": "Hi"}, id="pooling"),
    pytest.param("POST", "/score", {"model": realvllm.SERVED, "text_1": "a", "text_2": "b"}, id="score"),
    pytest.param("POST", "/rerank", {"model": realvllm.SERVED, "query": "a", "documents": ["b"]}, id="rerank"),
    pytest.param("POST", "/classify", {"model": realvllm.SERVED, "input": "Hi"}, id="classify"),
    # the guard is a prefix of the exact path, and so are the routes: another spelling reaches nothing
    pytest.param("POST", "/V1/completions", COMPLETION, id="upper-case-v1"),
    pytest.param("POST", "//v1/completions", COMPLETION, id="double-slash"),
])
def test_the_unguarded_spellings_vllm_does_not_serve_for_a_generative_model(keyed, method, path, body):
    assert call(keyed, method, path, body) == 404
    assert call(keyed, method, path, body, key=KEY) == 404


@pytest.mark.parametrize("method, path, body", [
    pytest.param("POST", "/v1/tokenize", {"model": realvllm.SERVED, "prompt": "Hi"}, id="v1-tokenize"),
    pytest.param("POST", "/v1/rerank", {"model": realvllm.SERVED, "query": "a", "documents": ["b"]}, id="v1-rerank"),
    pytest.param("POST", "/v2/rerank", {"model": realvllm.SERVED, "query": "a", "documents": ["b"]}, id="v2-rerank"),
    pytest.param("POST", "/v1/embeddings", {"model": realvllm.SERVED, "input": "Hi"}, id="v1-embeddings"),
    pytest.param("POST", "/inference/v1/generate", {"model": realvllm.SERVED, "prompt": "Hi"}, id="inference"),
])
def test_the_guarded_prefixes_refuse_before_routing(keyed, method, path, body):
    # under a guarded prefix the key is checked before vLLM looks for the route (401, not 404)
    assert call(keyed, method, path, body) == 401


def test_the_ping_route_answers_without_the_key(keyed):
    assert call(keyed, "GET", "/ping") == 200 and call(keyed, "POST", "/ping") == 200
