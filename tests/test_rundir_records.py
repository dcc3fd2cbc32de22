"""Every run-directory record file byte for byte, and every form of it a reader accepts read to the same record.

The files in tests/data/records/ were written by the per-record readers and writers that came before the one
converter (rundir.Record): ``write-<case>.json`` is the exact text a record writes, ``read.json`` what each input
below (current, old, mistyped and hand-edited forms) reads to, field by field (``repr`` of each value, so ``5`` and
``5.0`` differ). Run this file as a script to write them again from the code as it is (then read the diff).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from envlayers import rundir
from envlayers.joblines import UNRECORDED_END
from envlayers.launch.pool import Pool

DATA = Path(__file__).resolve().parent / "data" / "records"
ENDPOINT_FILES = Path(__file__).resolve().parent / "data" / "endpoint"

GATEWAY = {"destination": "me@gw", "ssh_port": None, "identity": None, "options": ["-4"]}


def _written() -> dict:
    """case -> the record whose file text is pinned."""
    r = rundir
    return {
        "launch-plain": r.LaunchRecord(job_id="42", restart=1, target="experiment:qwen38", engine="vllm",
                                       model="Qwen/Qwen3-8B", served_model_name="q", shape="single", nodes=["n1"],
                                       addresses=["10.0.0.1"], ready_timeout_s=7200),
        "launch-containers": r.LaunchRecord(job_id="43", target="replicas:oss20bdp", engine="sglang", model=None,
                                            served_model_name="", shape="replicas", nodes=["n1", "n2"],
                                            addresses=["10.0.0.1", "10.0.0.2"], ready_timeout_s=None,
                                            containers=["c0", "c1"], site="h100", container_program="docker"),
        "launch-empty-optionals": r.LaunchRecord(job_id="44", containers=[], site="", container_program=""),
        "launch-default": r.LaunchRecord(),
        "launch-end": r.LaunchEnd(restart=2, code=0, reason="idle stop: no request for 30s", ended_at=1234.568),
        "launch-end-signal": r.LaunchEnd(0, 143, "live then signal 15", 1700000000.5),
        "launch-end-default": r.LaunchEnd(),
        "chain": r.ChainRecord(predecessor="40", successor="57", dependency="after:41+7", left=2),
        "chain-default": r.ChainRecord(),
        "accounting": r.AccountingRecord(job_id="42", restart=0, gpus=8, nodes=2, shape="replicas", engine="vllm",
                                         model="m", served="q", job_start=1000.0, ranks_up_at=1010.5,
                                         phases={"loading": 1011.0, "live": 1100.25}, live_at=1100.25,
                                         last_request_at=None, live={"serving_s": 10, "idle_s": 3.5},
                                         idle_stop_after_s=600, died_at=None, ended_at=2000, final=True,
                                         how="live then signal 15", split={"allocated_gpu_hours": 2.2}),
        "accounting-default": r.AccountingRecord(),
        "gateway-state": r.GatewayState(healthy=1, replicas=2, min_replicas=1, grace_s=60, serve_status="RUNNING",
                                        events=["replica 1 on n2: gone", "replica 1 on n2: back"]),
        "router-state": r.RouterState({"http://n1:8000": True, "http://n2:8000": False}, 1700000000.125),
        "router-state-default": r.RouterState(),
        "ray-cluster": r.RayCluster("10.0.0.1:6379", 2, 3.4),
        "ray-cluster-default": r.RayCluster(),
        "tunnel-fresh": r.TunnelRecord(job_id="41", state="opening"),
        "tunnel-full": r.TunnelRecord(
            job_id="41", state="closed", node="n1", local_port=8000, gateway=GATEWAY, remote_bind="127.0.0.1",
            remote_port=8001, route={"base_url": "http://127.0.0.1:8001/v1", "provider_model_id": "q"},
            keep_alive=False, restarts=0, host="login1", srun_pid=1234, srun_argv=["srun", "--jobid=41"],
            command="srun --jobid=41", ssh_command="ssh -N -R x", step_id="41.2", node_pid=77,
            log="/runs/41/tunnel.log", opened_at="2026-12-04T10:00:00+00:00", control=False, replica=1,
            took_over_from="40", follower={"pid": 9, "argv": ["python3"], "host": "login1"}, port_closed_s=0.5,
            successor="57", handed_over_at="2026-12-04T11:00:00+00:00", closed_s=0.012,
            route_reminded_at="2026-12-04T11:00:01+00:00", closed_at="2026-12-04T11:00:02+00:00",
            closed_by="release", closed_why="the job ended"),
        "replica-row": r.ReplicaRow(1, "n2", "http://n2:8000/v1", "10.0.0.2", False, "exited with code 137"),
        "endpoint-default": r.EndpointRecord(),
        "endpoint-full": r.EndpointRecord(
            job_id="43", served_model_name="q", model="m", engine="vllm", shape="replicas",
            base_urls=["http://n1:30000/v1"], api_key_required=True, run_dir="/runs/43", startup_s=10,
            nodes=["n1", "n2"], metrics=None, restart=1, key_file="/runs/43/api-key", node_local=True,
            metrics_at="http://127.0.0.1:30001/metrics", stop="env_layers stop 43", curl="curl x", curls=["curl x"],
            python="py", client_api_key="k", addresses=["10.0.0.1"], api_key_file="/runs/43/api-key",
            replica_urls=["http://n1:8000/v1"], replica_addresses=["10.0.0.1"], router={"kind": "smg"},
            replicas=[r.ReplicaRow(0, "n1", "http://n1:8000/v1", "10.0.0.1", True, None)], min_replicas=1,
            pool={"max_replicas": 3, "replicas": []}, site="h100",
            gateway=r.GatewayState(healthy=2, replicas=2), router_state=r.RouterState({"http://n1:8000": True}, 5.0)),
    }


# case -> (record type, the file's data as a reader may find it)
READ = {
    "launch-current": ("LaunchRecord", {"job_id": "42", "restart": 1, "target": "t", "engine": "vllm", "model": "m",
                                        "served_model_name": "q", "shape": "single", "nodes": ["n1", 2],
                                        "addresses": ["10.0.0.1"], "ready_timeout_s": 7200, "containers": ["c0"],
                                        "container_program": "docker", "site": "h100", "later": 1}),
    "launch-before-restarts": ("LaunchRecord", {"job_id": "7"}),
    "launch-negative-restart": ("LaunchRecord", {"restart": -1}),
    "launch-mistyped": ("LaunchRecord", {"nodes": "n1", "restart": True, "shape": 3, "ready_timeout_s": 1.5,
                                         "containers": None, "job_id": 42}),
    "launch-end": ("LaunchEnd", {"restart": 2, "code": 0, "reason": "ended", "ended_at": 5}),
    "launch-end-mistyped": ("LaunchEnd", {"code": "0", "ended_at": "soon", "reason": ["x"], "restart": False}),
    "chain": ("ChainRecord", {"predecessor": 40, "successor": "57", "dependency": "afterany:41", "left": 0}),
    "chain-paths": ("ChainRecord", {"predecessor": "../40", "successor": "\u00b2", "left": 1.5, "dependency": 7}),
    "chain-bool": ("ChainRecord", {"successor": True, "left": True}),
    "accounting": ("AccountingRecord", {"job_start": 1.0, "gpus": -4, "junk": 1, "phases": "x", "final": 1}),
    "gateway-state": ("GatewayState", {"healthy": 1, "replicas": 2, "min_replicas": True, "grace_s": 1.0,
                                       "serve_status": 5, "events": ["e%d" % i for i in range(8)] + [9]}),
    "gateway-state-events-not-a-list": ("GatewayState", {"events": "e"}),
    "router-state": ("RouterState", {"workers": {"a": True, "b": 1, 3: False}, "at": 5}),
    "router-state-float": ("RouterState", {"workers": [], "at": 5.5}),
    "router-state-mistyped": ("RouterState", {"workers": "a", "at": True}),
    "ray-cluster": ("RayCluster", {"address": "10.0.0.1:6379", "nodes": 2, "joined_after_s": 3}),
    "ray-cluster-mistyped": ("RayCluster", {"address": 6379, "nodes": 2.0, "joined_after_s": "3"}),
    "tunnel": ("TunnelRecord", {"job_id": "41", "state": "open", "srun_pid": 12, "srun_argv": ["srun", 1],
                                "gateway": GATEWAY, "keep_alive": True, "closed_s": 1, "follower": {"pid": 9},
                                "port_closed_s": 0.25, "replica": 0}),
    "tunnel-mistyped": ("TunnelRecord", {"srun_pid": "123", "srun_argv": "srun", "gateway": "gw", "keep_alive": 1,
                                         "remote_port": True, "closed_s": "0.1", "follower": [9], "route": None}),
    "replica-row": ("ReplicaRow", {"rank": 1, "node": "n2", "base_url": "u", "address": "a", "alive": False,
                                   "ended": "x"}),
    "replica-row-mistyped": ("ReplicaRow", {"rank": "1", "alive": 0, "ended": None}),
    "endpoint-current": ("EndpointRecord", {
        "job_id": "43", "served_model_name": "q", "base_urls": ["http://a/v1", "", "http://b/v1", None],
        "base_url": "http://a/v1", "api_key_required": False, "startup_s": 10, "nodes": ["n1"], "metrics": True,
        "restart": 2, "node_local": True, "curls": ["c"], "addresses": ["10.0.0.1"], "replica_urls": ["u", 1],
        "router": {"kind": "smg"}, "replicas": [{"rank": 0, "alive": True}, "junk", {"rank": 1, "alive": False}],
        "min_replicas": 1, "pool": {"max_replicas": 3}, "site": "h100",
        "gateway": {"healthy": 1, "events": ["e"]}, "router_state": {"workers": {"u": True}, "at": 1}}),
    "endpoint-base-url-only": ("EndpointRecord", {"base_url": "http://a/v1"}),
    "endpoint-empty-base-urls": ("EndpointRecord", {"base_urls": [""], "base_url": "http://a/v1"}),
    "endpoint-both": ("EndpointRecord", {"base_urls": ["http://b/v1"], "base_url": "http://a/v1"}),
    "endpoint-empty-base-url": ("EndpointRecord", {"base_urls": [], "base_url": ""}),
    "endpoint-mistyped": ("EndpointRecord", {"base_urls": "http://a/v1", "restart": -3, "node_local": 1,
                                             "nodes": None, "replicas": {"rank": 0}, "gateway": [],
                                             "router_state": "x", "metrics": "yes", "startup_s": True}),
    "endpoint-empty": ("EndpointRecord", {}),
}


def _fields(record) -> dict:
    return {name: repr(getattr(record, name)) for name in record.__dataclass_fields__}


def _read_now() -> dict:
    return {case: _fields(getattr(rundir, kind).from_dict(data)) for case, (kind, data) in READ.items()}


def _pool_text(tmp_path: Path) -> str:
    """pool.json as the pool writes it after a replica job was submitted, went live, was released and ended."""
    run_dir = tmp_path / "100"
    run_dir.mkdir()
    (run_dir / "job.sh").write_text("#!/bin/bash\n")
    now = [1000.0]

    class Router:
        workers = ["http://n0:8000"]

        def __init__(self):
            self.healthy = set()

        def add_worker(self, url):
            self.healthy.add(url.removesuffix("/v1"))
            return None

        def remove_worker(self, url):
            return None

        def listed(self):
            return {u: ("id", True) for u in self.workers + sorted(self.healthy)}

        def metrics(self):
            return ""

    waiting = ("vllm:num_requests_waiting 3\nvllm:request_queue_time_seconds_sum 0\n"
               "vllm:request_queue_time_seconds_count 0\n")
    pool = Pool({"SCALE_UP_WAIT_S": "5", "SCALE_UP_WINDOW_S": "20", "IDLE_STOP_AFTER_S": "30"}, job_id="100",
                run_dir=run_dir, engine="vllm", router=Router(), started=1, max_replicas=2, startup_s=30.0,
                time_left_s=3600.0, environ={}, api_key=None, say=lambda line: None, clock=lambda: now[0],
                wall=lambda: now[0] + 1e9 + 0.1234,
                run=lambda argv, env: subprocess.CompletedProcess(argv, 0, "201\n", ""),
                fields=lambda job: {}, state=lambda job: "RUNNING", fetch=lambda url, key: waiting,
                cancel=lambda job: None)

    def ticks(seconds):
        end = now[0] + seconds
        while now[0] < end:
            now[0] += 5.0
            pool.tick()

    ticks(40)
    (tmp_path / "201").mkdir()
    (tmp_path / "201" / "endpoint.json").write_text(json.dumps({"base_urls": ["http://n2:8000/v1"], "nodes": ["n2"]}))
    ticks(10)
    pool.fetch = lambda url, key: waiting.replace(" 3\n", " 0\n", 1)
    ticks(60)
    pool.stop()
    return (run_dir / rundir.POOL).read_text()


def _write_pins(tmp: Path) -> None:
    DATA.mkdir(parents=True, exist_ok=True)
    for case, record in _written().items():
        (DATA / f"write-{case}.json").write_text(rundir.json_text(record.to_dict()))
    (DATA / "read.json").write_text(json.dumps(_read_now(), indent=1, sort_keys=True) + "\n")
    (DATA / "write-pool.json").write_text(_pool_text(tmp))


@pytest.mark.parametrize("case", sorted(_written()))
def test_a_record_writes_the_same_bytes(case):
    record = _written()[case]
    assert rundir.json_text(record.to_dict()) == (DATA / f"write-{case}.json").read_text()


@pytest.mark.parametrize("case", sorted(set(_written()) - {"launch-empty-optionals"}))  # "" is written as absent
def test_a_written_record_reads_back_to_itself(case):
    record = _written()[case]
    assert type(record).from_dict(json.loads(rundir.json_text(record.to_dict()))) == record


READ_PINS = json.loads((DATA / "read.json").read_text()) if (DATA / "read.json").is_file() else {}


@pytest.mark.parametrize("case", sorted(READ))
def test_each_form_a_reader_accepts_reads_to_the_same_record(case):
    kind, data = READ[case]
    got = _fields(getattr(rundir, kind).from_dict(data))
    want = READ_PINS[case]
    assert {k: got[k] for k in want} == want


@pytest.mark.parametrize("name", ["single.json", "replicas-router.json", "pool.json"])
def test_a_real_endpoint_json_reads_and_writes_back_byte_for_byte(name):
    text = (ENDPOINT_FILES / name).read_text()
    record = rundir.EndpointRecord.from_dict(json.loads(text))
    assert rundir.json_text(record.to_dict()) == text


def test_pool_json_keeps_its_text(tmp_path):
    assert _pool_text(tmp_path) == (DATA / "write-pool.json").read_text()


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        _write_pins(Path(tmp))
    sys.exit(0)


@pytest.mark.parametrize("code, reason, kind", [
    pytest.param(0, "ended", rundir.END_ENDED, id="ended"),
    pytest.param(0, "idle stop: no request for 600s (IDLE_STOP_AFTER_S=600)", rundir.END_IDLE_STOP, id="idle-stop"),
    pytest.param(0, "successor job 57 is live at http://n3:8000/v1", rundir.END_HANDED_OVER, id="handed-over"),
    pytest.param(143, "live then signal 15", rundir.END_SIGNAL, id="signal"),
    pytest.param(143, "signal 15 to the server step before the endpoint was live", rundir.END_SIGNAL, id="step"),
    pytest.param(1, "rank 1 exited with code 137", rundir.END_FAILED, id="failed"),
    pytest.param(1, "idle stop: x; a rank ran with a core limit that is not 0", rundir.END_FAILED, id="core-limit"),
    pytest.param(None, "ended", None, id="no-code"),
])
def test_launch_end_says_its_kind_from_what_the_launcher_wrote(code, reason, kind, tmp_path):
    written = rundir.LaunchEnd(0, code, reason, 5.0)
    assert written.kind == kind
    assert "kind" not in written.to_dict(), "the file keeps its four keys"
    rundir.write_json(tmp_path / rundir.LAUNCH_END, written.to_dict())
    assert rundir.JobFiles("7", None, tmp_path).launch_end().kind == kind


def test_a_launch_end_that_holds_its_kind_is_read_as_it_says():
    assert rundir.LaunchEnd.from_dict({"code": 0, "reason": "ended", "kind": "handed over"}).kind == "handed over"
    assert rundir.LaunchEnd.from_dict({"code": 0, "reason": "ended", "kind": "exploded"}).kind == "ended"


def _ended(tmp_path: Path, *, launch=True, end=None, said=None) -> rundir.JobFiles:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    if launch:
        rundir.write_json(run_dir / rundir.LAUNCH, {"job_id": "7"})
    if end is not None:
        rundir.write_json(run_dir / rundir.LAUNCH_END, end)
    out = tmp_path / "serve-only-7.out"
    out.write_text("ENVLAYERS-STAGE: run_dir=x\n" + (said or ""))
    return rundir.JobFiles("7", out, run_dir)


@pytest.mark.parametrize("setup, how, said", [
    pytest.param({"end": {"restart": 0, "code": 1, "reason": "r", "ended_at": 2.5}}, "reported",
                 {"code": 1, "reason": "r", "ended_at": 2.5}, id="reported"),
    pytest.param({"end": {"code": 0, "reason": "idle stop: no request for 60s"}}, "idle stop",
                 {"code": 0, "reason": "idle stop: no request for 60s", "ended_at": None}, id="idle-stop"),
    pytest.param({"said": UNRECORDED_END.line(code=143, path=Path("/r/launch-end.json"), why="No space left on device",
                                              reason="live then signal 15") + "\n"}, "unrecorded",
                 {"code": 143, "path": "/r/launch-end.json", "write_error": "No space left on device",
                  "reason": "live then signal 15"}, id="unrecorded"),
    pytest.param({}, "died", {}, id="died"),
    pytest.param({"launch": False}, "never started", {}, id="never-started"),
])
def test_how_the_launcher_ended_is_read_in_one_place(tmp_path, setup, how, said):
    from envlayers.diagnose import launcher_end_finding
    from envlayers.ops.status import _run_summary

    files = _ended(tmp_path, **setup)
    assert files.launcher_ended(job_ended=False) == ("running", {})
    assert files.launcher_ended() == (how, said)
    finished = type("Info", (), {"finished": True, "state": "FAILED", "exit_code": "1:0", "reason": None,
                                 "stdout": str(files.job_out), "workdir": None, "name": None})()
    finding = launcher_end_finding(files.run_dir, finished, "7")
    assert (finding is not None) == (how in ("died", "never started"))
    summary = _run_summary(rundir.JobFiles("7", None, files.run_dir), "p", 0)
    assert summary["launcher"] == ("died" if how == "unrecorded" else how)  # an earlier run has no job output
    assert summary["reason"] == (said.get("reason") if how != "unrecorded" else None)


def test_pool_json_reads_to_its_record_and_writes_back_byte_for_byte():
    text = (DATA / "write-pool.json").read_text()
    record = rundir.PoolRecord.from_dict(json.loads(text))
    assert record.jobs[0].job == "201" and record.jobs[0].ended_at is not None
    assert [d.action for d in record.decisions] == ["grow", "shrink"]
    assert rundir.json_text(record.to_dict()) == text
    running = rundir.PoolJob("202", submitted_at=1.0)
    assert list(running.to_dict())[-1] == "ended", "ended_at only once the job ended"
    assert rundir.PoolRecord.from_dict({"decisions": "x"}) == rundir.PoolRecord(), "no jobs list: no pool record"
