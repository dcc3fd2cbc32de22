"""Bad input to connect, ping, tunnel and release: a clear one-line error (exit 2) before anything runs.

Every case here fails on its arguments alone: no Slurm, no ssh, no network is touched.
"""

from __future__ import annotations

import pytest

from malformed_tools import assert_clean_error, run_cli

TUNNEL = ("tunnel", "12345", "--to", "me@gw.example.org", "--remote-port", "8001")


@pytest.mark.parametrize("args, needles", [
    pytest.param((*TUNNEL, "--remote-bind", "0.0.0.0"), ("--remote-bind: '0.0.0.0' binds every interface",
                                                          "must stay private"), id="bind-any"),
    pytest.param((*TUNNEL, "--remote-bind", "*"), ("'*' binds every interface",), id="bind-star"),
    pytest.param((*TUNNEL, "--remote-bind", ""), ("an empty address",), id="bind-empty"),
    pytest.param((*TUNNEL, "--remote-bind", "localhost"), ("'localhost' is a name",), id="bind-localhost"),
    pytest.param((*TUNNEL, "--remote-bind", "10.0.0.9"), ("10.0.0.9 is not a loopback address",), id="bind-routable"),
    pytest.param((*TUNNEL, "--remote-bind", "gw.example.org"), ("not a numeric IP address",), id="bind-name"),
    pytest.param(("tunnel", "12345", "--to", "-oProxyCommand=sh", "--remote-port", "8001"),
                 ("--to: '-oProxyCommand=sh' is not a destination",), id="dest-option"),
    pytest.param(("tunnel", "12345", "--to", "me@gw", "--remote-port", "70000"),
                 ("--remote-port: 70000 is not a TCP port",), id="port-range"),
    pytest.param(("tunnel", "12345", "--to", "me@gw", "--remote-port", "8001", "--ssh-port", "0"),
                 ("--ssh-port: 0 is not a TCP port",), id="ssh-port"),
    pytest.param((*TUNNEL, "-o", "RemoteForward=0.0.0.0:9 127.0.0.1:8000"),
                 ("-o: -o RemoteForward is set by the tunnel itself",), id="option-forward"),
    pytest.param((*TUNNEL, "-o", "=yes"), ("-o: -o '=yes' is not an ssh option",), id="option-malformed"),
    pytest.param((*TUNNEL, "--identity", "/nonexistent/id_ed25519"),
                 ("--identity: /nonexistent/id_ed25519 does not exist",), id="identity-missing"),
    pytest.param(("tunnel", "x12", "--to", "me@gw", "--remote-port", "8001"), ("'x12' is not a Slurm job id",),
                 id="tunnel-job-id"),
    pytest.param(("ping", "ftp://gw/v1"), ("'ftp://gw/v1' is neither a job id nor an http(s) URL",), id="ping-scheme"),
    pytest.param(("ping", "http://127.0.0.1:99999/v1"), ("has an invalid port",), id="ping-port"),
    pytest.param(("ping", "http://127.0.0.1:8001/v1", "--api-key-file", "/nonexistent/key"),
                 ("--api-key-file /nonexistent/key: the key file does not exist",), id="ping-key-file"),
    pytest.param(("connect", "12 34"), ("'12 34' is not a Slurm job id",), id="connect-job-id"),
    pytest.param(("release", "abc"), ("'abc' is not a Slurm job id",), id="release-job-id"),
])
def test_bad_access_input(args, needles):
    assert_clean_error(run_cli(*args), *needles)
