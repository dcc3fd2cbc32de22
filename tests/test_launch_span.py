"""The server step spans every node of the allocation: each rank's first line names its node, and the
loop ends the job when the nodes the ranks report are not the allocation's.

ranks.sh runs through real bash (the node it reports comes from SLURMD_NODENAME, else the hostname);
the loop runs on those log files with the fake clock of test_launch.
"""

from __future__ import annotations

import socket
import subprocess

import pytest

from envlayers.launch.prepare import LaunchFailure, prepare
from envlayers.launch.supervise import Supervisor
from envlayers.readiness import Probe
from clocktools import Clock
from launchtools import PIPELINE, Step, alloc


def run_ranks_sh(tmp_path, lp, rank: int, env: dict[str, str]) -> str:
    """Run the job's own ranks.sh for ``rank`` (the engine replaced by `true`); its first log line."""
    script = tmp_path / "ranks.sh"
    script.write_text(lp.files["ranks.sh"].replace('"$@" &', 'true &'))
    subprocess.run(["bash", str(script)], env={"SLURM_PROCID": str(rank), "PATH": "/usr/bin:/bin", **env},
                   capture_output=True, timeout=10, check=False)
    (tmp_path / f"rank-{rank}.exit").unlink()  # the stand-in `true` exited; the loop looks at the start only
    return (tmp_path / f"server-{rank}.log").read_text().splitlines()[0]


def loop(tmp_path, lp, said):
    return Supervisor(lp, Step(), probe=lambda url, served, key, timeout_s: Probe(url, False, None, "no answer"),
                      on_live=lambda e: None, say=said.append, clock=Clock(), sleep=lambda s: None)


def test_the_rank_line_names_slurms_node_name_else_the_hostname(tmp_path):
    lp = prepare(PIPELINE, alloc(tmp_path))
    assert run_ranks_sh(tmp_path, lp, 0, {"SLURMD_NODENAME": "n1"}) == "ENVLAYERS-STAGE: rank 0 up on n1"
    (tmp_path / "server-0.log").unlink()
    assert run_ranks_sh(tmp_path, lp, 0, {}) == f"ENVLAYERS-STAGE: rank 0 up on {socket.gethostname()}"


def test_ranks_on_every_node_pass(tmp_path):
    lp = prepare(PIPELINE, alloc(tmp_path))
    run_ranks_sh(tmp_path, lp, 0, {"SLURMD_NODENAME": "n1"})
    run_ranks_sh(tmp_path, lp, 1, {"SLURMD_NODENAME": "n2"})
    said: list[str] = []
    loop(tmp_path, lp, said).check_ranks()
    assert said == ["ENVLAYERS-STAGE: rank 0 up on n1", "ENVLAYERS-STAGE: rank 1 up on n2",
                    "ENVLAYERS-STAGE: all 2 ranks started"]


def test_a_fully_qualified_hostname_counts_as_its_node(tmp_path):
    lp = prepare(PIPELINE, alloc(tmp_path))
    run_ranks_sh(tmp_path, lp, 0, {"SLURMD_NODENAME": "n1.cluster.example"})
    run_ranks_sh(tmp_path, lp, 1, {"SLURMD_NODENAME": "n2"})
    said: list[str] = []
    loop(tmp_path, lp, said).check_ranks()
    assert said[-1] == "ENVLAYERS-STAGE: all 2 ranks started"


@pytest.mark.parametrize("reported, missing", [
    pytest.param(("n1", "n1"), "n2", id="two-ranks-on-the-first-node"),
    pytest.param(("n2", "n2"), "n1", id="two-ranks-on-the-second-node"),
    pytest.param(("n1", "n9"), "n2", id="a-node-outside-the-allocation"),
])
def test_a_node_without_a_rank_ends_the_job_naming_it(tmp_path, reported, missing):
    lp = prepare(PIPELINE, alloc(tmp_path))
    for rank, node in enumerate(reported):
        run_ranks_sh(tmp_path, lp, rank, {"SLURMD_NODENAME": node})
    said: list[str] = []
    with pytest.raises(LaunchFailure) as err:
        loop(tmp_path, lp, said).check_ranks()
    assert str(err.value) == (
        f"the server step does not span the allocation: no rank runs on {missing} (the ranks report: rank 0 on "
        f"{reported[0]}, rank 1 on {reported[1]}); srun placed more than one rank on a node: look for "
        "SLURM_*/SRUN_* variables or site defaults that override --ntasks-per-node=1")
    assert "ENVLAYERS-STAGE: all 2 ranks started" not in said


def test_the_check_waits_for_every_rank(tmp_path):
    lp = prepare(PIPELINE, alloc(tmp_path))
    run_ranks_sh(tmp_path, lp, 0, {"SLURMD_NODENAME": "n1"})
    said: list[str] = []
    loop(tmp_path, lp, said).check_ranks()  # one of two: nothing to compare yet
    assert said == ["ENVLAYERS-STAGE: rank 0 up on n1"]


def test_an_allocation_with_another_node_count_ends_the_launch_before_srun(tmp_path):
    from envlayers.launch.prepare import Node
    from launchtools import N1, N2

    with pytest.raises(LaunchFailure) as err:
        prepare(PIPELINE, alloc(tmp_path, nodes=(N1, N2, Node("n3", "10.0.0.3", True))))
    assert str(err.value) == ("allocation has 3 node(s), expected 2: an extra --nodes on the sbatch line? Slurm "
                              "honours the last one")
    with pytest.raises(LaunchFailure, match="allocation has 1 node"):
        prepare(PIPELINE, alloc(tmp_path, nodes=(N1,)))
