"""Malformed topology keys (docs/keys.md, docs/topology.md) through the real command line: each ends in one
short error naming the key, exit 2, before anything is submitted."""

from __future__ import annotations

import pytest

from malformed_tools import assert_clean_error, run_cli


@pytest.mark.parametrize(
    "lines, needles",
    [
        pytest.param("NUMBER_OF_INSTANCES=\n", ["NUMBER_OF_INSTANCES: is empty"], id="instances-empty"),
        pytest.param("NUMBER_OF_INSTANCES=-2\n", ["NUMBER_OF_INSTANCES: must be a positive integer"],
                     id="instances-negative"),
        pytest.param("NUMBER_OF_INSTANCES=1e3\n", ["NUMBER_OF_INSTANCES: must be a positive integer"],
                     id="instances-float"),
        pytest.param("USE_RAY_SERVE=maybe\n", ["USE_RAY_SERVE: must be true or false"], id="ray-serve-word"),
        pytest.param("DISTRIBUTED_BACKEND=nccl\n", ["serve.env:1: DISTRIBUTED_BACKEND: unknown backend 'nccl'"], id="backend"),
        pytest.param("DATA_PARALLEL_RPC_PORT=\n", ["DATA_PARALLEL_RPC_PORT: is empty"], id="dp-port-empty"),
        pytest.param("DATA_PARALLEL_RPC_PORT=99999\n", ["DATA_PARALLEL_RPC_PORT: must be a TCP port"],
                     id="dp-port-range"),
        pytest.param("INFERENCE_NODES=2\nNUMBER_OF_INSTANCES=3\n", ["NUMBER_OF_INSTANCES = 3 does not divide evenly"], id="uneven"),
        pytest.param("INFERENCE_NODES=2\nNUMBER_OF_INSTANCES=4\n", ["the remaining 4 GPU(s) would be allocated and billed"],
                     id="idle-gpus"),
        pytest.param("INFERENCE_ENGINE=sglang\nCONTAINER_ROLE=sglang-mi300\n",
                     ["serve.env:1: INFERENCE_ENGINE: the plan is data-parallel", "sgl-router"], id="sglang-data-parallel"),
    ],
)
def test_bad_topology_key_is_one_line_exit_2(lines, needles, tmp_path):
    env_file = tmp_path / "serve.env"
    env_file.write_text(lines)
    for command in (["plan", "--model", "oss20bdp"], ["serve", "--model", "oss20bdp", "--dry-run"]):
        proc = run_cli(*command, "--env-file", str(env_file))
        assert_clean_error(proc, *needles)
        assert proc.stdout == ""
        assert len(proc.stderr.splitlines()) == 1
