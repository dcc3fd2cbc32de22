"""ENVLAYERS-DIAG lines: Slurm's view of ranks that did not start (launch/slurmdiag.py), from the text
scontrol prints (captured from the local lab's Slurm 22.05) and through a runner that answers as
scontrol does."""

from __future__ import annotations

import subprocess

import pytest

from envlayers import slurm
from envlayers.errors import SlurmError
from envlayers.launch.slurmdiag import diag_lines, slurm_diag

NODE_N1 = ("NodeName=n1 Arch=x86_64 CoresPerSocket=8  CPUAlloc=8 CPUEfctv=8 CPUTot=8 CPULoad=0.65 "
           "AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:4 NodeAddr=10.200.0.11 NodeHostName=n1 "
           "Version=22.05.8 RealMemory=65536 AllocMem=65536 FreeMem=21118 Sockets=1 Boards=1 State=ALLOCATED "
           "ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=mi300,mi200  "
           "BootTime=2026-12-04T04:58:01 CfgTRES=cpu=8,mem=64G,billing=8 AllocTRES=cpu=8,mem=64G\n")
NODE_N2_DOWN = ("NodeName=n2 Arch=x86_64 CoresPerSocket=8  CPUAlloc=0 CPUTot=8 Gres=gpu:4 NodeAddr=10.200.0.12 "
                "NodeHostName=n2 Version=22.05.8 State=DOWN+DRAIN+NOT_RESPONDING ThreadsPerCore=1 "
                "Partitions=mi300,mi200  Reason=Not responding [slurm@2026-12-04T05:30:00]\n")
STEPS = ("StepId=1000.batch UserId=0 StartTime=2026-12-04T05:28:15 TimeLimit=UNLIMITED State=RUNNING "
         "Partition=mi300 NodeList=n1 Nodes=1 CPUs=0 Tasks=1 Name=batch Network=(null) TRES=(null)\n"
         "StepId=1000.0 UserId=0 StartTime=2026-12-04T05:28:15 TimeLimit=UNLIMITED State=RUNNING Partition=mi300 "
         "NodeList=n[1-2] Nodes=2 CPUs=16 Tasks=2 Name=bash Network=(null) TRES=cpu=8,mem=64G,node=1 "
         "SrunHost:Pid=n1:10704 TresPerStep=cpu:8 TresPerNode=gres:gpu:4\n")


def test_node_states_keep_a_reason_with_spaces():
    states = slurm.parse_node_states(NODE_N1 + NODE_N2_DOWN)
    assert states["n1"] == slurm.NodeState("n1", "ALLOCATED", None)
    assert states["n2"] == slurm.NodeState("n2", "DOWN+DRAIN+NOT_RESPONDING",
                                           "Not responding [slurm@2026-12-04T05:30:00]")


def test_steps_are_read_in_slurms_order():
    steps = slurm.parse_steps(STEPS)
    assert [(s.step_id, s.state, s.nodelist, s.tasks) for s in steps] == [
        ("1000.batch", "RUNNING", "n1", 1), ("1000.0", "RUNNING", "n[1-2]", 2)]
    assert slurm.parse_steps("No job steps exist for this job\n") == []


def test_the_lines_name_the_missing_rank_its_step_and_each_node():
    lines = diag_lines("1000", [(1, "n2")], ["n1", "n2"], slurm.parse_steps(STEPS),
                       slurm.parse_node_states(NODE_N1 + NODE_N2_DOWN))
    assert lines == [
        "ENVLAYERS-DIAG: ranks missing: rank 1 (planned on n2)",
        "ENVLAYERS-DIAG: step 1000.0: RUNNING on n[1-2], 2 task(s)",
        "ENVLAYERS-DIAG: node n1: ALLOCATED",
        "ENVLAYERS-DIAG: node n2: DOWN+DRAIN+NOT_RESPONDING (reason: Not responding [slurm@2026-12-04T05:30:00])",
    ]


def test_no_server_step_is_said_as_such():
    lines = diag_lines("1000", [(1, "n2")], ["n1"], slurm.parse_steps(STEPS.splitlines()[0]), {})
    assert "ENVLAYERS-DIAG: steps of job 1000: Slurm lists no server step (none was started, or it has already ended)" in lines
    assert "ENVLAYERS-DIAG: node n1: Slurm did not show it" in lines


def scontrol_like(answers):
    """A runner that answers as scontrol does: by argv, with its exit code; anything else is refused."""
    calls = []

    def run(argv, *, input=None, timeout_s=30):
        calls.append((list(argv), timeout_s))
        out, code = answers.get(tuple(argv), ("", 1))
        return subprocess.CompletedProcess(argv, code, out, "" if code == 0 else "slurm_load_node error\n")

    return run, calls


def test_slurm_diag_asks_the_steps_and_each_node_with_a_bound():
    run, calls = scontrol_like({
        ("scontrol", "show", "step", "-o", "1000"): (STEPS, 0),
        ("scontrol", "show", "node", "-o", "n1"): (NODE_N1, 0),
        ("scontrol", "show", "node", "-o", "n2"): (NODE_N2_DOWN, 0),
    })
    lines = slurm_diag("1000", [(1, "n2")], ["n1", "n2"], run=run)
    assert lines[-1].startswith("ENVLAYERS-DIAG: node n2: DOWN+DRAIN")
    assert all(timeout_s <= 10 for _, timeout_s in calls)


def test_a_job_slurm_no_longer_knows_is_said_not_raised():
    run, _ = scontrol_like({("scontrol", "show", "node", "-o", "n1"): (NODE_N1, 0)})
    lines = slurm_diag("1000", [(0, "n1")], ["n1"], run=run)
    assert "ENVLAYERS-DIAG: steps of job 1000: scontrol show step could not list them" in lines


def test_a_controller_that_does_not_answer_is_one_line():
    def run(argv, *, input=None, timeout_s=30):
        raise SlurmError(f"`{' '.join(argv)}` did not answer within {timeout_s:g}s")

    lines = slurm_diag("1000", [(1, "n2")], ["n1", "n2"], run=run)
    assert lines == ["ENVLAYERS-DIAG: ranks missing: rank 1 (planned on n2)",
                     "ENVLAYERS-DIAG: Slurm could not be asked: `scontrol show step -o 1000` did not answer within 10s"]


@pytest.mark.parametrize("missing", [[], [(0, "n1"), (1, "n2")]])
def test_the_missing_line_lists_every_missing_rank(missing):
    lines = diag_lines("7", missing, [], [], {})
    assert (lines[0] == "ENVLAYERS-DIAG: ranks missing: rank 0 (planned on n1), rank 1 (planned on n2)") == bool(missing)
