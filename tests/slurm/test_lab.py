"""The local Slurm lab itself: the properties the launcher's end-to-end tests rely on."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

import labtools

pytestmark = pytest.mark.slurm

NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_get(url: str, timeout_s: float = 2.0) -> str:
    with NO_PROXY.open(url, timeout=timeout_s) as resp:
        return resp.read().decode()


def test_three_node_step_runs_on_distinct_hosts_and_addresses(netns_lab):
    lab = netns_lab
    jobid = lab.submit(
        'srun --label bash -c \'echo "HOST $(hostname) $(hostname -I)"\'\n',
        "--nodes=3",
        "--ntasks-per-node=1",
        "--time=2",
    )
    assert lab.wait_job(jobid, timeout_s=60) == "COMPLETED", lab.job_output(jobid)
    rows = [line.split()[2:] for line in lab.job_output(jobid).splitlines() if " HOST " in line]
    hosts = sorted(r[0] for r in rows)
    addrs = sorted(r[1] for r in rows)
    assert hosts == ["n1", "n2", "n3"]
    assert len(set(addrs)) == 3
    assert addrs == sorted(lab.nodes[h] for h in hosts)
    assert all(not a.startswith("127.") for a in addrs)


def test_two_nodes_bind_the_same_port_and_both_answer_on_their_addresses(netns_lab, tmp_path):
    lab = netns_lab
    port = 18000 + os.getpid() % 1000
    serve = tmp_path / "serve"
    jobid = lab.submit(
        f"""
srun bash -c 'd={serve}/$(hostname); mkdir -p $d; hostname > $d/who
exec {sys.executable} -m http.server {port} --bind 0.0.0.0 --directory $d'
""",
        "--nodes=2",
        "--ntasks-per-node=1",
        "--time=2",
    )
    info = lab.wait_running(jobid)
    nodes = sorted(lab.run(["scontrol", "show", "hostnames", info["NodeList"]]).stdout.split())
    assert len(nodes) == 2
    answers: dict[str, str] = {}
    deadline = time.monotonic() + 20
    while len(answers) < 2 and time.monotonic() < deadline:
        for node in nodes:
            if node not in answers:
                try:
                    answers[node] = http_get(f"http://{lab.nodes[node]}:{port}/who").strip()
                except OSError:
                    pass
        time.sleep(0.1)
    lab.cancel(jobid)
    assert answers == {n: n for n in nodes}, lab.job_output(jobid)
    assert lab.wait_job(jobid, timeout_s=60) == "CANCELLED"


@pytest.mark.parametrize("partition", ["mi300", "mi200"])
def test_gpus_per_node_gives_cuda_visible_devices(slurm_lab, partition):
    lab = slurm_lab
    jobid = lab.submit(
        'echo "GPUS cvd=$CUDA_VISIBLE_DEVICES on_node=$SLURM_GPUS_ON_NODE cpus=$SLURM_CPUS_ON_NODE"\n'
        'srun --cpus-per-task=$SLURM_CPUS_ON_NODE bash -c \'echo "STEP cvd=$CUDA_VISIBLE_DEVICES"\'\n',
        f"--partition={partition}",
        "--nodes=1",
        "--mem=0",
        "--gpus-per-node=4",
        "--ntasks-per-node=1",
        "--exclusive",
        "--time=2",
    )
    assert lab.wait_job(jobid, timeout_s=60) == "COMPLETED", lab.job_output(jobid)
    out = lab.job_output(jobid)
    assert "GPUS cvd=0,1,2,3 on_node=4 cpus=8" in out
    assert "STEP cvd=0,1,2,3" in out
    # finished jobs stay visible: scontrol for MinJobAge, sacct -c from the completion log
    assert lab.job_info(jobid)["JobState"] == "COMPLETED"
    assert "COMPLETED" in lab.run(["sacct", "-c", "-j", jobid]).stdout


def test_scancel_leaves_no_process_of_the_job_on_any_node(slurm_lab, tmp_path):
    lab = slurm_lab
    marker = f"labtest-{uuid.uuid4().hex[:8]}"
    pids = tmp_path / "pids"
    pids.mkdir()
    # The batch shell, a step on 2 nodes with a child each, and on one node a child that ignores
    # SIGTERM (as a stuck engine might): KillWait's SIGKILL must get it too.
    jobid = lab.submit(
        f"""
echo $$ > {pids}/batch
sleep 300 &
echo $! > {pids}/batch-child
srun bash -c '
  echo $$ > {pids}/step-$SLURM_NODEID
  if [ "$SLURM_NODEID" = 0 ]; then (trap "" TERM; exec sleep 301) & else sleep 302 & fi
  echo $! > {pids}/child-$SLURM_NODEID
  wait' {marker}
""",
        "--nodes=2",
        "--ntasks-per-node=1",
        "--time=5",
    )
    lab.wait_running(jobid)
    expected = {"batch", "batch-child", "step-0", "step-1", "child-0", "child-1"}
    deadline = time.monotonic() + 20
    while {p.name for p in pids.iterdir() if p.read_text().strip()} != expected:
        assert time.monotonic() < deadline, f"job did not record its PIDs: {lab.job_output(jobid)}"
        time.sleep(0.05)
    recorded = {p.name: int(p.read_text()) for p in pids.iterdir()}
    assert all(labtools.pid_alive(pid) for pid in recorded.values()), recorded

    lab.cancel(jobid)
    assert lab.wait_job(jobid, timeout_s=60) == "CANCELLED"
    deadline = time.monotonic() + 2  # reaping by the parent may lag the state by a moment
    while (alive := {n: p for n, p in recorded.items() if labtools.pid_alive(p)}) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive, f"processes of cancelled job {jobid} still running: {alive}"


def test_down_then_up_works_on_a_private_lab(tmp_path):
    """A second, 1-node lab of its own (own dir, prefix, subnet), so the shared one is not disturbed."""
    if os.geteuid() != 0:
        labtools.unavailable("the local Slurm lab needs root")
    env = {
        "ENVLAYERS_LAB_DIR": str(tmp_path / "lab"),
        "ENVLAYERS_LAB_PREFIX": f"t{os.getpid() % 100000}",
        "ENVLAYERS_LAB_SUBNET": labtools.free_subnet(),
    }
    prefix = env["ENVLAYERS_LAB_PREFIX"]
    try:
        up = labtools.lab_command("up", "1", env=env)
        assert up.returncode == 0, up.stdout
        assert "up in " in up.stdout
        again = labtools.lab_command("up", "1", env=env)
        assert again.returncode == 0 and "already up" in again.stdout, again.stdout
        pids_before = _daemon_pids(tmp_path / "lab")
        assert len(pids_before) == 3  # munged, slurmctld, slurmd n1

        down = labtools.lab_command("down", env=env)
        assert down.returncode == 0, down.stdout
        assert not any(labtools.pid_alive(p) for p in pids_before)
        assert f"{prefix}-n1" not in _run(["ip", "netns", "list"])
        assert f"{prefix}br0" not in _run(["ip", "link", "show"])
        assert labtools.lab_command("status", env=env).returncode == 3

        up2 = labtools.lab_command("up", "1", env=env)
        assert up2.returncode == 0, up2.stdout
        status = labtools.parse_status(labtools.lab_command("status", env=env).stdout)
        assert status["state"] == "up" and status["node_states"] == {"n1": "idle"}
        lab = labtools.lab_from_status(tmp_path / "lab", started_here=True)
        jobid = lab.submit("hostname\n", "--time=1")
        assert lab.wait_job(jobid, timeout_s=60) == "COMPLETED"
        assert lab.job_output(jobid).strip() == "n1"
    finally:
        labtools.lab_command("down", env=env)


def _daemon_pids(lab_dir: Path) -> list[int]:
    files = [lab_dir / "munge" / "munged.pid", lab_dir / "run" / "slurmctld.pid", *sorted((lab_dir / "run").glob("slurmd-*.pid"))]
    return [int(f.read_text()) for f in files if f.exists()]


def _run(argv) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=False).stdout

