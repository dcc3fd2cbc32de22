"""tunnel.json byte for byte as each flow writes it: open (and ``tunnel --json``), the chain follower's
start, an opening takeover and one that did not come up, settled at the job's end, released (route
reminded, then closed), handed over to a successor, and closed at the chain's end.

``srun`` is a stand-in on PATH that says what the tunnel step says once the forward is up (or fails like
ssh); Slurm's other clients answer "no such job". Times are masked; PIDs and the seconds a handover
kept the port closed are taken from the file, so every other byte (keys, order, values) is pinned.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from envlayers import ops, rundir
from envlayers.access import handover, release as release_mod
from envlayers.access.gateway import Gateway, PortCheck
from envlayers.access.job import JobAccess
from envlayers.job import Job
from envlayers.access.tunnel import TunnelFailed, TunnelSpec, open_tunnel
from envlayers.slurm import parse_scontrol_job
from slurmtools import NO_SUCH_JOB, slurm_bin

HOST = socket.gethostname()
GATEWAY = {"destination": "me@gw", "ssh_port": None, "identity": None, "options": []}
ROUTE = {"base_url": "http://127.0.0.1:8001/v1", "provider_model_id": "tiny"}
_TIME_RE = re.compile(r'"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00"')
# the step's words once its forward is up (the node line, then ssh's confirmation); a takeover's too
FAKE_SRUN = """#!/bin/sh
job=; for a; do case $a in --jobid=*) job=${a#--jobid=} ;; esac; done
case "$*" in *" -O cancel "*) exit 0 ;; esac
if [ -n "$FAKE_SRUN_FAIL" ]; then echo "ssh: connect to host gw port 22: Connection refused"; exit 255; fi
echo "ENVLAYERS-TUNNEL: connected; taking over"
echo "ENVLAYERS-TUNNEL: node=n1 step=$job.3 pid=4242"
echo "debug1: remote forward success for: listen 127.0.0.1:8001, connect 127.0.0.1:8000"
exec sleep 60
"""


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", slurm_bin(tmp_path / "slurm-bin", {"srun": FAKE_SRUN, **NO_SUCH_JOB})["PATH"])
    monkeypatch.delenv("FAKE_SRUN_FAIL", raising=False)
    pids: list[int] = []
    yield pids
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, TypeError):
            pass


def _info(job: str, state: str, extra: str = ""):
    return parse_scontrol_job(f"JobId={job} JobName=serve-only JobState={state} Reason=None {extra}".strip())


def _access(run: Path, job: str, info) -> JobAccess:
    if not (run / rundir.ENDPOINT).exists():
        rundir.write_json(run / rundir.ENDPOINT, {"served_model_name": "tiny"})
    return JobAccess(Job(job, info, rundir.JobFiles(job, None, run)))


def _text(run: Path) -> str:
    return _TIME_RE.sub('"<time>"', (run / rundir.TUNNEL).read_text())


def _file(run: Path) -> dict:
    return json.loads((run / rundir.TUNNEL).read_text())


def _opened(run: Path, spec: TunnelSpec, pid: int, state: str = "open", **later) -> dict:
    argv = spec.srun_argv()
    return {"job_id": spec.job_id, "state": state, "node": spec.node, "local_port": spec.local_port,
            "gateway": GATEWAY, "remote_bind": "127.0.0.1", "remote_port": 8001, "route": ROUTE,
            "keep_alive": spec.keep_alive, "restarts": spec.restarts if spec.keep_alive else 0, "host": HOST,
            "srun_pid": pid, "srun_argv": argv, "command": shlex.join(argv), "ssh_command": shlex.join(spec.ssh_argv()),
            "step_id": f"{spec.job_id}.3", "node_pid": 4242, "log": str(run / "tunnel.log"), "opened_at": "<time>",
            "control": spec.control or spec.takeover, **later}


def _open(tmp_path: Path, fake_slurm: list[int], job: str = "77", **kw):
    run = tmp_path / "runs" / job
    run.mkdir(parents=True)
    spec = TunnelSpec(job, "n1", 8000, Gateway("me@gw"), "127.0.0.1", 8001, **kw)
    result = open_tunnel(_access(run, job, _info(job, "RUNNING")), spec, start_timeout_s=30, check_gateway=False,
                         replica=0)
    fake_slurm.append(_file(run)["srun_pid"])
    return run, spec, result


def test_an_opened_tunnel_and_its_json_output(tmp_path, fake_slurm, monkeypatch):
    run, spec, result = _open(tmp_path, fake_slurm)
    want = _opened(run, spec, _file(run)["srun_pid"], replica=0)
    assert _text(run) == rundir.json_text(want)
    assert _TIME_RE.sub('"<time>"', json.dumps(result.to_dict(), indent=2)) == json.dumps(
        {**want, "gateway_check": None}, indent=2)
    # the chain follower: its record added, and in what `tunnel --json` prints
    with monkeypatch.context() as m:
        m.setattr(handover.subprocess, "Popen", lambda *a, **k: SimpleNamespace(pid=999))
        handover.start_follower(_access(run, "77", _info("77", "RUNNING")), result.record)
    follower = {"pid": 999, "argv": [sys.executable, "-m", "envlayers.access.handover", str(run)], "host": HOST}
    assert _text(run) == rundir.json_text({**want, "follower": follower})
    assert _TIME_RE.sub('"<time>"', json.dumps(result.to_dict(), indent=2)) == json.dumps(
        {**want, "follower": follower, "gateway_check": None}, indent=2)


def test_a_tunnel_settled_at_its_jobs_end(tmp_path, fake_slurm):
    run, spec, _ = _open(tmp_path, fake_slurm)
    ended = _access(run, "77", _info("77", "CANCELLED", "EndTime=2026-12-04T05:00:00"))
    assert ended.tunnel() is not None
    assert _text(run) == rundir.json_text(_opened(
        run, spec, _file(run)["srun_pid"], "closed", replica=0, closed_at="2026-12-04T05:00:00", closed_by="job end",
        closed_why="job 77 ended (CANCELLED); its tunnel step ended with it"))


def test_an_opening_takeover_and_one_that_did_not_come_up(tmp_path, fake_slurm, monkeypatch):
    run = tmp_path / "runs" / "42"
    run.mkdir(parents=True)
    spec = TunnelSpec("42", "n1", 8000, Gateway("me@gw"), "127.0.0.1", 8001, control=True, takeover=True)
    seen = []
    result = open_tunnel(_access(run, "42", None), spec, start_timeout_s=30, check_gateway=False,
                         before_record=lambda record: seen.append(_text(run)))
    pid = _file(run)["srun_pid"]
    fake_slurm.append(pid)
    result.commit()
    assert seen == [rundir.json_text(_opened(run, spec, pid, "opening", step_id=None, node_pid=None,
                                             opened_at=None))]
    assert _text(run) == rundir.json_text(_opened(run, spec, pid))
    monkeypatch.setenv("FAKE_SRUN_FAIL", "1")
    (run / rundir.TUNNEL).unlink()
    with pytest.raises(TunnelFailed):
        open_tunnel(_access(run, "42", None), spec, start_timeout_s=30, check_gateway=False)
    assert _text(run) == rundir.json_text(_opened(
        run, spec, _file(run)["srun_pid"], "closed", step_id=None, node_pid=None, closed_at="<time>",
        closed_by="step end", closed_why="it did not come up"))


def test_a_released_tunnel(tmp_path, fake_slurm, monkeypatch):
    run, spec, _ = _open(tmp_path, fake_slurm)
    ours = subprocess.Popen(["sleep", "61"])  # a recorded srun that still runs its recorded command
    fake_slurm.append(ours.pid)
    record = {**_file(run), "srun_pid": ours.pid, "srun_argv": ["sleep", "61"]}
    (run / rundir.TUNNEL).write_text(json.dumps(record, indent=2))
    monkeypatch.setattr(ops, "stop_job", lambda *a, **k: SimpleNamespace(
        ok=True, cancelled=False, state_before="COMPLETED", probes=[]))
    monkeypatch.setattr(release_mod, "check_gateway_port", lambda *a, **k: PortCheck("free", "refused", "test"))
    result = release_mod.release(_access(run, "77", None), sleep=lambda s: None)
    assert ours.wait(10) == -15
    assert [s.status for s in result.steps] == ["reminder", "done", "already", "done"]
    assert _text(run) == _TIME_RE.sub('"<time>"', rundir.json_text(
        {**record, "route_reminded_at": "<time>", "state": "closed", "closed_at": "<time>", "closed_by": "release",
         "closed_why": f"closed by release: srun pid {ours.pid} ended"}))


def test_a_tunnel_handed_over_to_a_successor_and_closed_at_the_chains_end(tmp_path, fake_slurm):
    run, spec, result = _open(tmp_path, fake_slurm, "41", control=True)
    succ = tmp_path / "runs" / "42"
    succ.mkdir()
    (succ / "endpoint.json").write_text(json.dumps({"served_model_name": "tiny",
                                                    "base_urls": ["http://n1:8000/v1"]}))
    handover.hand_over(run, result.record, "42", succ)
    old, new = _file(run), _file(succ)
    fake_slurm.append(new["srun_pid"])
    assert _text(run) == rundir.json_text(_opened(run, spec, old["srun_pid"], "handed-over", replica=0,
                                                  successor="42", handed_over_at="<time>", closed_s=old["closed_s"]))
    succ_spec = TunnelSpec("42", "n1", 8000, Gateway("me@gw"), "127.0.0.1", 8001, False, 5, control=True,
                           takeover=True)
    assert _text(succ) == rundir.json_text(_opened(succ, succ_spec, new["srun_pid"], replica=0, took_over_from="41",
                                                   port_closed_s=new["port_closed_s"]))
    # the chain ended with job 42: the follower closes its record
    handover._record_end(succ, "job 42 ended, the last of its chain: the follower ends")
    assert _text(succ) == rundir.json_text(_opened(
        succ, succ_spec, new["srun_pid"], "closed", replica=0, took_over_from="41",
        port_closed_s=new["port_closed_s"], closed_at="<time>", closed_by="job end",
        closed_why="job 42 ended, the last of its chain; its tunnel step ended with it"))
