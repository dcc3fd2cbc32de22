"""The rendezvous port: scanned upward from RDZV_PORT on the head node (at most 64 ports), the port chosen
is printed and reaches every rank's command; none free ends the launch before srun."""

from __future__ import annotations

import socket

import pytest

from envlayers import engines
from envlayers.launch.ports import ports_in_use
from envlayers.launch.prepare import LaunchFailure, choose_rdzv_port
from envlayers.topology import plan
from nettools import time_wait_port

PIPELINE = {"INFERENCE_ENGINE": "vllm", "INFERENCE_MODEL": "m", "VLLM_SERVED_MODEL": "s", "INFERENCE_NODES": "2"}
RAY = {**PIPELINE, "TENSOR_PARALLEL_SIZE": "8"}


@pytest.mark.parametrize(
    "env, busy, port, lines",
    [
        pytest.param(PIPELINE, set(), 29500, [], id="free"),
        pytest.param(PIPELINE, {29500, 29501}, 29502, [
            "ENVLAYERS-TOPOLOGY: rdzv_port=29502 (RDZV_PORT=29500 is in use on the head node; the first free port "
            "above it)"], id="two-busy"),
        pytest.param({**PIPELINE, "SERVER_PORT": "29501"}, {29500}, 29502, [
            "ENVLAYERS-TOPOLOGY: rdzv_port=29502 (RDZV_PORT=29500 is in use on the head node; the first free port "
            "above it)"], id="skips-the-api-port"),
        pytest.param(RAY, {29500}, 29501, [
            "ENVLAYERS-TOPOLOGY: rdzv_port=29501 (RDZV_PORT=29500 is in use on the head node; the first free port "
            "above it)"], id="ray-head-port"),
        pytest.param({**PIPELINE, "INFERENCE_NODES": "1"}, {29500}, 29500, [], id="one-node-needs-none"),
        pytest.param({**PIPELINE, "NUMBER_OF_INSTANCES": "2"}, {29500}, 29500, [], id="data-parallel-uses-its-own"),
    ],
)
def test_first_free_port_from_rdzv_port(env, busy, port, lines):
    p, moved = choose_rdzv_port(plan(env), frozenset(busy))
    assert (p.rdzv_port, moved) == (port, lines)


def test_the_chosen_port_reaches_every_rank():
    p, _ = choose_rdzv_port(plan(PIPELINE), frozenset({29500}))
    for cmd in engines.build_commands(p, PIPELINE, "n1"):
        assert cmd.argv[cmd.argv.index("--master-port") + 1] == "29501"


def test_no_free_port_within_64_ends_the_launch():
    with pytest.raises(LaunchFailure) as err:
        choose_rdzv_port(plan(PIPELINE), frozenset(range(29500, 29564)))
    assert str(err.value) == ("no free rendezvous port on the head node in 29500-29563 (RDZV_PORT and the 63 ports "
                              "above it are in use); set RDZV_PORT to a free range in your SERVE_ENV_FILE")
    # the 65th port is beyond the scan
    p, _ = choose_rdzv_port(plan(PIPELINE), frozenset(range(29500, 29563)))
    assert p.rdzv_port == 29563


def test_ports_in_use_sees_a_real_listener():
    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        held.listen()
        port = held.getsockname()[1]
        assert port in ports_in_use(port, 1)
    assert port not in ports_in_use(port, 1)


def test_a_port_whose_last_connection_lingers_in_time_wait_is_free():
    # the server side closes first, as Ray's GCS or a TCP store does when a job ends: its socket stays in
    # TIME_WAIT for a minute, during which a new listener binds the port fine, since both set SO_REUSEADDR
    # (as gRPC and torch's TCP store do)
    port = time_wait_port()
    assert port not in ports_in_use(port, 1)

