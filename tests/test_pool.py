"""The elastic pool's wiring (launch/pool.py) with a fake clock, fake Slurm, a fake router and fake /metrics;
the report's pool entry (ops/report.py)."""

from __future__ import annotations

import json

import pytest

from envlayers.launch.pool import POOL_OF_ENV, Member, member_keys
from envlayers.launch.successor import HandedOver
from envlayers.rundir import EndpointRecord
from pooltools import live_replica_job, pool_world, ticks


@pytest.fixture
def world(tmp_path):
    return pool_world(tmp_path)


def test_member_keys_make_one_replica_without_router_pool_or_idle_stop():
    keys = {"ROUTER": "smg", "MAX_REPLICAS": "3", "INFERENCE_NODES": "2", "NUMBER_OF_INSTANCES": "2",
            "IDLE_STOP_AFTER_S": "60", "SUCCESSORS": "1", "MIN_REPLICAS": "2", "SERVER_PORT": "8000"}
    assert member_keys(keys) == {"INFERENCE_NODES": "1", "NUMBER_OF_INSTANCES": "1", "SERVER_PORT": "8000"}


def test_the_pool_grows_by_a_one_node_replica_job_that_keeps_partition_account_and_key(world):
    pool, clock, router, lines, submitted, *_ = world
    world[6]["wait"] = 3  # requests wait on n0, and none leaves the queue: the wait grows
    ticks(pool, clock, 20)
    assert not submitted
    ticks(pool, clock, 15)
    (argv, env), = submitted
    assert argv[:3] == ["sbatch", "--parsable", "--nodes=1"]
    assert "--partition=debug" in argv and "--account=proj" in argv and argv[-1].endswith("/100/job.sh")
    limit = next(a for a in argv if a.startswith("--time="))
    assert limit <= "--time=1:00:00"
    assert env[POOL_OF_ENV] == "100" and env["ENVLAYERS_CHAIN_KEY_FILE"].endswith("/100/api-key")
    assert "SLURM_JOB_ID" not in env and env["SLURM_CONF"] == "/c" and "ENVLAYERS_CHAIN_LEFT" not in env
    assert any(line.startswith("ENVLAYERS-POOL: grow: requests waited") and "replica job 201" in line
               for line in lines)
    ticks(pool, clock, 100)
    assert len(submitted) == 1, "no second grow while the first is pending"


def grown(world):
    pool, clock, router, lines, submitted, cancelled, metrics, run_dir = world
    live_replica_job(world)
    ticks(pool, clock, 5)
    assert router.calls == [("add", "http://n2:8000/v1")]
    router.healthy.add("http://n2:8000")
    router.counts["http://n2:8000"] = 1
    ticks(pool, clock, 5)
    assert pool.policy.added == ["201"]
    return pool


def test_a_live_replica_job_joins_the_router_and_endpoint_json_lists_it(world):
    lines, run_dir = world[3], world[7]
    data = EndpointRecord(router={"workers": []})
    world[0].went_live(data)
    pool = grown(world)
    assert data.pool["replicas"] == [{"job": "201", "url": "http://n2:8000/v1", "node": "n2"}]
    written = json.loads((run_dir / "endpoint.json").read_text())
    assert written["pool"]["replicas"][0]["job"] == "201", "written as the replica joined"
    assert any("replica job 201 joined the router" in line and "3 replicas serve" in line for line in lines)
    data = EndpointRecord(router={"workers": []})
    pool.went_live(data)
    assert data.pool["replicas"] == [{"job": "201", "url": "http://n2:8000/v1", "node": "n2"}]
    assert data.router["workers"][-1] == "http://n2:8000"
    rec = json.loads((run_dir / "pool.json").read_text())
    assert rec["jobs"][0]["job"] == "201" and rec["jobs"][0]["live_at"] is not None
    assert [d["action"] for d in rec["decisions"]] == ["grow"]


def test_an_added_replica_idle_past_the_bound_leaves_the_router_then_its_job_is_cancelled(world):
    pool = grown(world)
    clock, router, lines, cancelled, metrics = world[1], world[2], world[3], world[5], world[6]
    metrics["wait"] = 0
    ticks(pool, clock, 20)
    router.counts["http://n2:8000"] = 2  # a request reached it: the idle clock restarts
    ticks(pool, clock, 25)
    assert not cancelled
    ticks(pool, clock, 10)
    assert router.calls[-1] == ("remove", "http://n2:8000/v1") and cancelled == ["201"]
    assert any(line.startswith("ENVLAYERS-POOL: shrink: replica job 201") for line in lines)
    assert pool.policy.added == []


def test_the_pools_end_cancels_every_replica_job_still_running(world):
    pool, clock, router, lines, submitted, cancelled, metrics, _ = world
    metrics["wait"] = 3
    ticks(pool, clock, 40)
    pool.stop()
    assert cancelled == ["201"]
    assert lines[-1] == "ENVLAYERS-POOL: job 100 ends: cancelled its replica job(s) 201"


def test_a_replica_job_that_ends_before_live_is_given_up(world):
    pool, clock, router, lines, submitted, cancelled, metrics, _ = world
    pool.state = lambda job: "FAILED"
    metrics["wait"] = 3
    ticks(pool, clock, 60)
    assert any("replica job 201 did not join: it ended (FAILED)" in line for line in lines)
    assert cancelled[0] == "201" and pool.policy.pending != "201"
    assert [argv[-1] for argv, _ in submitted][1:], "the pool tries again once the window passed anew"


def test_a_member_ends_once_the_pools_job_recorded_its_end(tmp_path):
    run_dir = tmp_path / "201"
    run_dir.mkdir()
    member = Member("100", run_dir, lambda line: None)
    member.tick()
    (tmp_path / "100").mkdir()
    (tmp_path / "100" / "launch-end.json").write_text("{}")
    with pytest.raises(HandedOver, match="job 100"):
        member.tick()


def test_a_member_ends_once_slurm_says_the_pools_job_ended_without_a_record(tmp_path):
    run_dir = tmp_path / "201"
    run_dir.mkdir()
    now, states, asked = [0.0], {"100": "RUNNING"}, []

    def state(job):
        asked.append(job)
        return states[job]

    member = Member("100", run_dir, lambda line: None, state=state, clock=lambda: now[0])
    member.tick()
    assert asked == []  # not asked before STATE_EVERY_S
    now[0] += 15.0
    member.tick()
    states["100"] = None  # Slurm silent: not an end
    now[0] += 15.0
    member.tick()
    states["100"] = "CANCELLED by 0"
    member.tick()  # asked again only after STATE_EVERY_S
    now[0] += 15.0
    with pytest.raises(HandedOver, match=r"job 100, whose pool this replica served, ended \(CANCELLED by 0 in Slurm\)"):
        member.tick()
    assert asked == ["100", "100", "100"]


def test_the_report_adds_the_replica_jobs_gpu_hours_to_the_pools_job(tmp_path):
    from envlayers.ops.report import pools

    parent = tmp_path / "100"
    parent.mkdir()
    (parent / "pool.json").write_text(json.dumps({"max_replicas": 3, "jobs": [{"job": "201"}],
                                                  "decisions": [{"action": "grow", "job": None, "why": "w"}]}))
    jobs = [{"job_id": "100", "run_dir": str(parent), "split": {"allocated_gpu_hours": 2.0}},
            {"job_id": "201", "run_dir": str(tmp_path / "201"), "split": {"allocated_gpu_hours": 0.5}}]
    (entry,) = pools(jobs)
    assert entry["gpu_hours_total"] == 2.5 and entry["replica_jobs"] == ["201"]
    assert jobs[1]["pool_of"] == "100"


def test_a_launcher_started_as_a_pool_replica_plans_one_replica_and_watches_the_pools_job(tmp_path):
    from envlayers.launch.launcher import Launcher

    environ = {"ENVLAYERS_KEYS": "ROUTER MAX_REPLICAS INFERENCE_NODES INFERENCE_MODE IDLE_STOP_AFTER_S",
               "ROUTER": "smg", "MAX_REPLICAS": "3", "INFERENCE_NODES": "2", "INFERENCE_MODE": "replicas",
               "IDLE_STOP_AFTER_S": "60", POOL_OF_ENV: "100", "SLURM_JOB_ID": "201"}
    launch = Launcher(tmp_path / "201", environ)
    assert launch.pool_of == "100"
    assert {k: v for k, v in launch.keys.items() if not k.startswith("ENVLAYERS_")} == {
        "INFERENCE_NODES": "1", "INFERENCE_MODE": "replicas"}
    plain = Launcher(tmp_path / "100", {k: v for k, v in environ.items() if k != POOL_OF_ENV})
    assert plain.pool_of is None and plain.keys["MAX_REPLICAS"] == "3"


def test_a_replica_job_smg_never_calls_healthy_is_given_up(world):
    pool, clock, router, lines, submitted, cancelled, metrics, run_dir = world
    live_replica_job(world)
    ticks(pool, clock, 200)
    assert any("replica job 201 did not join: smg did not call it healthy within 120s" in line for line in lines)
    assert cancelled[0] == "201"


def test_status_lists_the_pools_added_replicas():
    from envlayers.cli.serving_format import replica_lines
    from envlayers.rundir import EndpointRecord

    ep = EndpointRecord.from_dict({
        "replicas": [{"rank": 0, "node": "n1", "alive": True}, {"rank": 1, "node": "n2", "alive": True}],
        "pool": {"max_replicas": 3, "replicas": [{"job": "201", "url": "http://n3:8000/v1", "node": "n3"}]}})
    assert ("pool", "3 replicas serve, up to MAX_REPLICAS=3; replica job 201 on n3 (http://n3:8000/v1)") \
        in replica_lines(ep)
    assert all(label != "pool" for label, _ in replica_lines(EndpointRecord(replicas=ep.replicas)))


def test_the_report_text_names_the_pool_its_replica_jobs_and_each_decision():
    from types import SimpleNamespace

    from envlayers.cli.report_cmds import format_report

    rep = SimpleNamespace(since=0.0, slurm_accounting="not asked: --no-sacct", missing=[], skipped=[], roots=["/r"],
                          jobs=[], by_model=[], by_shape=[], by_site=[], largest_waste=None,
                          pools=[{"job_id": "100", "replica_jobs": ["201"], "gpu_hours_total": 2.5,
                                  "gpu_hours_replica_jobs": 0.5, "gpu_hours_own": 2.0,
                                  "decisions": [{"action": "grow", "job": None, "why": "waited"},
                                                {"action": "shrink", "job": "201", "why": "idle"}]}])
    rep.jobs = [{}]  # the pools are listed once jobs are
    text = format_report(rep)
    assert "elastic pool of job 100: 2.50 GPU-hours with its replica job(s) 201 (0.50 of them)" in text
    assert "\n  grow: waited\n  shrink 201: idle\n" in text
