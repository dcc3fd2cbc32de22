"""Endpoints that last, without Slurm or root: replicas that survive a peer and the /health watch,
on the supervision loop with fake exit files, a fake clock and a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from envlayers.launch.health import HealthSettings, HealthWatch, get_health, health_settings, health_url
from envlayers.errors import KeyValueError
from envlayers.launch.prepare import LaunchFailure, Node, min_replicas, prepare
from envlayers.launch.replicas import ReplicaSteps, release_node, survives
from envlayers.rundir import EndpointRecord
from envlayers.slurm import one_node_step_argv
from envlayers.launch.supervise import Supervisor
from envlayers.readiness import Probe
from clocktools import Clock
from launchtools import NODES3, PIPELINE, REPLICAS, SINGLE_VLLM, Step, Stop, alloc, exited, replicas_loop, started, stop


# --------------------------------------------------------------------------- keys and argv (pure)


@pytest.mark.parametrize("value, want", [
    pytest.param(None, (600, 30.0, 60.0), id="default-ten-minutes"),
    pytest.param("10", (10, 2.0, 5.0), id="short-for-tests"),
    pytest.param("0", (0, 30.0, 60.0), id="off-the-progress-clock-still-reads"),
])
def test_health_settings_follow_the_key(value, want):
    s = health_settings({} if value is None else {"HEALTH_FAIL_AFTER_S": value})
    assert (s.fail_after_s, s.interval_s, s.timeout_s) == want


@pytest.mark.parametrize("key, value, hint", [
    pytest.param("HEALTH_FAIL_AFTER_S", "5m", "must be a whole number of seconds, got '5m'; hint: 600", id="health-unit"),
    pytest.param("MIN_REPLICAS", "4", "must be a whole number from 1 to 3 .*got 4; hint", id="min-above-replicas"),
    pytest.param("MIN_REPLICAS", "0", "must be a positive integer, got '0'; hint", id="min-zero"),
])
def test_a_bad_endurance_key_names_the_key(key, value, hint):
    with pytest.raises(KeyValueError, match=f"^{key}: {hint}"):
        health_settings({key: value}) if key.startswith("HEALTH") else min_replicas({key: value}, 3)


def test_min_replicas_defaults_to_one():
    assert min_replicas({}, 3) == 1 and min_replicas({"MIN_REPLICAS": "2"}, 3) == 2


def test_each_replica_gets_its_own_one_node_step(tmp_path):
    lp = prepare(REPLICAS, alloc(tmp_path, nodes=NODES3))
    assert survives(lp) and not survives(prepare(PIPELINE, alloc(tmp_path, ifaces={"hsn0": "1.2.3.4"})))
    argv = one_node_step_argv(lp.srun, "n2")
    assert argv[:5] == ["srun", "--nodes=1", "--nodelist=n2", "--ntasks=1", "--ntasks-per-node=1"]
    assert argv[-2:] == ["bash", str(tmp_path / "ranks.sh")]
    started_with = []

    class Proc:
        pid, returncode = 1, None

        def poll(self):
            return None

    ReplicaSteps(lp, {"A": "1"}, popen=lambda argv, env, start_new_session: started_with.append(
        (argv[2], env["ENVLAYERS_RANK"], env["A"])) or Proc())
    assert started_with == [("--nodelist=n1", "0", "1"), ("--nodelist=n2", "1", "1"), ("--nodelist=n3", "2", "1")]


@pytest.mark.parametrize("env, rank", [
    pytest.param({"SLURM_PROCID": "0", "ENVLAYERS_RANK": "2"}, 2, id="replica-step-told-its-rank"),
    pytest.param({"SLURM_PROCID": "1"}, 1, id="one-step-for-all-ranks"),
])
def test_ranks_sh_takes_the_rank_from_envlayers_rank(tmp_path, env, rank):
    lp = prepare(REPLICAS, alloc(tmp_path, nodes=NODES3))
    script = tmp_path / "ranks.sh"
    script.write_text(lp.files["ranks.sh"].replace('"$@" &', 'true &'))
    subprocess.run(["bash", str(script)], env={**env, "PATH": "/usr/bin:/bin"}, capture_output=True, timeout=10)
    assert f"ENVLAYERS-STAGE: rank {rank} up on" in (tmp_path / f"server-{rank}.log").read_text()
    assert (tmp_path / f"rank-{rank}.exit").read_text() == "0\n"


@pytest.mark.parametrize("answers, want, tries", [
    pytest.param([(0, "")], None, 1, id="done"),
    pytest.param([(1, "Job update not available right now, the DB index is being set, try again in a bit"),
                  (0, "")], None, 2, id="db-index-retried"),
    pytest.param([(1, "slurm_update error: try again in a bit")] * 3, "slurm_update error: try again in a bit", 3,
                 id="db-index-never-set"),
    pytest.param([(1, "slurm_update error: Invalid node name specified")], "slurm_update error: Invalid node name "
                 "specified", 1, id="refused-said"),
])
def test_release_node_shrinks_the_job_and_says_why_not(tmp_path, answers, want, tries):
    calls = []

    def run(argv):
        code, err = answers[len(calls)]
        calls.append(argv)
        return subprocess.CompletedProcess(argv, code, "", err)

    assert release_node("42", ["n1", "n3"], tmp_path, run=run, sleep=lambda s: None) == want
    assert calls[0] == ["scontrol", "update", "JobId=42", "NodeList=n1,n3"] and len(calls) == tries


# --------------------------------------------------------------------------- replicas on the loop


def test_a_replica_that_exits_after_live_is_dropped_and_its_node_given_back(tmp_path):
    clock = Clock()
    sup, steps, released, said = replicas_loop(tmp_path, clock)
    clock.at(10, lambda: exited(tmp_path, 2, 9, 10.0))
    clock.at(20, stop)
    with pytest.raises(Stop):
        sup.run()
    assert "ENVLAYERS-ERROR: replica rank 2 on n3 exited with code 9 after the endpoint was live" in said
    assert "  | last words" in said
    assert steps.ended == [2] and released == [["n1", "n2"]]
    assert "ENVLAYERS-STAGE: node n3 released back to Slurm (the job now holds n1, n2; no longer billed for n3)" in said
    ep = json.loads((tmp_path / "endpoint.json").read_text())
    assert [(r["rank"], r["alive"]) for r in ep["replicas"]] == [(0, True), (1, True), (2, False)]
    assert ep["base_urls"] == ["http://n1:8000/v1", "http://n2:8000/v1"]
    assert EndpointRecord.from_dict(ep).dead_ranks == {2}
    assert said.count("ENVLAYERS-ERROR: replica rank 2 on n3 exited with code 9 after the endpoint was live") == 1


def test_rank_zero_dying_keeps_its_node_the_launcher_runs_there(tmp_path):
    clock = Clock()
    sup, steps, released, said = replicas_loop(tmp_path, clock)
    clock.at(10, lambda: exited(tmp_path, 0, 1, 10.0))
    clock.at(20, stop)
    with pytest.raises(Stop):
        sup.run()
    assert released == [] and "ENVLAYERS-STAGE: node n1 stays in the job: the launcher runs there" in said
    assert json.loads((tmp_path / "endpoint.json").read_text())["base_urls"][0] == "http://n2:8000/v1"


@pytest.mark.parametrize("minimum, deaths, ends_at", [
    pytest.param(1, 3, 3, id="last-one-dies"),
    pytest.param(2, 2, 2, id="below-min-replicas"),
])
def test_the_job_ends_when_fewer_than_min_replicas_are_alive(tmp_path, minimum, deaths, ends_at):
    clock = Clock()
    sup, steps, released, said = replicas_loop(tmp_path, clock, minimum=minimum)
    for i in range(deaths):
        clock.at(10 + 10 * i, lambda r=i: exited(tmp_path, r, 1, 10.0 + r))
    clock.at(100, stop)
    with pytest.raises(LaunchFailure, match=f"{3 - ends_at} of 3 replicas alive, fewer than MIN_REPLICAS={minimum}"):
        sup.run()
    assert 40 > clock.t - 1000 >= 10 + 10 * (ends_at - 1)


def test_before_live_a_replica_exit_still_ends_the_job(tmp_path):
    clock = Clock()
    sup, *_ = replicas_loop(tmp_path, clock)
    sup.probe = lambda url, served, key, timeout_s: Probe(url, False, None, "no answer")
    clock.at(3, lambda: exited(tmp_path, 1, 1, 3.0))
    with pytest.raises(LaunchFailure, match="rank 1 on n2 exited with code 1 before the endpoint was live"):
        sup.run()


# --------------------------------------------------------------------------- the health watch


def watch(clock, answers: dict, fail_after=60):
    """A synchronous HealthWatch whose probe answers what ``answers[url]`` says at the time."""
    settings = HealthSettings(fail_after, min(30.0, fail_after / 5), min(60.0, fail_after / 2))
    return HealthWatch({0: "http://n1:8000/health"}, settings, clock=clock,
                       get=lambda url, timeout: answers[url](), background=False)


@pytest.mark.parametrize("hang_at, fail_after, interval", [
    pytest.param(100, 60, 12, id="short"),
    pytest.param(100, 300, 30, id="default-like"),
])
def test_a_server_that_stops_answering_health_ends_the_job(tmp_path, hang_at, fail_after, interval):
    clock = Clock()
    healthy = {"ok": True}
    answers = {"http://n1:8000/health": lambda: (True, "HTTP 200") if healthy["ok"] else (False, "no answer within 30s")}
    keys = {**SINGLE_VLLM, "ENVLAYERS_READY_TIMEOUT_S": "100"}
    lp = prepare(keys, alloc(tmp_path, nodes=NODES3[:1]))
    sup = Supervisor(lp, Step(), probe=lambda u, s, k, timeout_s: Probe(u, True, 200, "ok"), on_live=lambda e: None,
                     say=lambda line: None, clock=clock, sleep=clock.sleep, health=watch(clock, answers, fail_after))
    started(tmp_path, 0)
    clock.at(hang_at, lambda: healthy.update(ok=False))
    with pytest.raises(LaunchFailure) as err:
        sup.run()
    assert err.value.rank == 0
    assert str(err.value).startswith("rank 0 on n1 stopped answering /health after the endpoint was live: no healthy "
                                     "answer from http://n1:8000/health for ")
    assert str(err.value).endswith(f"(HEALTH_FAIL_AFTER_S={fail_after}); last seen: no answer within 30s")
    # the last healthy answer came at most one interval before the hang; the loop looks every 0.25s
    assert hang_at + fail_after - interval <= clock.t - 1000 <= hang_at + fail_after + 1


def test_a_slow_but_answering_server_is_never_dropped(tmp_path):
    clock = Clock()
    answers = {"http://n1:8000/health": lambda: (clock.sleep(25) or (True, "HTTP 200"))}  # each answer takes 25s
    w = watch(clock, answers, fail_after=60)
    w.start()
    for _ in range(200):
        assert w.tick() == []
        clock.sleep(1)


def test_a_hung_replica_is_dropped_and_the_others_serve_on(tmp_path):
    clock = Clock()
    hung = {"r": None}
    urls = {r: f"http://10.0.0.{r + 1}:8000/health" for r in range(3)}
    settings = HealthSettings(60, 12.0, 30.0)
    health = HealthWatch(urls, settings, clock=clock, background=False,
                         get=lambda url, t: (False, "no answer within 30s") if url == urls.get(hung["r"]) else (True, "HTTP 200"))
    sup, steps, released, said = replicas_loop(tmp_path, clock, health=health)
    clock.at(50, lambda: hung.update(r=1))
    clock.at(200, stop)
    with pytest.raises(Stop):
        sup.run()
    errors = [line for line in said if line.startswith("ENVLAYERS-ERROR: replica")]
    assert errors == ["ENVLAYERS-ERROR: replica rank 1 on n2 stopped answering /health after the endpoint was live: "
                      "no healthy answer from http://10.0.0.2:8000/health for 60s (HEALTH_FAIL_AFTER_S=60); "
                      "last seen: no answer within 30s"]
    assert steps.ended == [1] and released == [["n1", "n3"]]


class _Health(BaseHTTPRequestHandler):
    hang = threading.Event()

    def do_GET(self):
        if self.hang.is_set():
            threading.Event().wait(3)
            return
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *a):
        pass


def test_get_health_on_real_http_healthy_refused_and_silent():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_port}/v1"
        assert health_url(base) == f"http://127.0.0.1:{server.server_port}/health"
        assert get_health(health_url(base), 2) == (True, "HTTP 200")
        _Health.hang.set()
        assert get_health(health_url(base), 0.5) == (False, "no answer within 0.5s")
    finally:
        _Health.hang.clear()
        server.shutdown()
        server.server_close()
    ok, seen = get_health(f"http://127.0.0.1:{server.server_port}/health", 1)
    assert not ok and seen.startswith("no answer: ") and "refused" in seen


class _StoppedEngine(BaseHTTPRequestHandler):
    """vLLM with its engine core stopped: the API server answers /health 200, a completion never returns."""

    completions = 0
    release = threading.Event()

    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self):
        type(self).completions += 1
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if not self.release.wait(3):
            return
        body = json.dumps({"choices": [{"text": "x"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def test_a_health_probe_that_generates_sees_an_engine_whose_health_still_says_200():
    from envlayers.launch.health import OwnRequests, generating_health
    from envlayers.readiness import generates

    server = ThreadingHTTPServer(("127.0.0.1", 0), _StoppedEngine)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    own = OwnRequests()
    get = generating_health(generates, "m", None, own)
    url = f"http://127.0.0.1:{server.server_port}/health"
    try:
        ok, seen = get(url, 0.5)
        assert not ok and seen.startswith("/health HTTP 200, but a one-token completion: no answer: ")
        _StoppedEngine.release.set()
        assert get(url, 5) == (True, "HTTP 200")
        assert _StoppedEngine.completions == 2 and own.sent == 2 and own.in_flight == 0
    finally:
        _StoppedEngine.release.clear()
        server.shutdown()
        server.server_close()


def test_the_launchers_own_completions_are_left_out_of_the_request_counters(tmp_path):
    from envlayers.launch.health import OwnRequests
    from envlayers.launch.meter import Meter

    own = OwnRequests()
    lp = prepare(SINGLE_VLLM, alloc(tmp_path, nodes=(Node("n1", "10.0.0.1", True),)))
    readings = iter([(5, 0), (5, 1), (6, 0), (7, 0), (7, 0)])  # (finished, running) as the engine says

    def fetch(url, key):
        finished, running = next(readings)
        return f'vllm:request_success_total{{finished_reason="stop"}} {finished}\nvllm:num_requests_running {running}\n'

    meter = Meter(lp, {}, lambda line: None, fetch=fetch, own=own)

    def sample():
        c = meter.sample()
        return c.finished, c.in_flight

    assert sample() == (5, 0)
    own.begin()  # a probe in flight: the engine counts it as running
    assert sample() == (5, 0)
    own.end()  # it finished: 6 finished, of which one is ours
    assert sample() == (5, 0)
    assert sample() == (6, 0)  # a client's request
    own.begin()  # counted before the engine saw it: the reading may lag, never goes back
    assert sample() == (6, 0)


# --------------------------------------------------------------------------- status and wait


EP = EndpointRecord.from_dict({
    "base_urls": ["http://n1:8000/v1", "http://n2:8000/v1"], "min_replicas": 1,
    "replicas": [{"rank": 0, "node": "n1", "alive": True, "ended": None},
                 {"rank": 1, "node": "n2", "alive": True, "ended": None},
                 {"rank": 2, "node": "n3", "alive": False, "ended": "exited with code 137 after the endpoint was live"}]})


@pytest.mark.parametrize("exits, ending", [
    pytest.param({2: 137}, False, id="dropped-replica-still-live"),
    pytest.param({1: 137}, True, id="an-exit-not-yet-dropped-is-the-end"),
    pytest.param({}, False, id="no-exit"),
])
def test_wait_counts_a_dropped_replicas_exit_as_live(exits, ending):
    from envlayers.ops.wait import _ending

    assert _ending(exits, EP) is ending
    assert _ending({0: 1}, EndpointRecord(base_urls=["x"])) is True  # no replicas list: any exit is the end


def test_status_and_wait_show_which_replicas_are_alive():
    from envlayers.cli.serving_format import replica_lines

    assert replica_lines(EP) == [
        ("replicas", "2 of 3 alive (rank 0 on n1, rank 1 on n2); the job ends below MIN_REPLICAS=1"),
        ("dropped", "rank 2 on n3: exited with code 137 after the endpoint was live")]
    assert replica_lines(EndpointRecord(base_urls=["x"])) == []
    assert replica_lines(EndpointRecord.from_dict({"replicas": "junk"})) == []


# --------------------------------------------------------------------------- successors

from envlayers.slurm import parse_job_fields  # noqa: E402


@pytest.mark.parametrize("limit, startup, minutes", [
    pytest.param(4 * 3600, 300, 228, id="4h-limit-5min-startup"),
    pytest.param(180, 2, 0, id="lab-3min"),
    pytest.param(300, 2, 2, id="lab-5min"),
    pytest.param(60, 30, 0, id="never-negative"),
])
def test_the_successor_starts_a_lead_before_the_limit(limit, startup, minutes):
    from envlayers.launch.successor import dependency

    assert dependency("41", limit, startup) == (f"after:41+{minutes}", minutes)


@pytest.mark.parametrize("keys, environ, left", [
    pytest.param({"SUCCESSORS": "2"}, {}, 2, id="first-job"),
    pytest.param({"SUCCESSORS": "2"}, {"ENVLAYERS_CHAIN_LEFT": "1"}, 1, id="a-successor"),
    pytest.param({}, {}, 0, id="off"),
    # a count the job inherited from elsewhere (the submitting shell) never makes the chain longer than the
    # layers' SUCCESSORS: unset, no successor at all
    pytest.param({}, {"ENVLAYERS_CHAIN_LEFT": "50"}, 0, id="inherited-with-successors-off"),
    pytest.param({"SUCCESSORS": "2"}, {"ENVLAYERS_CHAIN_LEFT": "50"}, 2, id="inherited-above-successors"),
])
def test_chain_left(keys, environ, left):
    from envlayers.launch.successor import chain_left

    assert chain_left(keys, environ) == left


def test_a_bad_successors_value_names_the_key():
    from envlayers.launch.successor import chain_left

    with pytest.raises(KeyValueError, match="^SUCCESSORS: must be a whole number, got 'two'; hint"):
        chain_left({"SUCCESSORS": "two"}, {})


# a line as `scontrol show job -o` prints it (Slurm 23.11), shortened
SCONTROL_41 = ("JobId=41 JobName=serve-only UserId=alice(1000) GroupId=alice(1000) Priority=1 Account=lab-acct "
               "QOS=(null) JobState=RUNNING Reason=None Dependency=(null) RunTime=00:00:12 TimeLimit=00:10:00 "
               "Partition=mi200 NodeList=n2 NumNodes=1 WorkDir=/home/alice/bench Reservation=(null) "
               "StdOut=/home/alice/bench/serve-only-41.out TresPerNode=gres:gpu:4")


def test_the_chain_submits_once_live_and_hands_over_after_the_drain(tmp_path):
    from envlayers.launch.successor import Chain, HandedOver
    from envlayers.rundir import CHAIN, ChainRecord, chain_of, read_json

    clock, said, calls = Clock(), [], []
    run_dir = tmp_path / "41"
    run_dir.mkdir()

    def run(argv, env):
        calls.append((argv, env["ENVLAYERS_CHAIN_LEFT"], env["ENVLAYERS_PREDECESSOR"], "SLURM_JOB_ID" in env))
        return subprocess.CompletedProcess(argv, 0, "57\n", "")

    chain = Chain("41", run_dir, 2, 30, say=said.append, environ={"SLURM_JOB_ID": "41", "SLURM_CONF": "/c"},
                  clock=clock, run=run, job_fields=lambda job: parse_job_fields(SCONTROL_41))
    chain.tick()  # nothing submitted yet: nothing to do
    chain.went_live(10.0)
    assert calls == [(["sbatch", "--parsable", "--dependency=after:41+7", "--time=0:10:00", "--partition=mi200",
                       "--account=lab-acct", "--chdir=/home/alice/bench", str(run_dir / "job.sh")], "1", "41", False)]
    assert read_json(run_dir / CHAIN) == {"predecessor": None, "successor": "57", "dependency": "after:41+7", "left": 2}
    assert chain_of(run_dir) == ChainRecord(successor="57", dependency="after:41+7", left=2)
    assert said[-1] == ("ENVLAYERS-STAGE: successor job 57: sbatch --parsable --dependency=after:41+7 --time=0:10:00 "
                        f"--partition=mi200 --account=lab-acct --chdir=/home/alice/bench {run_dir / 'job.sh'}")
    chain.tick()  # the successor is not live yet
    (tmp_path / "57").mkdir()
    (tmp_path / "57" / "endpoint.json").write_text(json.dumps({"base_urls": ["http://n2:8000/v1"]}))
    chain.tick()
    assert said[-1] == "ENVLAYERS-STAGE: successor job 57 is live at http://n2:8000/v1; this job drains for 30s and ends"
    clock.sleep(29)
    chain.tick()
    clock.sleep(1)
    with pytest.raises(HandedOver, match="handed over to successor job 57"):
        chain.tick()


@pytest.mark.parametrize("fields, options", [
    pytest.param({"Partition": "mi200", "Account": "(null)", "QOS": "normal", "Reservation": "maint",
                  "WorkDir": "/w"}, ["--partition=mi200", "--qos=normal", "--reservation=maint", "--chdir=/w"],
                 id="all-but-an-unset-account"),
    pytest.param({}, [], id="slurm-said-nothing"),
])
def test_the_successor_keeps_what_slurm_runs_the_job_with(fields, options):
    from envlayers.slurm import resubmit_options

    assert resubmit_options(fields) == options


def test_a_per_job_key_passes_down_the_chain(tmp_path):
    from envlayers.apikey import generate_key
    from envlayers.rundir import API_KEY as GENERATED_NAME, write_api_key
    from envlayers.launch.successor import Chain, inherited_key

    first, second = tmp_path / "41", tmp_path / "57"
    first.mkdir(), second.mkdir()
    key = generate_key()
    write_api_key(first, key)
    envs = []
    chain = Chain("41", first, 1, 30, say=lambda line: None, environ={"ENVLAYERS_CHAIN_KEY_FILE": "/stale"},
                  run=lambda argv, env: envs.append(env) or subprocess.CompletedProcess(argv, 0, "57\n", ""),
                  job_fields=lambda job: {"TimeLimit": "10:00"})
    chain.went_live(1.0)
    assert envs[0]["ENVLAYERS_CHAIN_KEY_FILE"] == str(first / GENERATED_NAME)
    said = []
    path, got = inherited_key(second, {**envs[0], "ENVLAYERS_PREDECESSOR": "41"}, said.append)
    assert (path, got) == (str(second / GENERATED_NAME), key)
    assert (second / GENERATED_NAME).read_text() == key + "\n"
    assert (second / GENERATED_NAME).stat().st_mode & 0o777 == 0o600
    assert said == [f"ENVLAYERS-STAGE: the chain's API key (job 41's, {first / GENERATED_NAME}) copied to "
                    f"{second / GENERATED_NAME} (mode 0600): clients keep their key"]
    # no generated key in the first job (a named key file): nothing to pass on, the job script names it
    (first / GENERATED_NAME).unlink()
    chain.record.successor = None
    chain.went_live(1.0)
    assert "ENVLAYERS_CHAIN_KEY_FILE" not in envs[1]
    # the file went away: a new key, said in words
    said.clear()
    assert inherited_key(second, {"ENVLAYERS_CHAIN_KEY_FILE": str(first / GENERATED_NAME),
                                  "ENVLAYERS_PREDECESSOR": "41"}, said.append) is None
    assert said[0].startswith(f"ENVLAYERS-WARN: cannot take the chain's API key from {first / GENERATED_NAME} (")
    assert said[0].endswith("a new key is generated; clients of job 41 must take it from `env_layers connect`")


def test_the_last_link_submits_nothing(tmp_path):
    from envlayers.launch.successor import Chain
    from envlayers.rundir import chain_of

    said = []
    chain = Chain("57", tmp_path, 0, 30, say=said.append, environ={"ENVLAYERS_PREDECESSOR": "41"},
                  run=lambda argv, env: pytest.fail("submitted"), job_fields=lambda job: {"TimeLimit": "10:00"})
    chain.went_live(3.0)
    assert said == ["ENVLAYERS-STAGE: last job of the chain (after job 41): no successor"]
    assert chain_of(tmp_path).predecessor == "41"


@pytest.mark.parametrize("mode, owner, why", [
    pytest.param(0o644, None, "others may read or write it (mode 0644)", id="readable-by-others"),
    pytest.param(0o620, None, "is writable by others (mode 0620)", id="group-writable"),
    pytest.param(0o600, 4242, "the key file belongs to", id="another-users-file"),
])
def test_a_chain_key_file_others_could_know_is_not_taken(tmp_path, mode, owner, why):
    # ENVLAYERS_CHAIN_KEY_FILE naming a file another user wrote would make the server accept a key they know
    from envlayers.launch.successor import inherited_key

    planted = tmp_path / "theirs"
    planted.write_text("k-known-to-someone-else\n")
    planted.chmod(mode)
    if owner is not None:
        if os.getuid() != 0:
            pytest.skip("only root can give a file to another uid")
        os.chown(planted, owner, -1)
    mine = tmp_path / "57"
    mine.mkdir()
    said: list[str] = []
    assert inherited_key(mine, {"ENVLAYERS_CHAIN_KEY_FILE": str(planted), "ENVLAYERS_PREDECESSOR": "41"},
                         said.append) is None
    assert len(said) == 1 and said[0].startswith(f"ENVLAYERS-WARN: cannot take the chain's API key from {planted} (")
    assert why in said[0] and not list(mine.iterdir())


# --------------------------------------------------------------------------- progress: /health says 200, no token comes


def progress_watch(clock, readings, answers=None, fail_after=600, stall_after=60, ranks=1):
    """A synchronous HealthWatch whose /metrics reading of rank r is ``readings[r]()`` and whose probe
    answers ``answers[r]()`` (healthy by default)."""
    from envlayers.launch.health import HealthSettings

    urls = {r: f"http://10.0.0.{r + 1}:8000/health" for r in range(ranks)}
    by_url = {u: r for r, u in urls.items()}
    answers = answers or {}
    settings = HealthSettings(fail_after, 12.0, 30.0, stall_after)
    return HealthWatch(urls, settings, clock=clock, background=False,
                       get=lambda url, t: answers.get(by_url[url], lambda: (True, "HTTP 200"))(),
                       progress=lambda url, t: readings[by_url[url]]())


def test_requests_in_flight_and_no_token_end_a_single_server_although_health_answers(tmp_path):
    clock = Clock()
    tokens = {"n": 0.0, "frozen": False}

    def reading():
        if not tokens["frozen"]:
            tokens["n"] += 40
        return tokens["n"], 3.0

    lp = prepare({**SINGLE_VLLM, "ENVLAYERS_READY_TIMEOUT_S": "100"}, alloc(tmp_path, nodes=NODES3[:1]))
    sup = Supervisor(lp, Step(), probe=lambda u, s, k, timeout_s: Probe(u, True, 200, "ok"), on_live=lambda e: None,
                     say=lambda line: None, clock=clock, sleep=clock.sleep,
                     health=progress_watch(clock, {0: reading}, stall_after=60))
    started(tmp_path, 0)
    clock.at(100, lambda: tokens.update(frozen=True))
    with pytest.raises(LaunchFailure) as err:
        sup.run()
    said = str(err.value)
    assert said.startswith("rank 0 on n1 stopped generating after the endpoint was live: 3 request(s) running or "
                           "waiting and the watch's one-token completion, and its generated-token counter stayed at ")
    assert said.endswith("(PROGRESS_STALL_AFTER_S=60); the watch's last probe: HTTP 200")
    # noticed within the window and one probe interval (12s) of the first reading that saw no advance
    assert 100 + 60 <= clock.t - 1000 <= 100 + 60 + 2 * 12 + 1


def test_a_busy_engine_whose_counter_advances_and_an_idle_one_are_never_stuck():
    clock = Clock()
    n = {"busy": 0.0}

    def busy():
        n["busy"] += 1
        return n["busy"], 8.0

    w = progress_watch(clock, {0: busy, 1: lambda: (500.0, 0.0)}, fail_after=0, ranks=2)  # rank 1: idle, no probe
    w.start()
    for _ in range(600):
        assert w.tick() == []
        clock.sleep(1)


def test_an_idle_engine_whose_one_token_completion_never_comes_is_stuck_before_health_gives_up():
    clock = Clock()
    # idle: nothing running; the probe's token never comes (the engine core stopped); /health still 200
    w = progress_watch(clock, {0: lambda: (500.0, 0.0)}, answers={0: lambda: (True, "HTTP 200")},
                       fail_after=600, stall_after=60)
    w.start()
    reported = []
    while not reported and clock.t < 1000 + 600:
        reported = w.tick()
        clock.sleep(1)
    ((rank, what),) = reported
    assert rank == 0 and clock.t - 1000 < 120
    assert what.startswith("stopped generating after the endpoint was live: the watch's one-token completion, "
                           "and its generated-token counter stayed at 500 for ")


def test_a_reading_that_fails_stops_nothing_and_a_restarted_counter_is_progress():
    from envlayers.launch.health import RankHealth, note_progress

    h = RankHealth("u", 0.0)
    note_progress(h, 0.0, (100.0, 2.0))
    note_progress(h, 10.0, (100.0, 2.0))
    assert h.work_since == 10.0
    note_progress(h, 20.0, None)
    assert h.work_since == 10.0  # unreadable: neither progress nor stall
    note_progress(h, 30.0, (3.0, 2.0))  # a restarted server counts from 0 again
    assert h.work_since is None and h.tokens == 3.0


def test_a_stuck_replica_leaves_and_the_others_serve_on(tmp_path):
    clock = Clock()
    stuck = {"r": None}
    count = {r: 0.0 for r in range(3)}

    def reading(r):
        def read():
            if stuck["r"] != r:
                count[r] += 5
            return count[r], 1.0
        return read

    health = progress_watch(clock, {r: reading(r) for r in range(3)}, stall_after=60, ranks=3)
    sup, steps, released, said = replicas_loop(tmp_path, clock, health=health)
    clock.at(50, lambda: stuck.update(r=2))
    clock.at(300, stop)
    with pytest.raises(Stop):
        sup.run()
    errors = [line for line in said if line.startswith("ENVLAYERS-ERROR: replica")]
    assert len(errors) == 1 and errors[0].startswith("ENVLAYERS-ERROR: replica rank 2 on n3 stopped generating "
                                                     "after the endpoint was live: 1 request(s) running or waiting")
    assert steps.ended == [2] and released == [["n1", "n2"]]


@pytest.mark.parametrize("keys, want", [
    pytest.param({}, (600, 30.0, 60.0, 300), id="defaults"),
    pytest.param({"PROGRESS_STALL_AFTER_S": "20"}, (600, 4.0, 60.0, 20), id="stall-shorter-sets-the-interval"),
    pytest.param({"HEALTH_FAIL_AFTER_S": "0", "PROGRESS_STALL_AFTER_S": "0"}, (0, 1.0, 1.0, 0), id="both-off"),
])
def test_progress_settings_follow_the_key(keys, want):
    s = health_settings(keys)
    assert (s.fail_after_s, s.interval_s, s.timeout_s, s.stall_after_s) == want


def test_read_progress_reads_vllm_and_leaves_sglang_to_health():
    from envlayers.launch.health import metrics_progress, read_progress

    text = ('vllm:generation_tokens_total{engine="0",model_name="m"} 1234.0\n'
            'vllm:num_requests_running{engine="0",model_name="m"} 2.0\n'
            'vllm:num_requests_waiting{engine="0",model_name="m"} 1.0\n')
    assert read_progress("vllm", text) == (1234.0, 3.0)
    assert read_progress("vllm", "vllm:num_requests_running 2.0\n") is None
    assert metrics_progress("sglang", None) is None and metrics_progress("vllm", None) is not None
