"""rundir.py owns the run directory: every file's name, its readers and the one JSON writer.

The two scripts the job copies into the run directory (gateway_app.py, launch/raynode.py) run with the
standard library only and repeat the names of the files they write: these tests keep them equal."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from envlayers import gateway_app, rundir
from envlayers.launch import raynode
from srcscan import lines_matching

SRC = Path(rundir.__file__).parent


def test_the_gateway_names_its_state_file_as_rundir_does():
    assert gateway_app.STATE_FILE == rundir.GATEWAY_STATE
    assert gateway_app.KEEP_EVENTS == rundir.GatewayState.KEEP_EVENTS


def test_the_ray_node_helper_names_its_files_as_rundir_does():
    assert raynode.CLUSTER_FILE == rundir.RAY_CLUSTER
    assert raynode.PIDS_FILE.format(rank=3) == rundir.ray_pids_name(3)
    assert raynode.SERVER_LOG.format(rank=3) == rundir.server_log_name(3)


def test_the_copied_scripts_are_the_files_rundir_names():
    assert (SRC / rundir.GATEWAY_APP).is_file() and (SRC / "launch" / rundir.RAY_NODE).is_file()


# a run-directory file spelled out as a string, or a rank's file built from its pattern
_NAMES = [rundir.ENDPOINT, rundir.LAUNCH, rundir.LAUNCH_END, rundir.CHAIN, rundir.TUNNEL, rundir.ACCOUNTING,
          rundir.SERVE_ENV, rundir.API_KEY, rundir.RAY_TOKEN, rundir.RAY_CLUSTER, rundir.GATEWAY_STATE,
          rundir.RANKS_SH, rundir.JOB_SH, rundir.ROUTER_STATE, rundir.ROUTER_LOG, rundir.POOL, rundir.TUNNEL_LOG]
_SPELLED = re.compile(r"""(["'])(%s)\1|f["'](server-\{|rank-\{|ray-pids-\{)""" % "|".join(map(re.escape, _NAMES)))
# the standard-library scripts that run inside the job, and the owner itself
_ALLOWED = {"rundir.py", "gateway_app.py", "launch/raynode.py"}


def test_no_module_but_rundir_spells_a_run_directory_files_name():
    offenders = lines_matching(_SPELLED, _ALLOWED, ("such as",))  # an example in an error message
    assert offenders == []


def test_the_name_check_sees_a_spelled_name():  # the test above can fail
    assert _SPELLED.search('path = run_dir / "endpoint.json"')
    assert _SPELLED.search('log = run_dir / f"server-{rank}.log"')
    assert not _SPELLED.search('say("no endpoint.json yet")')
    assert not _SPELLED.search("\"\"\"endpoint.json's data\"\"\"")


def test_write_json_replaces_the_record_whole_and_read_json_reads_it_back(tmp_path):
    path = tmp_path / rundir.CHAIN
    rundir.write_json(path, {"successor": "42"})
    assert path.read_text() == '{\n  "successor": "42"\n}\n'
    assert rundir.read_json(path) == {"successor": "42"}
    rundir.write_json(path, {"successor": "43"}, mode=0o600)
    assert path.stat().st_mode & 0o777 == 0o600 and rundir.read_json(path) == {"successor": "43"}
    assert [p.name for p in tmp_path.iterdir()] == [rundir.CHAIN]


@pytest.mark.parametrize("text", [
    pytest.param(None, id="absent"),
    pytest.param('{"half": ', id="half-written"),
    pytest.param("[1, 2]", id="not-an-object"),
])
def test_read_json_of_a_record_it_cannot_use_is_none(tmp_path, text):
    path = tmp_path / rundir.ENDPOINT
    if text is not None:
        path.write_text(text)
    assert rundir.read_json(path) is None


def test_a_record_writer_says_a_refused_write_once_and_again_after_a_success(tmp_path):
    said = []
    writer = rundir.RecordWriter(said.append)
    (tmp_path / "a-file").write_text("")
    refused = tmp_path / "a-file" / rundir.ACCOUNTING  # its folder is a file: the OS refuses
    assert writer.write_json(refused, {"a": 1}) is False
    assert writer.write_json(refused, {"a": 2}) is False
    assert len(said) == 1 and said[0].startswith(f"ENVLAYERS-WARN: cannot write {refused}: ")
    assert writer.write_json(tmp_path / rundir.ACCOUNTING, {"a": 3}) is True
    assert json.loads((tmp_path / rundir.ACCOUNTING).read_text()) == {"a": 3}


@pytest.mark.parametrize("data, urls", [
    pytest.param({"base_urls": ["a", "b"], "base_url": "a"}, ["a", "b"], id="replicas"),
    pytest.param({"base_url": "a"}, ["a"], id="one"),
    pytest.param({}, [], id="none"),
])
def test_base_urls_of_an_endpoint_record(data, urls):
    ep = rundir.EndpointRecord.from_dict(data)
    assert ep.base_urls == urls and ep.base_url == (urls[0] if urls else None)


def test_dead_ranks_are_the_replicas_endpoint_json_lists_as_not_alive():
    ep = rundir.EndpointRecord.from_dict({"replicas": [{"rank": 0, "alive": True}, {"rank": 1, "alive": False}, "junk"]})
    assert ep.dead_ranks == {1} and len(ep.replicas) == 2
    assert rundir.EndpointRecord.from_dict({"replicas": "junk"}).replicas is None
    assert rundir.EndpointRecord().dead_ranks == set()


def test_chain_of_a_run_that_is_no_link_is_none(tmp_path):
    assert rundir.chain_of(tmp_path) is None and rundir.chain_of(None) is None
    rundir.write_json(tmp_path / rundir.CHAIN, {"predecessor": None, "successor": None, "left": 0})
    assert rundir.chain_of(tmp_path) is None
    rundir.write_json(tmp_path / rundir.CHAIN, {"predecessor": "41", "successor": None, "left": 0})
    assert rundir.chain_of(tmp_path) == rundir.ChainRecord(predecessor="41", left=0)


def test_a_serving_endpoint_is_one_whose_run_has_not_ended(tmp_path):
    assert rundir.serving_endpoint(tmp_path) is None
    rundir.write_json(tmp_path / rundir.ENDPOINT, {"base_urls": ["u"]})
    assert rundir.serving_endpoint(tmp_path) == rundir.EndpointRecord(base_urls=["u"])
    rundir.write_json(tmp_path / rundir.LAUNCH_END, {"code": 0})
    assert rundir.serving_endpoint(tmp_path) is None


def test_serve_env_reads_literal_values_and_leaves_references_out(tmp_path):
    assert rundir.read_serve_env(tmp_path) == {} and rundir.read_serve_env(None) == {}
    (tmp_path / rundir.SERVE_ENV).write_text("export MODEL='m'\nexport EMPTY=''\nexport REF=\"$HOME/x\"\n")
    assert rundir.read_serve_env(tmp_path) == {"MODEL": "m", "EMPTY": ""}


def test_earlier_run_dirs_are_the_run_folders_in_run_order(tmp_path):
    for name in ("run-10", "run-2", "run-x"):
        (tmp_path / name).mkdir()
    (tmp_path / "run-3").write_text("a file, not a run")
    assert list(rundir.earlier_run_dirs(tmp_path)) == [2, 10]
    assert rundir.JobFiles("1", None, tmp_path).earlier_runs() == rundir.earlier_run_dirs(tmp_path)
    assert rundir.earlier_run_dirs(tmp_path / "missing") == {} and rundir.earlier_run_dirs(None) == {}


def test_status_reads_the_gateway_state_with_endpoint_json_and_only_then(tmp_path):
    rundir.write_json(tmp_path / rundir.GATEWAY_STATE, {"healthy": 1, "replicas": 2})
    files = rundir.JobFiles("5", None, tmp_path)
    assert files.endpoint() is None  # not live: the state file alone is no endpoint
    rundir.write_json(tmp_path / rundir.ENDPOINT, {"job_id": "5"})
    assert files.endpoint().gateway.healthy == 1
    assert files.endpoint().to_dict()["gateway"]["healthy"] == 1  # as status --json shows it
    assert "gateway" not in rundir.read_endpoint(tmp_path).to_dict()  # the file alone has none
    assert rundir.JobFiles("5", None, tmp_path, previous_at_top=True).endpoint() is None


# --- the records: a dataclass per JSON file; the file's text is the writer's, old and odd files still read

LAUNCH_TEXT = """{
  "job_id": "42",
  "restart": 1,
  "target": "experiment:qwen38",
  "engine": "vllm",
  "model": "Qwen/Qwen3-8B",
  "served_model_name": "q",
  "shape": "single",
  "nodes": [
    "n1"
  ],
  "addresses": [
    "10.0.0.1"
  ],
  "ready_timeout_s": 7200
}
"""


def test_launch_json_keeps_its_text():
    record = rundir.LaunchRecord(job_id="42", restart=1, target="experiment:qwen38", engine="vllm",
                                 model="Qwen/Qwen3-8B", served_model_name="q", shape="single", nodes=["n1"],
                                 addresses=["10.0.0.1"], ready_timeout_s=7200)
    assert rundir.json_text(record.to_dict()) == LAUNCH_TEXT
    assert rundir.LaunchRecord.from_dict(json.loads(LAUNCH_TEXT)) == record


def test_launch_json_names_containers_only_when_there_are_some():
    assert "containers" not in rundir.LaunchRecord().to_dict()
    assert list(rundir.LaunchRecord(containers=["c0"]).to_dict())[-1] == "containers"


def test_launch_end_json_keeps_its_text():
    record = rundir.LaunchEnd(restart=2, code=0, reason="idle stop after 30s", ended_at=1234.568)
    assert rundir.json_text(record.to_dict()) == ('{\n  "restart": 2,\n  "code": 0,\n  "reason": "idle stop after 30s",'
                                                   '\n  "ended_at": 1234.568\n}\n')


def test_chain_json_keeps_its_text():
    record = rundir.ChainRecord(predecessor="40", successor="57", dependency="after:41+7", left=2)
    assert rundir.json_text(record.to_dict()) == ('{\n  "predecessor": "40",\n  "successor": "57",\n'
                                                   '  "dependency": "after:41+7",\n  "left": 2\n}\n')


@pytest.mark.parametrize("kind", [rundir.LaunchRecord, rundir.LaunchEnd, rundir.ChainRecord, rundir.AccountingRecord,
                                  rundir.GatewayState, rundir.TunnelRecord, rundir.RayCluster])
def test_an_old_record_reads_with_unknown_fields_ignored_and_missing_ones_empty(kind):
    record = kind.from_dict({"from_a_later_version": 1})
    assert record == kind.from_dict({}) and "from_a_later_version" not in record.to_dict()
    assert kind.from_dict(record.to_dict()) == record


def test_a_launch_json_from_before_restarts_were_recorded_is_the_first_run():
    assert rundir.LaunchRecord.from_dict({"job_id": "7"}).restart == 0
    assert rundir.LaunchRecord.from_dict({"restart": -1}).restart == 0


@pytest.mark.parametrize("data, want", [
    pytest.param({"nodes": "n1", "restart": True, "shape": 3}, rundir.LaunchRecord(), id="launch"),
    pytest.param({"code": "0", "ended_at": "soon", "reason": ["x"]}, rundir.LaunchEnd(), id="launch-end"),
    pytest.param({"left": 1.5, "dependency": 7}, rundir.ChainRecord(), id="chain"),
    pytest.param({"srun_pid": "123", "srun_argv": "srun", "gateway": "gw", "keep_alive": 1, "remote_port": True,
                  "closed_s": "0.1", "follower": [9]}, rundir.TunnelRecord(), id="tunnel"),
    pytest.param({"address": 6379, "nodes": 2.0, "joined_after_s": "3"}, rundir.RayCluster(), id="ray-cluster"),
])
def test_a_mistyped_field_reads_as_absent(data, want):
    assert type(want).from_dict(data) == want


# tunnel.json as access.tunnel writes it for a tunnel that followed a chain and was handed over
TUNNEL_TEXT = """{
  "job_id": "41",
  "state": "handed-over",
  "node": "n1",
  "local_port": 8000,
  "gateway": {
    "destination": "me@gw.example.org",
    "ssh_port": null,
    "identity": null,
    "options": []
  },
  "remote_bind": "127.0.0.1",
  "remote_port": 8001,
  "route": {
    "base_url": "http://127.0.0.1:8001/v1",
    "provider_model_id": "q"
  },
  "keep_alive": true,
  "restarts": 5,
  "host": "login1",
  "srun_pid": 1234,
  "srun_argv": [
    "srun",
    "--overlap",
    "--jobid=41"
  ],
  "command": "srun --overlap --jobid=41",
  "ssh_command": "ssh -v -N -R 127.0.0.1:8001:127.0.0.1:8000 me@gw.example.org",
  "step_id": "41.2",
  "node_pid": 77,
  "log": "/runs/41/tunnel.log",
  "opened_at": "2026-12-04T10:00:00+00:00",
  "control": true,
  "replica": 0,
  "follower": {
    "pid": 99,
    "argv": [
      "python3",
      "-m",
      "envlayers.access.handover",
      "/runs/41"
    ],
    "host": "login1"
  },
  "successor": "57",
  "handed_over_at": "2026-12-04T11:00:00+00:00",
  "closed_s": 0.012
}
"""


def test_tunnel_json_keeps_its_text():
    record = rundir.TunnelRecord.from_dict(json.loads(TUNNEL_TEXT))
    assert record.srun_argv == ["srun", "--overlap", "--jobid=41"] and record.follower["pid"] == 99
    assert record.closed_s == 0.012 and record.closed_at is None and record.took_over_from is None
    assert rundir.json_text(record.to_dict()) == TUNNEL_TEXT


def test_a_tunnel_records_later_fields_are_in_the_file_only_when_set():
    fresh = rundir.TunnelRecord(job_id="41", state="opening").to_dict()
    assert list(fresh)[-1] == "control" and fresh["srun_pid"] is None and "closed_at" not in fresh
    closed = rundir.TunnelRecord(state="closed", closed_at="t", closed_by="release", closed_why="w").to_dict()
    assert list(closed)[-3:] == ["closed_at", "closed_by", "closed_why"]


def test_the_tunnel_records_reader_and_writer_go_through_its_record_type(tmp_path):
    record = rundir.TunnelRecord.from_dict({**json.loads(TUNNEL_TEXT), "from_a_later_version": 1})
    rundir.write_tunnel(tmp_path, record)
    assert (tmp_path / rundir.TUNNEL).read_text() == TUNNEL_TEXT
    (tmp_path / rundir.TUNNEL).write_text(TUNNEL_TEXT.replace('"srun_pid": 1234', '"srun_pid": "1234"'))
    read = rundir.read_tunnel(tmp_path)
    assert read.srun_pid is None and read.step_id == "41.2"
    assert rundir.read_tunnel(tmp_path / "absent") is None and rundir.read_tunnel(None) is None


def test_the_ray_cluster_record_reads_what_raynode_writes(tmp_path):
    from envlayers.launch.raycluster import joined_line

    # launch/raynode.py writes the file itself (standard library only): json.dump, no indent
    (tmp_path / raynode.CLUSTER_FILE).write_text(json.dumps({"address": "10.0.0.1:6379", "nodes": 2,
                                                             "joined_after_s": 3.4}))
    seen = rundir.read_record(tmp_path / rundir.RAY_CLUSTER, rundir.RayCluster)
    assert seen == rundir.RayCluster("10.0.0.1:6379", 2, 3.4)
    assert json.dumps(seen.to_dict()) == (tmp_path / rundir.RAY_CLUSTER).read_text()
    assert joined_line(tmp_path) == "ENVLAYERS-STAGE: ray cluster at 10.0.0.1:6379: 2 of 2 node(s) joined after 3.4s"
    (tmp_path / rundir.RAY_CLUSTER).write_text('{"address": "10.0.0.1:6379", "nodes": "2", "joined_after_s": 3.4}')
    assert joined_line(tmp_path) is None
    (tmp_path / rundir.RAY_CLUSTER).unlink()
    assert joined_line(tmp_path) is None


@pytest.mark.parametrize("successor, want", [
    pytest.param("57", "57", id="text"),
    pytest.param(57, "57", id="number"),
    pytest.param("../57", None, id="a-path"),
    pytest.param("\u00b2", None, id="unicode-digit"),
    pytest.param(True, None, id="bool"),
])
def test_a_chains_successor_is_a_job_id_never_a_path(successor, want):
    assert rundir.ChainRecord.from_dict({"successor": successor}).successor == want


def test_the_accounting_record_keeps_values_as_written_for_the_accounting_check():
    from envlayers.accounting import problem

    record = rundir.AccountingRecord.from_dict({"job_start": 1.0, "gpus": -4, "junk": 1})
    assert record.gpus == -4 and problem(record.to_dict()) == "gpus is -4, not a whole number from 0 to 1000000"


def test_job_files_read_the_records(tmp_path):
    rundir.write_json(tmp_path / rundir.LAUNCH, {"job_id": "7", "restart": 3, "shape": "replicas"})
    rundir.write_json(tmp_path / rundir.LAUNCH_END, {"code": 1, "reason": "rank 0 exited"})
    rundir.write_json(tmp_path / rundir.ACCOUNTING, {"job_start": 5.0})
    files = rundir.JobFiles("7", None, tmp_path)
    assert files.launch() == rundir.LaunchRecord(job_id="7", restart=3, shape="replicas")
    assert files.recorded_restart() == 3
    assert files.launch_end() == rundir.LaunchEnd(code=1, reason="rank 0 exited")
    assert files.accounting() == rundir.AccountingRecord(job_start=5.0)
    empty = rundir.JobFiles("8", None, tmp_path / "none")
    assert empty.launch() is None and empty.launch_end() is None and empty.accounting() is None
    assert empty.recorded_restart() is None
