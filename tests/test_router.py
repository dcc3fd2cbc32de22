"""ROUTER=smg without a cluster: the router's argv and keys (engines/router.py), the dry run's line, the
launcher's side of it (launch/router.py) with a fake process and fake HTTP, and its counters."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from envlayers.engines import router as er
from envlayers.errors import EnvLayersError
from envlayers.launch import router as lr
from envlayers.launch.idle import Counters
from envlayers.launch.prepare import LaunchFailure

REPO = Path(__file__).resolve().parents[1]
WORKERS = ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]


# --------------------------------------------------------------------------- keys and argv (pure)


@pytest.mark.parametrize("value, want", [
    pytest.param(None, None, id="absent-no-router"),
    pytest.param("", None, id="empty-no-router"),
    pytest.param("none", None, id="none"),
    pytest.param(" smg ", "smg", id="smg"),
])
def test_router_key_values(value, want):
    keys = {} if value is None else {"ROUTER": value}
    assert er.router_choice(keys) == want


def test_an_unknown_router_is_refused_naming_the_key():
    with pytest.raises(EnvLayersError) as err:
        er.router_choice({"ROUTER": "vllm-router"})
    assert err.value.key == "ROUTER" and "ROUTER=smg" in err.value.hint


def test_a_router_outside_the_replicas_shape_is_refused():
    with pytest.raises(EnvLayersError, match="routes between replicas, and this plan is the single shape"):
        er.check({"ROUTER": "smg"}, "single", 8000)


@pytest.mark.parametrize("port", ["8000", "7999"])
def test_a_router_port_that_takes_the_servers_port_is_refused(port):
    with pytest.raises(EnvLayersError, match="collides with SERVER_PORT=8000") as err:
        er.check({"ROUTER": "smg", "ROUTER_PORT": port}, "replicas", 8000)
    assert err.value.key == "ROUTER_PORT"


@pytest.mark.parametrize("key, value", [("ROUTER_PORT", "x"), ("ROUTER_PORT", "0"), ("ROUTER_PORT", "65535"),
                                        ("ROUTER_POLICY", "fastest")])
def test_bad_router_settings_are_refused_naming_the_key(key, value):
    with pytest.raises(EnvLayersError) as err:
        er.check({"ROUTER": "smg", key: value}, "replicas", 8000)
    assert err.value.key == key


def test_no_router_plan_without_the_key():
    assert er.plan_router({}, "replicas", 8000, WORKERS, True) is None


def test_the_router_argv_names_every_replica_and_binds_server_host():
    rp = er.plan_router({"ROUTER": "smg", "SERVER_HOST": "10.0.0.1", "ROUTER_POLICY": "round_robin"}, "replicas",
                        8000, WORKERS, True)
    assert rp.argv == ("smg", "launch", "--host", "10.0.0.1", "--port", "30000", "--worker-urls", *WORKERS,
                       "--policy", "round_robin", "--prometheus-host", "10.0.0.1", "--prometheus-port", "30001",
                       "--health-check-interval-secs", "5", "--health-failure-threshold", "2",
                       "--shutdown-grace-period-secs", "5", "--disable-tokenizer-autoload", "--log-level", "warn")
    assert "--api-key" not in rp.argv
    assert rp.line().endswith("# --api-key from SERVER_API_KEY_FILE, in $ENVLAYERS_ROUTER_API_KEY")


def test_the_router_binds_every_interface_by_default_with_cache_aware_routing():
    rp = er.plan_router({"ROUTER": "smg"}, "replicas", 8000, WORKERS, False)
    assert (rp.host, rp.port, rp.metrics_port, rp.policy) == ("0.0.0.0", 30000, 30001, "cache_aware")
    assert "#" not in rp.line()


def test_the_pin_is_the_router_extra_of_the_package():
    text = (REPO / "pyproject.toml").read_text()
    assert f'router = ["{er.PIN}"]' in text
    assert "router" in (REPO / "scripts" / "test.sh").read_text().split("-e '.[", 1)[1].split("]", 1)[0]


@pytest.mark.parametrize("url, root", [("http://n1:8000/v1", "http://n1:8000"), ("http://n1:8000/", "http://n1:8000")])
def test_a_worker_url_is_the_replicas_root(url, root):
    assert er.worker_root(url) == root


# --------------------------------------------------------------------------- the dry run


def test_the_dry_run_shows_the_routers_command_line(tmp_path):
    from envlayers.jobscript import prepare

    serve_env = tmp_path / "serve.env"
    serve_env.write_text("ROUTER=smg\n")
    edf = tmp_path / "edf"
    edf.mkdir()
    job = prepare(REPO, "qwen38", "replicas", env_file=serve_env, python="/usr/bin/python3",
                  environ={"EDF_PATH": str(edf), "HOME": str(tmp_path)})
    text = job.dry_run_text()
    assert "# The router the launcher starts on node 0, outside the container, once every replica is live\n" in text
    assert ("#   smg launch --host 0.0.0.0 --port 30000 --worker-urls http://NODE0:8000 http://NODE1:8000 "
            "--policy cache_aware") in text
    assert job.to_json()["router"].startswith("smg launch")
    plain = prepare(REPO, "qwen38", "replicas", python="/usr/bin/python3",
                    environ={"EDF_PATH": str(edf), "HOME": str(tmp_path)})
    assert "router" not in plain.dry_run_text() and "router" not in plain.to_json()


def test_the_dry_run_warns_when_the_launchers_python_has_no_router(tmp_path, monkeypatch):
    import importlib.util

    from envlayers.jobscript import prepare

    serve_env = tmp_path / "serve.env"
    serve_env.write_text("ROUTER=smg\n")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    job = prepare(REPO, "qwen38", "replicas", env_file=serve_env, environ={"EDF_PATH": str(tmp_path),
                                                                             "HOME": str(tmp_path)})
    assert any(w.startswith(f"ROUTER=smg: smg is not installed in {sys.executable}") for w in job.warnings)


def test_the_dry_run_refuses_a_router_for_one_server_naming_the_line(tmp_path):
    from envlayers.jobscript import prepare

    serve_env = tmp_path / "serve.env"
    serve_env.write_text("ROUTER=smg\n")
    with pytest.raises(EnvLayersError) as err:
        prepare(REPO, "qwen38", "experiment", env_file=serve_env, python="/usr/bin/python3",
                environ={"EDF_PATH": str(tmp_path), "HOME": str(tmp_path)})
    assert str(err.value).startswith(f"{serve_env}:1: ROUTER: smg routes between replicas")


# --------------------------------------------------------------------------- counters and health


METRICS = """\
# TYPE smg_http_responses_total counter
smg_http_responses_total{path="/v1/chat/completions",status_code="200",error_code=""} 7
smg_http_responses_total{path="/v1/completions",status_code="503",error_code="x"} 1
smg_http_responses_total{path="/v1/chat/completions",status_code="401",error_code=""} 5
smg_http_responses_total{path="/v1/models",status_code="200",error_code=""} 40
smg_http_responses_total{path="/health",status_code="200",error_code=""} 9
smg_worker_requests_active{worker="http://10.0.0.1:8000"} 2
smg_worker_requests_active{worker="http://10.0.0.2:8000"} 1
smg_worker_health{worker="http://10.0.0.1:8000"} 1
smg_worker_health{worker="http://10.0.0.2:8000"} 0
"""


def test_the_routers_counters_are_its_answers_on_request_paths_and_its_active_requests():
    assert lr.read_counters(METRICS) == Counters(8.0, 3.0)


def test_metrics_without_the_routers_families_read_as_unknown():
    assert lr.read_counters("vllm:request_success_total 3\n") is None


def test_worker_health_is_the_routers_own_view():
    assert lr.worker_health(METRICS) == {"http://10.0.0.1:8000": True, "http://10.0.0.2:8000": False}


def test_the_router_port_skips_busy_ports_and_the_servers_port():
    busy = {30000, 30003}
    assert lr.choose_port(30000, [8000], free=lambda p: p not in busy) == 30001
    assert lr.choose_port(7999, [8000], free=lambda p: True) == 8001
    with pytest.raises(LaunchFailure, match="no free router port on node 0 in 30000-30003"):
        lr.choose_port(30000, [], free=lambda p: False, span=4)


# --------------------------------------------------------------------------- the launcher's side


class FakeProc:
    def __init__(self, code=None):
        self.code, self.pid, self.argv, self.env = code, 4242, None, None

    def poll(self):
        return self.code

    @property
    def returncode(self):
        return self.code


def make_router(tmp_path, answers, proc=None, key="k" * 16, free=lambda p: True):
    said, seen = [], []
    proc = proc or FakeProc()

    def popen(argv, **kw):
        proc.argv, proc.env = argv, kw["env"]
        return proc

    def get(url, api_key, timeout_s=2.0):
        seen.append((url, api_key))
        return answers(url)

    clock = iter(range(0, 10_000))
    r = lr.Router({"ROUTER": "smg"}, "replicas", 8000, [w + "/v1" for w in WORKERS], tmp_path, key, said.append,
                  url_host="n1", python="/py", popen=popen, get=get, free=free, clock=lambda: next(clock),
                  sleep=lambda s: None)
    return r, proc, said, seen


def test_the_router_starts_with_the_key_in_its_environment_and_waits_for_every_replica(tmp_path):
    r, proc, said, seen = make_router(tmp_path, lambda url: (200, METRICS.replace("} 0\n", "} 1\n")))
    r.start()
    assert proc.argv[:3] == ["/py", "-c", er.ENTRY] and proc.argv[3:] == list(r.plan.argv[2:])
    assert "k" * 16 not in " ".join(proc.argv) and proc.env[er.KEY_ENV] == "k" * 16
    assert "SERVER_API_KEY" not in proc.env
    assert ("http://127.0.0.1:30000/v1/models", "k" * 16) in seen
    assert said[-1].startswith("ENVLAYERS-STAGE: router live at http://n1:30000/v1 in front of 2 replica(s)")
    rec = r.record()
    assert rec["base_url"] == "http://n1:30000/v1" and rec["workers"] == WORKERS


def test_a_router_that_exits_at_start_ends_the_launch_naming_its_log(tmp_path):
    r, _, _, _ = make_router(tmp_path, lambda url: (None, ""), proc=FakeProc(code=1))
    with pytest.raises(LaunchFailure, match=r"the router exited with code 1 before it answered; see .*router.log"):
        r.start()


def test_a_router_with_one_healthy_replica_goes_live_with_a_warning(tmp_path):
    r, _, said, _ = make_router(tmp_path, lambda url: (200, METRICS))
    r.start()
    assert any(s.startswith("ENVLAYERS-WARN: the router routes to 1 of 2 replicas after 60s") for s in said)


def test_a_moved_router_port_is_said(tmp_path):
    r, _, said, _ = make_router(tmp_path, lambda url: (200, METRICS.replace("} 0\n", "} 1\n")),
                                free=lambda p: p not in (30000, 30001))
    r.start()
    assert r.plan.port == 30002 and said[0].startswith("ENVLAYERS-TOPOLOGY: router_port=30002")


def test_the_router_gone_after_live_ends_the_job(tmp_path):
    r, proc, _, _ = make_router(tmp_path, lambda url: (200, METRICS.replace("} 0\n", "} 1\n")))
    r.start()
    r.tick()
    proc.code = -9
    with pytest.raises(LaunchFailure, match="the router exited with code -9 after the endpoint was live"):
        r.tick()


def test_a_control_call_smg_refuses_gives_its_error_body_and_one_nothing_answers_gives_the_reason():
    import http.server
    import socket
    import threading

    class Refuses(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            body = b'{"error": "worker http://10.0.0.9:8000 failed its health check"}'
            self.send_response(400)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refuses)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        status, text = lr._call("POST", f"http://127.0.0.1:{server.server_port}/workers", "k" * 16, {"url": "x"})
    finally:
        server.shutdown()
        server.server_close()
    assert status == 400 and "failed its health check" in text  # what add_worker puts in its warning
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/workers"
        status, text = lr._call("GET", url, None, timeout_s=2.0)
    assert status is None and text.startswith(url + ": ") and "refused" in text


def test_the_routers_view_of_its_workers_goes_to_its_state_file_and_each_change_is_said(tmp_path):
    from envlayers.cli.serving_format import replica_lines
    from envlayers.rundir import ROUTER_STATE, JobFiles, read_router_state

    healthy = METRICS.replace("} 0\n", "} 1\n")
    answers = {"text": healthy}
    r, _, said, _ = make_router(tmp_path, lambda url: (200, answers["text"]))
    r.start()
    del said[:]
    assert r.counters() == Counters(8.0, 3.0)
    assert read_router_state(tmp_path).workers == {w: True for w in WORKERS} and said == []  # first view: no change
    assert r.counters() is not None and said == []  # unchanged: nothing said, nothing rewritten
    answers["text"] = METRICS  # smg marks replica 1 down
    r.counters()
    assert said == [f"ENVLAYERS-WARN: router: {WORKERS[1]} marked down by its health checks (1 of 2 replica(s) healthy)"]
    assert read_router_state(tmp_path).workers == {WORKERS[0]: True, WORKERS[1]: False}
    answers["text"] = healthy
    r.counters()
    assert said[-1] == f"ENVLAYERS-STAGE: router: {WORKERS[1]} healthy again by its health checks (2 of 2 replica(s) healthy)"
    answers["text"] = METRICS
    r.counters()
    # status reads it beside endpoint.json and shows the router's own count
    (tmp_path / "endpoint.json").write_text(json.dumps({
        "base_url": "http://n1:30000/v1", "router": {"kind": "smg"}, "min_replicas": 1,
        "replicas": [{"rank": 0, "node": "n1", "alive": True}, {"rank": 1, "node": "n2", "alive": True}]}))
    ep = JobFiles("1", None, tmp_path).endpoint()
    assert ep.router_state.workers[WORKERS[1]] is False and (tmp_path / ROUTER_STATE).is_file()
    assert ("router", f"1 of 2 replica(s) healthy in the router's own checks (down: {WORKERS[1]})") in replica_lines(ep)


def test_a_router_state_file_with_bad_values_reads_as_what_is_valid(tmp_path):
    from envlayers.rundir import ROUTER_STATE, read_router_state

    (tmp_path / ROUTER_STATE).write_text('{"workers": {"http://a:1": true, "http://b:1": "yes"}, "at": true}')
    state = read_router_state(tmp_path)
    assert state.workers == {"http://a:1": True} and state.at is None and state.healthy == 1
    assert read_router_state(tmp_path / "nowhere") is None


def test_the_meter_reads_the_routers_counters_not_the_replicas(tmp_path):
    from envlayers.launch.meter import Meter

    class Lp:  # the meter reads only these of the plan before sampling
        engine, metrics, run_dir = "vllm", True, tmp_path

    meter = Meter.__new__(Meter)
    meter.router = type("R", (), {"counters": lambda self: Counters(5.0, 1.0)})()
    meter.lp = Lp()
    meter.fetch = lambda *a, **k: pytest.fail("the replicas' /metrics were read")
    assert meter.sample() == Counters(5.0, 1.0)


def test_survivors_keep_the_routers_url_as_the_endpoint(tmp_path):
    from envlayers.launch.prepare import Node, Target
    from envlayers.launch.replicas import Survivors
    from envlayers.rundir import EndpointRecord

    nodes = (Node("n1", "10.0.0.1", True), Node("n2", "10.0.0.2", True))
    targets = tuple(Target(i, f"http://n{i + 1}:8000/v1", f"{WORKERS[i]}/v1", f"10.0.0.{i + 1}") for i in range(2))
    lp = type("Lp", (), {"nodes": nodes, "targets": targets, "ranks": 2, "run_dir": tmp_path})()
    written = {}
    s = Survivors(lp, object(), 1, say=lambda line: None, tail=lambda p: [], release=lambda keep: None,
                  write=lambda path, data: written.update(data), background=lambda fn: fn())
    s.went_live(EndpointRecord(base_urls=["http://n1:30000/v1"], router={"kind": "smg"}))
    s.lost(1, "exited with code 137 after the endpoint was live")
    assert written["base_urls"] == ["http://n1:30000/v1"] and written["base_url"] == "http://n1:30000/v1"
    assert written["replica_urls"] == ["http://n1:8000/v1"] and written["replica_addresses"] == ["10.0.0.1"]
    assert [r["alive"] for r in written["replicas"]] == [True, False]


def test_the_block_names_the_routers_own_metrics_url():
    from envlayers.readiness import block
    from envlayers.rundir import EndpointRecord

    ep = EndpointRecord("7", "s", "m", "vllm", "replicas", ["http://n1:30000/v1"], False, "/r",
                        metrics_at="http://n1:30001/metrics")
    assert "metrics: http://n1:30001/metrics\n" in block(ep)
    assert ep.to_dict()["metrics_at"] == "http://n1:30001/metrics"
    plain = EndpointRecord("7", "s", "m", "vllm", "replicas", ["http://n1:8000/v1"], False, "/r")
    assert "metrics: http://n1:8000/metrics\n" in block(plain)


def test_a_router_port_left_in_time_wait_by_the_previous_router_is_free():
    # the previous job's router (a Rust listener: SO_REUSEADDR) closed its connections first: TIME_WAIT on its
    # port for a minute; the next job's router binds it fine, so the check must not move the port for it
    from envlayers.launch.ports import port_free
    from nettools import time_wait_port

    assert port_free(time_wait_port())


# --------------------------------------------------------------------------- the elastic pool's keys


def test_max_replicas_without_a_router_is_refused_naming_the_key():
    with pytest.raises(EnvLayersError, match="the pool grows behind the router") as err:
        er.check({"MAX_REPLICAS": "3"}, "replicas", 8000)
    assert err.value.key == "MAX_REPLICAS" and "ROUTER=smg" in err.value.hint


@pytest.mark.parametrize("value, want", [pytest.param(None, None, id="absent"), pytest.param("", None, id="empty"),
                                         pytest.param("2", 2, id="as-started"), pytest.param("5", 5, id="above")])
def test_max_replicas_values(value, want):
    keys = {"ROUTER": "smg", **({} if value is None else {"MAX_REPLICAS": value})}
    assert er.max_replicas(keys, 2) == want


@pytest.mark.parametrize("value", ["1", "0", "x"])
def test_max_replicas_below_the_started_replicas_or_not_a_count_is_refused(value):
    with pytest.raises(EnvLayersError) as err:
        er.plan_router({"ROUTER": "smg", "MAX_REPLICAS": value}, "replicas", 8000, WORKERS, False)
    assert err.value.key == "MAX_REPLICAS"


def test_the_dry_run_refuses_max_replicas_below_the_replicas_naming_the_line(tmp_path):
    from envlayers.jobscript import prepare

    serve_env = tmp_path / "serve.env"
    serve_env.write_text("ROUTER=smg\nMAX_REPLICAS=1\n")
    edf = tmp_path / "edf"
    edf.mkdir()
    with pytest.raises(EnvLayersError) as err:
        prepare(REPO, "qwen38", "replicas", env_file=serve_env, python="/usr/bin/python3",
                environ={"EDF_PATH": str(edf), "HOME": str(tmp_path)})
    assert str(err.value).startswith(f"{serve_env}:2: MAX_REPLICAS: 1 is fewer than the 2 replicas")
