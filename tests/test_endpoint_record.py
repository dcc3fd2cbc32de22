"""endpoint.json is written byte for byte as it was before it had a record type (rundir.EndpointRecord): the
launcher's three flows (one server; replicas behind a router, one lost; an elastic pool that grew) end in the
files kept in tests/data/endpoint/, written by the launcher before the record existed."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from envlayers import rundir
from envlayers.launch import launcher as launcher_mod
from envlayers.launch.prepare import Allocation, Node, prepare
from envlayers.launch.replicas import Survivors

from pooltools import FakeRouter, live_replica_job, pool_world, ticks

DATA = Path(__file__).resolve().parent / "data" / "endpoint"
N1, N2 = Node("n1", "10.0.0.1", True), Node("n2", "10.0.0.2", True)
VLLM = {"INFERENCE_ENGINE": "vllm", "INFERENCE_MODEL": "Qwen/Qwen3-8B", "VLLM_SERVED_MODEL": "q"}
REPLICAS = {**VLLM, "INFERENCE_NODES": "2", "INFERENCE_MODE": "replicas", "NUMBER_OF_INSTANCES": "2"}


class Router(FakeRouter):
    """What on_live asks of launch.router.Router."""

    url = "http://n1:30000/v1"
    metrics_url = "http://127.0.0.1:30001/metrics"

    def __init__(self, run_dir: Path):
        super().__init__()
        self.run_dir = run_dir

    def start(self):
        pass

    def record(self):
        return {"kind": "smg", "base_url": self.url, "port": 30000, "policy": "cache_aware",
                "metrics_url": self.metrics_url, "workers": list(self.workers), "log": f"{self.run_dir}/router.log",
                "pid": 4242}


def written(run_dir: Path) -> str:
    return (run_dir / rundir.ENDPOINT).read_text().replace(str(run_dir), "<RUN>")


def single(tmp_path: Path) -> str:
    lp = prepare(VLLM, Allocation(job_id="42", run_dir=tmp_path, nodes=(N1,), cpus_on_node="192"))
    launcher_mod.Launcher(tmp_path, {}).on_live(lp, 3.04)
    return written(tmp_path)


def replicas_router(tmp_path: Path) -> str:
    lp = prepare(REPLICAS, Allocation(job_id="43", run_dir=tmp_path, nodes=(N1, N2), cpus_on_node="192",
                                      api_key=True, restart=1))
    launch = launcher_mod.Launcher(tmp_path, {})
    launch.router = Router(tmp_path)
    launch.survivors = Survivors(lp, object(), 1, say=lambda line: None, tail=lambda p: [],
                                 release=lambda keep: None, write=launch.records.write_json,
                                 background=lambda fn: fn())
    launch.on_live(lp, 10.0)
    launch.survivors.lost(1, "exited with code 137 after the endpoint was live")
    return written(tmp_path)


def pool(tmp_path: Path, monkeypatch) -> str:
    run_dir = tmp_path / "100"
    world = pool_world(tmp_path)  # the pool test's world: fake Slurm, router and clock
    the_pool, router = world[0], world[2]
    router.__class__ = Router
    router.run_dir = run_dir
    lp = prepare(REPLICAS, Allocation(job_id="100", run_dir=run_dir, nodes=(N1, N2), cpus_on_node="192"))
    launch = launcher_mod.Launcher(run_dir, {})
    launch.router = router
    monkeypatch.setattr(launcher_mod.Launcher, "make_pool", lambda self, lp, elapsed: the_pool)
    launch.on_live(lp, 20.0)
    live_replica_job(world)
    ticks(the_pool, world[1], 5)
    router.healthy.add("http://n2:8000")
    ticks(the_pool, world[1], 5)
    assert the_pool.policy.added == ["201"]
    return written(run_dir)


@pytest.mark.parametrize("flow", ["single", "replicas-router", "pool"])
def test_endpoint_json_is_written_as_before(tmp_path, monkeypatch, capsys, flow):
    text = {"single": lambda: single(tmp_path), "replicas-router": lambda: replicas_router(tmp_path),
            "pool": lambda: pool(tmp_path, monkeypatch)}[flow]()
    assert text == (DATA / f"{flow}.json").read_text()


@pytest.mark.parametrize("flow", ["single", "replicas-router", "pool"])
def test_a_file_read_and_written_again_is_the_same_text(flow):
    text = (DATA / f"{flow}.json").read_text()
    assert rundir.json_text(rundir.EndpointRecord.from_dict(json.loads(text)).to_dict()) == text


def test_the_reader_reads_what_the_launcher_wrote(tmp_path):
    single(tmp_path)
    ep = rundir.read_endpoint(tmp_path)
    assert ep.base_url == "http://n1:8000/v1" and ep.addresses == ["10.0.0.1"] and ep.api_key_required is False
    assert ep.stop == "env_layers stop 42" and ep.router is None and ep.replicas is None
    assert rundir.read_endpoint(tmp_path / "nowhere") is None


@pytest.mark.parametrize("data, field, value", [
    pytest.param({"base_url": "http://a:1/v1"}, "base_urls", ["http://a:1/v1"], id="base-url-only"),
    pytest.param({}, "restart", 0, id="no-restart-is-the-first-run"),
    pytest.param({"restart": "1"}, "restart", 0, id="mistyped-restart"),
    pytest.param({}, "node_local", False, id="no-node-local"),
    pytest.param({}, "api_key_required", None, id="key-unknown"),
    pytest.param({"nodes": "n1"}, "nodes", [], id="mistyped-nodes"),
    pytest.param({"replicas": [{"rank": "0", "alive": "yes"}]}, "replicas", [rundir.ReplicaRow()], id="odd-row"),
    pytest.param({"router": "smg"}, "router", None, id="mistyped-router"),
    pytest.param({"some_future_field": 1}, "job_id", None, id="unknown-field-ignored"),
])
def test_an_older_or_odd_file_reads_with_empty_defaults(data, field, value):
    assert getattr(rundir.EndpointRecord.from_dict(data), field) == value


def test_the_fields_written_only_when_set_stay_out_of_a_plain_file():
    keys = rundir.EndpointRecord.from_dict({"job_id": "1"}).to_dict().keys()
    assert not {"replica_urls", "replica_addresses", "router", "replicas", "min_replicas", "pool", "gateway",
                "router_state"} & set(keys)
    assert list(keys) == list(json.loads((DATA / "single.json").read_text()))
