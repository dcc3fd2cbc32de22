"""A run directory the job cannot write (a full or read-only file system), on real jobs of the local Slurm lab
with the stand-in engine: before any rank starts, the job ends with one ENVLAYERS-ERROR line that names the
path, what the OS said and what to do, and leaves no half-written file; after live, the endpoint keeps
serving and ``status`` tells a launcher that could not write its records from one that died.

SCRATCH is a tiny tmpfs filled to the brim, or a read-only bind mount, made in the mount namespace of the
node the job runs on (the lab's nodes have their own, private ones) and always unmounted at teardown. The
operator commands run in that namespace too, as on a cluster where the login node sees the same file system.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from labruns import Job

pytestmark = pytest.mark.slurm


def node_pid(lab, node: str = "n1") -> int:
    """The PID of the lab's slurmd for ``node``: jobs on that node run in its mount namespace."""
    want = ["slurmd", "-D", "-N", node, "-f", str(lab.conf)]
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")[:-1]
        except OSError:
            continue
        if [a.decode(errors="replace") for a in argv] == want:
            return int(proc.name)
    raise RuntimeError(f"no slurmd of node {node} with {lab.conf}")


class NodeMounts:
    """Mounts in node n1's mount namespace (this one's when it is the same), undone in reverse order."""

    def __init__(self, lab):
        pid = node_pid(lab)
        same = os.readlink(f"/proc/{pid}/ns/mnt") == os.readlink("/proc/self/ns/mnt")
        self.prefix = [] if same else ["nsenter", "-t", str(pid), "-m", "--"]
        self.mounted: list[Path] = []

    def run(self, *argv: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
        proc = subprocess.run([*self.prefix, *argv], capture_output=True, text=True, timeout=60, **kw)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{argv} exited {proc.returncode}: {proc.stderr}")
        return proc

    def full_tmpfs(self, where: Path, size: str = "64k") -> None:
        """A tmpfs of ``size`` at ``where``, filled until the OS says it has no space left."""
        where.mkdir(parents=True, exist_ok=True)
        self.run("mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where))
        self.mounted.append(where)
        self.fill(where)

    def fill(self, where: Path) -> None:
        fill = self.run("dd", "if=/dev/zero", f"of={where}/fill", "bs=4096", check=False)
        assert "No space left on device" in fill.stderr, fill.stderr
        free = self.run("stat", "-f", "-c", "%a", str(where)).stdout.strip()
        assert free == "0", free

    def tmpfs(self, where: Path, size: str) -> None:
        where.mkdir(parents=True, exist_ok=True)
        self.run("mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where))
        self.mounted.append(where)

    def read_only(self, where: Path) -> None:
        """``where`` bind-mounted onto itself, read-only (root ignores mode bits, not a read-only mount)."""
        where.mkdir(parents=True, exist_ok=True)
        self.run("mount", "--bind", str(where), str(where))
        self.mounted.append(where)
        self.run("mount", "-o", "remount,ro,bind", str(where))

    def cli(self, job: Job, *args: str) -> subprocess.CompletedProcess:
        wd = [*self.prefix[:-1], f"--wd={job.dir}", "--"] if self.prefix else []  # setns would move it to /
        return subprocess.run([*wd, sys.executable, "-m", "envlayers", *args], cwd=job.dir, env=job.env,
                              capture_output=True, text=True, timeout=120)

    def undo(self) -> None:
        for where in reversed(self.mounted):
            self.run("umount", "-l", str(where), check=False)
        self.mounted.clear()


@pytest.fixture
def mounts(netns_lab):
    m = NodeMounts(netns_lab)
    try:
        yield m
    finally:
        m.undo()


def job_output(job: Job, lab) -> str:
    return (job.dir / f"serve-only-{job.job_id}.out").read_text(errors="replace")


def ended(lab, job: Job, timeout_s: float = 60) -> str:
    return lab.wait_job(job.job_id, timeout_s=timeout_s)


@pytest.mark.parametrize("how, said", [
    pytest.param("full", "No space left on device", id="full"),
    pytest.param("read-only", "Read-only file system", id="read-only"),
])
def test_a_run_directory_that_cannot_be_written_ends_the_job_before_srun_naming_it(netns_lab, mounts, tmp_path,
                                                                                     how, said):
    scratch = tmp_path / "scratch"
    if how == "full":
        mounts.full_tmpfs(scratch)
    else:
        mounts.read_only(scratch)
    job = Job(netns_lab, tmp_path)
    assert ended(netns_lab, job) == "FAILED"
    text = job_output(job, netns_lab)
    assert f"ENVLAYERS-STAGE: job {job.job_id} started on n1 " in text, text  # the node with the mount
    errors = [line for line in text.splitlines() if line.startswith("ENVLAYERS-ERROR:")]
    assert len(errors) == 1, text
    run_dir = scratch / "inference-server" / job.job_id
    assert errors[0].startswith(f"ENVLAYERS-ERROR: cannot write the run directory {run_dir}: "), text
    assert said in errors[0] and "point SCRATCH" in errors[0], errors[0]
    assert "srun" not in text and "starting" not in text, text
    # nothing half-written: no empty serve.env, no temp file
    left = mounts.run("find", str(scratch), "-mindepth", "1", "!", "-name", "fill").stdout.split()
    assert [p for p in left if Path(p).name != job.job_id and Path(p) != run_dir.parent] == [], left
    status = mounts.cli(job, "status", job.job_id, "--no-probe")
    assert status.returncode == 0, status.stderr
    assert f"error:       cannot write the run directory {run_dir}: {said}" in status.stdout, status.stdout
    assert "not created yet" not in status.stdout, status.stdout


def test_a_run_directory_that_fills_up_after_live_keeps_serving_and_status_says_the_records_were_lost(
        netns_lab, mounts, tmp_path):
    scratch = tmp_path / "scratch"
    mounts.tmpfs(scratch, "16m")
    job = Job(netns_lab, tmp_path)
    res = mounts.cli(job, "wait", job.job_id, "--timeout", "90", "--poll", "0.5")
    assert res.returncode == 0, res.stderr
    mounts.fill(scratch)
    probe = mounts.cli(job, "status", job.job_id)
    assert "answers" in probe.stdout, probe.stdout  # the endpoint keeps serving on a full disk
    res = mounts.cli(job, "stop", job.job_id)
    assert res.returncode == 0, res.stdout + res.stderr
    ended(netns_lab, job)
    text = job_output(job, netns_lab)
    assert "ENVLAYERS-ERROR: the launcher ended with code 143 but could not record it in " in text, text
    record = json.loads(mounts.cli(job, "status", job.job_id, "--json", "--no-probe").stdout)
    end = record["launcher_end"]
    assert end["launcher"] == "unrecorded" and end["code"] == 143, end
    assert "No space left on device" in end["write_error"], end
    acct = record["accounting"]  # the meter's last record before the disk filled, counted to Slurm's end
    assert acct["end_from"] == "slurm" and acct["split"]["running"] is False, acct
    status = mounts.cli(job, "status", job.job_id, "--no-probe").stdout
    assert "died without reporting" not in status, status
    assert ("launcher:    the launcher ended (code 143: live then signal 15) but could not write its records: "
            "No space left on device") in status, status
    assert "(the launcher's final record is missing: counted up to Slurm's end time)" in status, status
