"""The server step spans every node of the allocation, on the real local Slurm cluster.

Each rank's first line names the node Slurm started it on (SLURMD_NODENAME); the launcher compares them
with ``scontrol show hostnames $SLURM_JOB_NODELIST``. A normal pipeline job reports one rank per node and
goes live; the same job whose server step is squeezed onto one node (an ``srun`` in front of the real one
that rewrites the placement, as a site default could) ends with an ENVLAYERS-ERROR naming the idle node.
"""

from __future__ import annotations

import re
import shlex
import shutil
import time
from pathlib import Path

import pytest

from labtools import processes_mentioning
from labruns import BANNER, KEYLESS, Run

pytestmark = pytest.mark.slurm
TWO_NODES = KEYLESS + "INFERENCE_NODES=2\nPIPELINE_PARALLEL_SIZE=2\n"  # keyless, acknowledged (lab_ack)


def test_each_rank_reports_its_own_node_and_the_job_goes_live(netns_lab, tmp_path):
    run = Run(netns_lab, tmp_path, model="glm53", layer=TWO_NODES)
    run.submit()
    text = run.wait_for("^" + re.escape(BANNER), timeout_s=60)
    nodes = netns_lab.run(["scontrol", "show", "hostnames", netns_lab.job_info(run.job_id)["NodeList"]]).stdout.split()
    assert len(nodes) == 2
    for rank, node in enumerate(nodes):
        assert f"ENVLAYERS-STAGE: rank {rank} up on {node}\n" in text
    assert "ENVLAYERS-STAGE: all 2 ranks started\n" in text and "ENVLAYERS-ERROR" not in text
    netns_lab.cancel(run.job_id)
    assert run.state() == "CANCELLED"


def test_a_server_step_on_one_node_ends_the_job_naming_the_idle_node(netns_lab, tmp_path):
    real = shutil.which("srun", path=netns_lab.env["PATH"])
    shim = tmp_path / "bin"
    shim.mkdir()
    # both ranks of the step on the allocation's first node, whatever the launcher asked for
    (shim / "srun").write_text(f'#!/bin/bash\nexec {shlex.quote(real)} --nodes=1 --ntasks=2 --cpus-per-task=1 '
                               '--kill-on-bad-exit=1 bash "${@: -1}"\n')
    (shim / "srun").chmod(0o755)
    run = Run(netns_lab, tmp_path, model="glm53", layer=TWO_NODES, STANDIN_LOAD_SECONDS="30")
    run.env["PATH"] = f"{shim}:{run.env['PATH']}"
    run.submit()
    assert run.state(timeout_s=60) == "FAILED"
    text = run.out.read_text()
    nodes = re.search(r"started on \S+ with nodes (\S+)", text).group(1)
    first, second = netns_lab.run(["scontrol", "show", "hostnames", nodes]).stdout.split()
    assert (f"ENVLAYERS-ERROR: the server step does not span the allocation: no rank runs on {second} (the ranks "
            f"report: rank 0 on {first}, rank 1 on {first})") in text
    assert BANNER not in text
    # nothing of the job is left: the launcher may stop the ranks before their engines even start
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        alive = [p for p in run.engine_pids() if Path(f"/proc/{p}").exists()]
        alive += processes_mentioning(str(run.run_dir))
        if not alive:
            break
        time.sleep(0.2)
    assert not alive, alive


def test_an_extra_nodes_on_the_sbatch_line_ends_the_job_before_srun(netns_lab, tmp_path):
    # the dry run's own sbatch line, with a --nodes appended: Slurm honours the last one
    run = Run(netns_lab, tmp_path, model="glm53", layer=TWO_NODES)
    dry = run.sbatch(submit=False).stdout
    line = next(x for x in dry.splitlines() if x.startswith("sbatch --parsable "))
    argv = shlex.split(line.split(" <<'ENVLAYERS_JOB'")[0])
    assert "--nodes=2" in argv
    script = dry.split("<<'ENVLAYERS_JOB'\n", 1)[1].split("\nENVLAYERS_JOB\n", 1)[0] + "\n"
    job_id = netns_lab.submit(script, *argv[2:], "--nodes=3", cwd=tmp_path, env=run.env)
    run.job_id = job_id
    assert netns_lab.wait_job(job_id, timeout_s=60) == "FAILED"
    text = run.out.read_text()
    assert ("ENVLAYERS-ERROR: allocation has 3 node(s), expected 2: an extra --nodes on the sbatch line? Slurm "
            "honours the last one") in text
    assert "up on" not in text  # nothing was started
