"""The gateway's own /metrics: replicas' Prometheus texts merged into one exposition, and the survival policy.

Pure parts of gateway_app.py; the Ray side (readers on each node, the registry) runs in the lab e2e
tests (tests/slurm/test_ray_e2e.py, tests/slurm/test_metrics_e2e.py).
"""

from __future__ import annotations

import re

import pytest
from extratools import needs_extra

from envlayers.gateway_app import RECOVERED_AFTER_S, Survival, exit_words, merge_expositions
from envlayers.launch.idle import parse_prometheus, read_counters

# one sample of the Prometheus text exposition format: name{labels} value [timestamp]
SAMPLE_RE = re.compile(r'[a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*"'
                       r'(,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*")*,?\})? '
                       r'([-+]?[0-9.]+([eE][-+]?[0-9]+)?|[-+]?Inf|NaN)( -?[0-9]+)?\Z')

VLLM = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} %(running)s
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} %(stop)s
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 1.0
# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{le="1.0",model_name="m"} 2.0
vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="m"} 3.0
vllm:e2e_request_latency_seconds_sum{model_name="m"} 2.5
vllm:e2e_request_latency_seconds_count{model_name="m"} 3.0
"""


def valid(text: str) -> list[str]:
    """The sample lines; every other line is a comment. Each family's samples are contiguous."""
    samples, closed, current = [], set(), None
    for line in text.splitlines():
        assert line.strip(), "blank line"
        if line.startswith("#"):
            continue
        assert SAMPLE_RE.match(line), line
        samples.append(line)
    families = []
    for line in text.splitlines():
        if line.startswith(("# HELP ", "# TYPE ")):
            name = line.split()[2]
            if name != current:
                assert name not in closed, f"family {name} split"
                if current:
                    closed.add(current)
                current = name
                families.append(name)
    return samples


def test_two_replicas_merge_into_one_valid_exposition_with_a_replica_label_each():
    out = merge_expositions([("0", VLLM % {"running": 1, "stop": 4}), ("1", VLLM % {"running": 0, "stop": 6})])
    samples = valid(out)
    assert len(samples) == 2 * 7
    assert all(s.startswith(s.split("{")[0] + '{replica="') for s in samples)
    assert 'vllm:request_success_total{replica="1",engine="0",finished_reason="stop",model_name="m"} 6' in out
    for kind in ("HELP", "TYPE"):  # once per family
        assert out.count(f"# {kind} vllm:request_success_total ") == 1
        assert out.count(f"# {kind} vllm:e2e_request_latency_seconds ") == 1
    # families in first-seen order, each family's samples (both replicas) together, histograms whole
    heads = [line.split()[2] for line in out.splitlines() if line.startswith("# TYPE")]
    assert heads == ["vllm:num_requests_running", "vllm:request_success_total", "vllm:e2e_request_latency_seconds"]
    lines = out.splitlines()
    hist = lines.index("# TYPE vllm:e2e_request_latency_seconds histogram")
    assert all(line.startswith("vllm:e2e_request_latency_seconds_") for line in lines[hist + 1:])
    assert len(lines[hist + 1:]) == 8
    # the idle meter's reading sums across the replica labels
    assert read_counters("vllm", out).finished == 4 + 1 + 6 + 1
    assert read_counters("vllm", out).in_flight == 1


def test_label_values_with_quotes_braces_and_escapes_pass_through_unchanged():
    text = ('# TYPE odd counter\n'
            'odd{path="/a{b}",say="he said \\"hi\\"",nl="x\\ny",bs="c:\\\\d"} 3 1700000000000\n'
            'plain 2\n'
            'empty{} 1\n'
            'trailing{a="1",} 5\n')
    out = merge_expositions([("0", text)])
    assert ('odd{replica="0",path="/a{b}",say="he said \\"hi\\"",nl="x\\ny",bs="c:\\\\d"} 3 1700000000000'
            in out.splitlines())
    assert 'plain{replica="0"} 2' in out.splitlines()
    assert 'empty{replica="0"} 1' in out.splitlines()
    assert 'trailing{replica="0",a="1",} 5' in out.splitlines()
    valid(out)
    assert parse_prometheus(out) == {"odd": 3.0, "plain": 2.0, "empty": 1.0, "trailing": 5.0}


def test_help_and_type_come_once_even_when_replicas_differ_or_repeat_them():
    a = "# HELP x first help\n# TYPE x counter\nx_total 1\n"
    b = "# HELP x other help\n# TYPE x counter\nx_total 2\n# HELP y why\ny 3\n"
    out = merge_expositions([("0", a), ("1", b)])
    assert out == ('# HELP x first help\n# TYPE x counter\nx_total{replica="0"} 1\nx_total{replica="1"} 2\n'
                   '# HELP y why\ny{replica="1"} 3\n')


def test_empty_input_gives_an_empty_exposition():
    assert merge_expositions([]) == ""
    assert merge_expositions([("0", ""), ("1", "\n# just a comment\n")]) == ""


def test_a_replica_that_did_not_answer_is_named_in_a_comment_and_the_rest_still_count():
    out = merge_expositions([("0", VLLM % {"running": 0, "stop": 2}), ("1", None), ("2", None)],
                            {"1": "no answer within 4s"})
    assert out.splitlines()[:2] == ['# replica="1" did not answer: no answer within 4s',
                                    '# replica="2" did not answer: no metrics']
    assert 'replica="1"' not in "".join(valid(out))
    assert read_counters("vllm", out).finished == 3


def test_untyped_samples_between_families_start_their_own_family():
    out = merge_expositions([("0", "# TYPE a gauge\na 1\nb 2\n"), ("1", "b 3\n# TYPE a gauge\na 4\n")])
    assert out == '# TYPE a gauge\na{replica="0"} 1\na{replica="1"} 4\nb{replica="0"} 2\nb{replica="1"} 3\n'


@pytest.mark.parametrize("code, words", [(3, "exited with code 3"), (-9, "was killed by SIGKILL (exit code 137)")])
def test_exit_words(code, words):
    assert exit_words(code) == words


def test_survival_ends_only_after_the_grace_below_the_minimum():
    policy = Survival(minimum=1, grace_s=60)
    assert policy.feed(0, 2) is None and policy.feed(10, 1) is None  # one of two died: still enough
    assert policy.feed(20, 0) is None and policy.feed(79, 0) is None  # none healthy: inside the grace
    assert policy.feed(81, 0) == 61  # past it


def test_survival_counts_a_recovery_only_once_it_held():
    policy = Survival(minimum=2, grace_s=60)
    policy.feed(0, 2)
    policy.feed(1, 1)  # below since 1
    policy.feed(20, 2)  # a replacement answers ...
    assert policy.feed(25, 1) is None  # ... and dies again before it held: the clock keeps running
    assert policy.feed(62, 1) == 61
    steady = Survival(minimum=2, grace_s=60)
    steady.feed(0, 1)
    steady.feed(10, 2)
    steady.feed(10 + RECOVERED_AFTER_S, 2)  # held: a recovery
    assert steady.feed(70, 1) is None and steady.feed(70 + 61, 1) == 61


def test_once_live_the_meter_says_the_gateways_replica_lines_from_rank_zeros_log(tmp_path):
    from envlayers.launch.meter import Meter
    from envlayers.launch.prepare import prepare
    from launchtools import GATEWAY, ray_alloc as alloc

    lp = prepare(GATEWAY, alloc(tmp_path))
    said = []
    bodies = iter([VLLM % {"running": 0, "stop": 1}] * 10)
    meter = Meter(lp, {}, said.append, clock=lambda: 0.0, wall=lambda: 1e9, fetch=lambda *a, **k: next(bodies))
    log = tmp_path / "server-0.log"
    log.write_text("ENVLAYERS-STAGE: gateway: deploying 2 replica(s)\n")  # before live: not repeated
    meter.tick(0.0, 2, True)
    with log.open("a") as fh:
        fh.write("(ServeReplica pid=1) noise\nENVLAYERS-ERROR: gateway: replica 1 on n2: its vllm serve (pid 9) "
                 "was killed by SIGKILL (exit code 137); Ray Serve replaces the replica\nENVLAYERS-STAGE: gateway: "
                 "replica 1 on n2 repl")
    meter.tick(1.0, 2, True)
    assert [s for s in said if "gateway" in s] == [
        "ENVLAYERS-ERROR: gateway: replica 1 on n2: its vllm serve (pid 9) was killed by SIGKILL (exit code 137); "
        "Ray Serve replaces the replica"]
    with log.open("a") as fh:
        fh.write("aced: its new vllm serve (pid 10) answers on 127.0.0.1:5\n")
    meter.tick(2.0, 2, True)
    assert said[-1] == "ENVLAYERS-STAGE: gateway: replica 1 on n2 replaced: its new vllm serve (pid 10) answers on 127.0.0.1:5"


def test_a_gateway_line_split_where_the_meter_takes_over_from_the_phase_reader_is_said_whole_once(tmp_path):
    # before live the phase reader reads rank 0's log; from live on the relay does, from where it stopped,
    # which can be the middle of a gateway line
    import json

    from envlayers.launch.meter import Meter
    from envlayers.launch.prepare import prepare
    from launchtools import GATEWAY, ray_alloc as alloc

    lp = prepare(GATEWAY, alloc(tmp_path))
    said = []
    bodies = iter([VLLM % {"running": 0, "stop": 1}] * 10)
    meter = Meter(lp, {}, said.append, clock=lambda: 0.0, wall=lambda: 1e9, fetch=lambda *a, **k: next(bodies))
    (tmp_path / "endpoint.json").write_text(json.dumps({"job_id": "9"}))
    log = tmp_path / "server-0.log"
    line = ("ENVLAYERS-ERROR: gateway: replica 1 on n2: its vllm serve (pid 9) was killed by SIGKILL (exit code 137); "
            "Ray Serve replaces the replica")
    cut = line.index("killed")
    log.write_text("ENVLAYERS-STAGE: gateway: deploying 2 replica(s)\n" + line[:cut])
    meter.tick(0.0, 2, False)  # the phase reader stops in the middle of the line
    meter.tick(1.0, 2, True)  # live: the relay takes over from here
    assert meter.relay.tail.offset == log.stat().st_size
    with log.open("a") as fh:
        fh.write(line[cut:] + "\n(ServeReplica pid=1) noise\n")
    meter.tick(2.0, 2, True)
    meter.tick(3.0, 2, True)
    assert [s for s in said if "gateway" in s] == [line]
    # the relay only says the lines: what status shows comes from the gateway's state file
    assert "gateway" not in json.loads((tmp_path / "endpoint.json").read_text())


def test_status_and_wait_show_the_gateways_healthy_replicas_and_their_last_events(tmp_path):
    # the gateway writes its state file in the run directory; status and wait read it with endpoint.json
    import json

    from envlayers import rundir
    from envlayers.cli.serving_format import replica_lines
    from envlayers.gateway_app import StateFile

    (tmp_path / "endpoint.json").write_text(json.dumps({"job_id": "7", "base_urls": ["http://n1:8000/v1"]}))
    files = rundir.JobFiles("7", None, tmp_path)
    assert "gateway" not in files.endpoint().to_dict()  # no state file yet: nothing about replicas
    state = StateFile(str(tmp_path / rundir.GATEWAY_STATE))
    state.update(healthy=2, replicas=2, min_replicas=1, grace_s=600)
    state.event("ENVLAYERS-ERROR: gateway: replica 1 on n2: its vllm serve (pid 9) was killed by SIGKILL (exit "
                "code 137); Ray Serve replaces the replica")
    state.update(healthy=1, serve_status="UNHEALTHY")
    data = files.endpoint()
    assert data.job_id == "7" and data.gateway.healthy == 1 and data.gateway.serve_status == "UNHEALTHY"
    assert replica_lines(data) == [
        ("replicas", "1 of 2 healthy behind the gateway (Ray Serve replaces one that dies); the job ends after 600s "
                     "below MIN_REPLICAS=1"),
        ("replica", "replica 1 on n2: its vllm serve (pid 9) was killed by SIGKILL (exit code 137); Ray Serve "
                    "replaces the replica")]
    for i in range(7):
        state.event(f"ENVLAYERS-STAGE: gateway: replica {i} on n1 replaced: its new vllm serve (pid {i}) answers")
    state.update(healthy=2, serve_status="RUNNING")
    gw = rundir.JobFiles("7", None, tmp_path).endpoint().gateway
    assert gw.healthy == 2 and len(gw.events) == 5  # the latest five
    assert gw.events[-1] == "replica 6 on n1 replaced: its new vllm serve (pid 6) answers"
    assert replica_lines(rundir.EndpointRecord()) == []  # no gateway record, no replicas: nothing to say


def test_the_gateways_state_file_is_replaced_whole_and_only_when_it_changes(tmp_path):
    from envlayers import rundir
    from envlayers.gateway_app import StateFile

    path = tmp_path / rundir.GATEWAY_STATE
    state = StateFile(str(path))
    state.update(healthy=2, replicas=2)
    first = path.stat().st_mtime_ns
    path.write_text("{}")  # a rewrite would replace this
    state.update(healthy=2, replicas=2)  # nothing changed: not written
    assert path.read_text() == "{}"
    state.update(healthy=1)
    assert rundir.read_gateway_state(tmp_path).healthy == 1 and first
    assert [p.name for p in tmp_path.iterdir()] == [rundir.GATEWAY_STATE]  # no temporary file left behind


def test_a_gateway_state_file_the_os_refuses_is_said_once_and_the_gateway_goes_on(tmp_path):
    from envlayers.gateway_app import StateFile

    said = []
    state = StateFile(str(tmp_path / "missing-dir" / "gateway-state.json"), say=said.append)
    state.update(healthy=2)
    state.update(healthy=1)
    assert len(said) == 1 and said[0].startswith("ENVLAYERS-WARN: gateway: cannot write ")
    assert state.record["healthy"] == 1


@pytest.mark.parametrize("text, healthy, events", [
    pytest.param('{"healthy": 2, "replicas": 2, "events": ["a"]}', 2, ["a"], id="whole"),
    pytest.param('{"healthy": true, "events": "junk"}', None, [], id="wrong-types-are-absent"),
    pytest.param('{"healthy": 1, "events": ["1", "2", "3", "4", "5", "6"]}', 1, ["2", "3", "4", "5", "6"],
                 id="at-most-five-events"),
])
def test_the_gateway_state_reader_takes_only_fields_of_the_right_type(tmp_path, text, healthy, events):
    from envlayers import rundir

    (tmp_path / rundir.GATEWAY_STATE).write_text(text)
    state = rundir.read_gateway_state(tmp_path)
    assert (state.healthy, state.events) == (healthy, events)


def test_no_gateway_state_file_or_a_half_written_one_reads_as_none(tmp_path):
    from envlayers import rundir

    assert rundir.read_gateway_state(tmp_path) is None
    (tmp_path / rundir.GATEWAY_STATE).write_text('{"healthy": ')
    assert rundir.read_gateway_state(tmp_path) is None


def test_the_meter_reads_the_gateway_per_replica_so_its_total_never_goes_back(tmp_path):
    from envlayers.launch.meter import Meter
    from envlayers.launch.prepare import prepare
    from launchtools import GATEWAY, ray_alloc as alloc

    def v(running, stop):  # finished = stop + 1 (one "length" request each)
        return VLLM % {"running": running, "stop": stop}

    bodies = iter([
        merge_expositions([("0", v(1, 4)), ("1", v(0, 6))]),  # 5 + 7
        merge_expositions([("0", v(0, 5)), ("1", None)]),  # replica 1 did not answer: its 7 still count
        merge_expositions([("0", v(2, 5)), ("1", v(0, 0))]),  # replica 1 replaced: a new server from 1
        merge_expositions([("0", v(0, 5)), ("1", v(0, 3))]),
    ])
    meter = Meter(prepare(GATEWAY, alloc(tmp_path)), {}, lambda line: None, fetch=lambda *a, **k: next(bodies))
    got = [meter.sample() for _ in range(4)]
    assert [(c.finished, c.in_flight) for c in got] == [(12, 1), (13, 0), (14, 2), (17, 0)]


def test_the_meter_reads_no_gateway_counters_from_a_text_without_them(tmp_path):
    from envlayers.launch.meter import Meter
    from envlayers.launch.prepare import prepare
    from launchtools import GATEWAY, ray_alloc as alloc

    meter = Meter(prepare(GATEWAY, alloc(tmp_path)), {}, lambda line: None,
                  fetch=lambda *a, **k: '# replica="0" did not answer: no metrics\n')
    assert meter.sample() is None


def test_a_request_whose_replica_server_is_gone_gets_503_with_retry_after():
    # the proxy half of a replica against a loopback port nothing listens on (its server died): the
    # client is told to retry, which the official clients do, and Serve routes the retry elsewhere
    needs_extra("aiohttp", "ray")  # Ray Serve's
    needs_extra("starlette", "ray")
    import asyncio
    import json
    import subprocess
    import sys

    from starlette.requests import Request

    from envlayers.gateway_app import Replica, free_port

    replica = object.__new__(Replica)
    replica.port, replica.session, replica.registry = free_port(), None, None
    replica.proc = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    replica.proc.wait()
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "query_string": b"",
             "headers": [(b"content-type", b"application/json")]}

    async def receive():
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def ask():
        try:
            return await replica(Request(scope, receive))
        finally:
            await replica.session.close()

    reply = asyncio.run(ask())
    assert reply.status_code == 503 and reply.headers["retry-after"] == "1"
    assert json.loads(reply.body)["error"]["code"] == 503


def test_the_meter_waits_for_a_gateway_that_answers_after_its_slow_replica_read(tmp_path):
    # a real HTTP server on 127.0.0.1 that answers /metrics after 2.5 s, as the gateway does when one replica's
    # reader takes its whole bound (gateway_app.READ_TIMEOUT_S): the meter's own read must outlast it
    import http.server
    import threading

    from envlayers import gateway_app
    from envlayers.launch import counters as meter_mod
    from envlayers.launch.prepare import prepare
    from launchtools import GATEWAY, ray_alloc as alloc

    assert meter_mod.GATEWAY_FETCH_TIMEOUT_S >= gateway_app.READ_TIMEOUT_S + 1.5
    body = merge_expositions([("0", VLLM % {"running": 0, "stop": 3}), ("1", None)]).encode()

    class Slow(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            threading.Event().wait(2.5)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        asked = []

        def fetch(url, key, **kw):
            asked.append(kw)
            return meter_mod.fetch_metrics(f"http://127.0.0.1:{server.server_port}/metrics", key, **kw)

        meter = meter_mod.RequestCounters(prepare(GATEWAY, alloc(tmp_path)), fetch=fetch)
        got = meter.sample()
        assert asked == [{"timeout_s": meter_mod.GATEWAY_FETCH_TIMEOUT_S}]
        at_once = meter_mod.RequestCounters(prepare(GATEWAY, alloc(tmp_path)),
                                            fetch=lambda *a, **k: body.decode()).sample()
        assert got is not None and got == at_once  # the same reading as a gateway that answers at once
        assert meter_mod.fetch_metrics(f"http://127.0.0.1:{server.server_port}/metrics", None) is None  # 2 s: lost
    finally:
        server.shutdown()
        server.server_close()
