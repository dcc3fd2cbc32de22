"""The knowledge base's rules for the launcher's own lines fire on the lines the launcher prints now.

data/known-issues.yaml matches the launcher's messages with patterns of its own; the texts are written in
launch/ (supervise.py, prepare.py, launcher.py, replicas.py, raynode.py), rundir.py's record writer, fabric.py
and joblines.py (the job script's line). Each case makes its line through the code that says it in a job (the
supervision loop on the fake clock, ``prepare`` on a fake allocation, the launcher's own helpers), takes it as
the job output shows it (a failure as ``ENVLAYERS-ERROR: <message>``) and runs the rules on it: a reworded
message whose rule no longer fires fails here, not in an operator's diagnosis.
"""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest

from envlayers import rundir
from envlayers.diagnose import LogText, diagnose, load_rules
from envlayers.joblines import ERROR, RUN_DIR_UNWRITABLE
from envlayers.launch import launcher, raynode
from envlayers.launch.prepare import LaunchFailure, Node, prepare
from clocktools import Clock
from launchtools import N1, N2, PIPELINE, Step, Stop, alloc, exited, grow, replicas_loop, started, stop, supervisor

# vLLM's API server, the moment its engine core is gone (vllm/v1/engine/core_client.py)
CORE_DIED = ("(APIServer pid=4242) WARNING 12-04 10:00:00 [core_client.py:818] [shutdown] MPClient: engine core "
             "exited unexpectedly; starting cleanup")
FABRIC = {"hsn0": "1.2.3.4"}


@pytest.fixture(scope="module")
def rules():
    return load_rules()


def failure(run) -> list[str]:
    """The line the launcher prints for the failure ``run()`` raises (launcher.main: ``ERROR.line(str(err))``)."""
    with pytest.raises(LaunchFailure) as err:
        run()
    return [ERROR.line(str(err.value))]


def loop_failure(sup) -> list[str]:
    return failure(sup.run)


# --- each launcher message, made by its code ------------------------------------------------------------

def ranks_not_placed(tmp_path, capsys, monkeypatch):
    sup = supervisor(tmp_path, Clock(), Step(), rank_start=3)
    started(tmp_path, 0)
    return loop_failure(sup)


def step_exited_early(tmp_path, capsys, monkeypatch):
    clock, step = Clock(), Step()
    sup = supervisor(tmp_path, clock, step)
    started(tmp_path, 0)
    clock.at(2, lambda: setattr(step, "code", 125))
    return loop_failure(sup)


def allocation_node_mismatch(tmp_path, capsys, monkeypatch):
    return failure(lambda: prepare(PIPELINE, alloc(tmp_path, nodes=(N1, N2, Node("n3", "10.0.0.3", True)),
                                                   ifaces=FABRIC)))


def step_not_spanning(tmp_path, capsys, monkeypatch):
    sup = supervisor(tmp_path, Clock(), Step())
    for rank in (0, 1):  # srun put both ranks on n1
        (tmp_path / f"server-{rank}.log").write_text(f"ENVLAYERS-STAGE: rank {rank} up on n1\n")
    return loop_failure(sup)


def no_fabric_address(tmp_path, capsys, monkeypatch):
    return failure(lambda: prepare({**PIPELINE, "ENVLAYERS_HSN_IFACE": "hsn"},
                                   alloc(tmp_path, ifaces={"eth0": "10.0.0.9"})))


def readiness_budget_clamped(tmp_path, capsys, monkeypatch):
    lp = prepare({**PIPELINE, "ENVLAYERS_READY_TIMEOUT_S": "7200"}, alloc(tmp_path, ifaces=FABRIC, time_left_s=3600))
    return list(lp.lines)


def readiness_budget_spent(tmp_path, capsys, monkeypatch):
    sup = supervisor(tmp_path, Clock(), Step(), budget=4, rank_start=1)
    started(tmp_path, 0), started(tmp_path, 1)
    return loop_failure(sup)


def rank_exited_before_live(tmp_path, capsys, monkeypatch):
    clock = Clock()
    sup = supervisor(tmp_path, clock, Step())
    started(tmp_path, 0), started(tmp_path, 1)
    clock.at(5, lambda: exited(tmp_path, 1, 137, 10.0))
    return loop_failure(sup)


def rank_script_exit(tmp_path, capsys, monkeypatch):
    # ranks.sh's own last line in server-<rank>.log, the engine replaced by one that fails
    lp = prepare(PIPELINE, alloc(tmp_path, ifaces=FABRIC))
    script = tmp_path / "ranks.sh"
    script.write_text(lp.files["ranks.sh"].replace('"$@" &', "(exit 3) &"))
    subprocess.run(["bash", str(script)], env={"SLURM_PROCID": "1", "SLURMD_NODENAME": "n2", "PATH": "/usr/bin:/bin"},
                   capture_output=True, timeout=10, check=False)
    return (tmp_path / "server-1.log").read_text().splitlines()


def replica_exited_after_live(tmp_path, capsys, monkeypatch):
    clock = Clock()
    sup, _steps, _released, said = replicas_loop(tmp_path, clock)
    clock.at(10, lambda: exited(tmp_path, 2, 137, 10.0))
    clock.at(20, stop)
    with pytest.raises(Stop):
        sup.run()
    return said


def engine_core_lost(tmp_path, capsys, monkeypatch):
    clock = Clock()
    sup = supervisor(tmp_path, clock, Step(), probe_ok=lambda url: True, INFERENCE_ENGINE="vllm")
    started(tmp_path, 0), started(tmp_path, 1)
    clock.at(10, lambda: grow(tmp_path, 1, CORE_DIED))
    return loop_failure(sup)


def replica_engine_core_lost(tmp_path, capsys, monkeypatch):
    clock = Clock()
    sup, _steps, _released, said = replicas_loop(tmp_path, clock)
    clock.at(10, lambda: grow(tmp_path, 2, CORE_DIED))
    clock.at(20, stop)
    with pytest.raises(Stop):
        sup.run()
    return said


def ray_nodes_missing(tmp_path, capsys, monkeypatch):
    # node 0's helper (launch/raynode.py) waits for the Ray cluster; here a head that reports one live node of two
    fake_ray = SimpleNamespace(init=lambda **kw: None, nodes=lambda: [{"Alive": True}, {"Alive": False}],
                               shutdown=lambda: None)
    monkeypatch.setitem(sys.modules, "ray", fake_ray)
    clock = Clock()
    monkeypatch.setattr(raynode, "time", SimpleNamespace(monotonic=clock, sleep=clock.sleep))
    assert raynode.count_nodes("10.0.0.1:29500", 2, 300) == 3
    return capsys.readouterr().out.splitlines()


def run_dir_unwritable_before_srun(tmp_path, capsys, monkeypatch):
    err = OSError(28, "No space left on device")
    return [ERROR.line(str(launcher.Launcher(tmp_path, {}).unwritable(err, "ranks.sh")))]


def run_dir_unwritable_in_the_job_script(tmp_path, capsys, monkeypatch):
    # the job script prints this declared line (tests/test_joblines.py runs it in bash)
    return [RUN_DIR_UNWRITABLE.line(path=tmp_path, error="Read-only file system", doing="making the run folder")]


def record_unwritable_while_live(tmp_path, capsys, monkeypatch):
    said: list[str] = []
    (tmp_path / "accounting.json").mkdir()  # a write the OS refuses, whoever runs the test
    assert not rundir.RecordWriter(said.append).write_json(tmp_path / "accounting.json", {"x": 1})
    return said


def end_unrecorded(tmp_path, capsys, monkeypatch):
    (tmp_path / rundir.LAUNCH_END).mkdir()
    launcher.write_end(tmp_path, 0, 143, "live then signal 15")
    return capsys.readouterr().out.splitlines()


def core_guard_lines(tmp_path, capsys, monkeypatch):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "core-limit.txt").write_text("rank=0 limit=0\nrank=1 limit=unlimited\n")
    (run_dir / "core.4242").write_bytes(b"\0" * 64)
    assert not launcher.core_guard(run_dir, run_dir)
    return capsys.readouterr().out.splitlines()


# (how the line is made, the rule meant for it, a piece of the line the rule must fire on)
CASES = [
    pytest.param(ranks_not_placed, "ranks-not-placed", "only 1 of 2 ranks started within 3s", id="ranks-not-placed"),
    pytest.param(step_exited_early, "step-exited-early", "srun step exited with code 125 before all ranks started",
                 id="step-exited-early"),
    pytest.param(allocation_node_mismatch, "allocation-node-mismatch", "allocation has 3 node(s), expected 2",
                 id="allocation-node-mismatch"),
    pytest.param(step_not_spanning, "step-not-spanning", "no rank runs on n2", id="step-not-spanning"),
    pytest.param(no_fabric_address, "no-fabric-address", "no routable fabric", id="no-fabric-address"),
    pytest.param(readiness_budget_clamped, "readiness-budget-clamped", "readiness budget 7200s exceeds",
                 id="readiness-budget-clamped"),
    pytest.param(readiness_budget_spent, "readiness-budget-spent", "endpoint not live after 4s",
                 id="readiness-budget-spent"),
    pytest.param(ray_nodes_missing, "ray-nodes-missing", "ray: 1 of 2 node(s) joined the Ray cluster",
                 id="ray-nodes-missing"),
    pytest.param(rank_exited_before_live, "rank-exited", "rank 1 on n2 exited with code 137 before",
                 id="rank-exited"),
    pytest.param(rank_script_exit, "rank-exited", "ENVLAYERS-STAGE: rank 1 exited with code 3", id="rank-script-exit"),
    pytest.param(replica_exited_after_live, "rank-exited", "replica rank 2 on n3 exited with code 137 after",
                 id="replica-exited"),
    pytest.param(engine_core_lost, "engine-core-lost", "rank 1 on n2 lost its engine core after",
                 id="engine-core-lost"),
    pytest.param(replica_engine_core_lost, "engine-core-lost", "replica rank 2 on n3 lost its engine core",
                 id="replica-engine-core-lost"),
    pytest.param(run_dir_unwritable_before_srun, "run-dir-unwritable", "cannot write the run directory",
                 id="run-dir-unwritable-launcher"),
    pytest.param(run_dir_unwritable_in_the_job_script, "run-dir-unwritable", "cannot write the run directory",
                 id="run-dir-unwritable-job-script"),
    pytest.param(record_unwritable_while_live, "run-dir-unwritable", "accounting.json", id="record-unwritable"),
    pytest.param(end_unrecorded, "run-dir-unwritable", "could not record it in", id="end-unrecorded"),
    pytest.param(core_guard_lines, "core-dump-left", "core file left: ", id="core-file-left"),
    pytest.param(core_guard_lines, "core-dump-left", "rank 1 ran with core limit unlimited, not 0",
                 id="core-limit-not-0"),
]


@pytest.mark.parametrize("make, rule_id, said", CASES)
def test_the_rule_for_a_launcher_message_fires_on_its_line(rules, tmp_path, capsys, monkeypatch, make, rule_id,
                                                           said):
    lines = make(tmp_path, capsys, monkeypatch)
    line = next((ln for ln in lines if said in ln), None)
    assert line is not None, f"the launcher no longer says {said!r}: {lines}"
    found = [f for f in diagnose([LogText("serve-only-42.out", [line])], rules) if f.rule_id == rule_id]
    assert found, f"rule {rule_id} does not fire on the launcher's line {line!r}"
    assert found[0].evidence[0].text.strip() == line.strip()


def test_every_rule_that_reads_a_launcher_line_is_held_to_the_launcher_here(rules):
    reads_ours = {r.id for r in rules if any("ENVLAYERS-" in p.regex.pattern for p in r.signature)}
    assert "ranks-not-placed" in reads_ours  # the scan sees the rules
    assert reads_ours == {p.values[1] for p in CASES}
