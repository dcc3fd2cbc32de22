"""Bad input to ``env_layers bench``: a clear error (exit 2) before any load is sent.

Every case fails on its arguments alone; the URL's port is one nothing listens on, so a case that
got past its checks would fail with exit 1 (preflight) instead, and the test would say so.
"""

from __future__ import annotations

import pytest

from malformed_tools import assert_clean_error, run_cli

URL = "http://127.0.0.1:9/v1"  # discard port: nothing answers


@pytest.mark.parametrize("args, needles", [
    pytest.param(("--concurrency", "1,x,4"), ("--concurrency '1,x,4': 'x' is not a whole number", "e.g. --concurrency 1,4,16"),
                 id="concurrency-word"),
    pytest.param(("--concurrency", "0"), ("'0' is not a whole number from 1 to 512",), id="concurrency-zero"),
    pytest.param(("--concurrency", "1,,4"), ("'' is not a whole number",), id="concurrency-empty-item"),
    pytest.param(("--concurrency", "-4"), ("'-4' is not a whole number",), id="concurrency-negative"),
    pytest.param(("--concurrency", "100000"), ("'100000' is not a whole number from 1 to 512",), id="concurrency-huge"),
    pytest.param(("--concurrency", "4,1,4"), ("4 is given twice",), id="concurrency-repeat"),
    pytest.param(("--concurrency", "1,64", "--requests", "32"),
                 ("--concurrency 64 is more than --requests 32", "give --requests 64 or more"), id="concurrency-over-requests"),
    pytest.param(("--requests", "0"), ("--requests",), id="requests-zero"),
    pytest.param(("--requests", "1000001"), ("--requests",), id="requests-huge"),
    pytest.param(("--duration-s", "0"), ("--duration-s",), id="duration-zero"),
    pytest.param(("--timeout-s", "nan"), ("--timeout-s",), id="timeout-nan"),
    pytest.param(("--output-tokens", "0"), ("--output-tokens",), id="output-tokens-zero"),
    pytest.param(("--plot", "bench.svg"), ("--plot 'bench.svg': the plot is a PNG",), id="plot-not-png"),
    pytest.param(("--plot", "/nonexistent/dir/bench.png"), ("/nonexistent/dir is not a writable folder",),
                 id="plot-no-folder"),
    pytest.param(("--api-key-file", "/nonexistent/key"), ("--api-key-file /nonexistent/key: the key file does not exist",),
                 id="key-file-missing"),
])
def test_bad_bench_options(args, needles):
    assert_clean_error(run_cli("bench", URL, *args), *needles)


@pytest.mark.parametrize("target, needles", [
    pytest.param("ftp://gw/v1", ("'ftp://gw/v1' is neither a job id nor an http(s) URL",), id="scheme"),
    pytest.param("http://127.0.0.1:99999/v1", ("has an invalid port",), id="port"),
    pytest.param("", ("'' is neither a job id nor an http(s) URL",), id="empty"),
])
def test_bad_bench_target(target, needles):
    assert_clean_error(run_cli("bench", target), *needles)


def test_plot_without_matplotlib_says_how_to_install(tmp_path):
    """The extra is missing (matplotlib hidden from this interpreter): exit 2 with the install line, no file."""
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['matplotlib'] = None\n")
    import os

    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = run_cli("bench", URL, "--plot", str(tmp_path / "b.png"), env=env)
    assert_clean_error(proc, "--plot needs matplotlib", "pip install 'envlayers[bench]'")
    assert not (tmp_path / "b.png").exists()
