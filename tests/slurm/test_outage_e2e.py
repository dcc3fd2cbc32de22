"""A controller outage on the real local Slurm lab: slurmctld stopped (``cluster/slurm-lab controller stop``,
by its PID) while a job runs, and what ``wait`` and ``status`` do about it.

The first look of ``wait`` meets the outage, rides it out and reports the endpoint live once the controller
is back; with a window shorter than the outage, ``wait`` and ``status`` end with exit 75 and a line saying
that Slurm did not answer (never exit 2, "bad input"). The controller is started again whatever happens,
so the lab is left as it was found.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading

import pytest
from labtools import lab_command

from labruns import BANNER, Job

pytestmark = pytest.mark.slurm


@contextlib.contextmanager
def controller_down(lab):
    """slurmctld stopped for the block, started again after it, even when the block fails."""
    env = {"ENVLAYERS_LAB_DIR": str(lab.lab_dir)}
    stopped = lab_command("controller", "stop", env=env, timeout_s=60)
    assert stopped.returncode == 0 and "stopped" in stopped.stdout, stopped.stdout
    try:
        yield
    finally:
        started = lab_command("controller", "start", env=env, timeout_s=90)
        assert started.returncode == 0, started.stdout
    assert lab.run(["scontrol", "ping"], check=False).stdout.count("is UP") == 1


class Lines:
    """A process's stderr read line by line on a thread; ``wait_for(text)`` blocks until a line has it."""

    def __init__(self, proc: subprocess.Popen):
        self.lines: list[str] = []
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._read, args=(proc.stderr,), daemon=True)
        self.thread.start()

    def _read(self, stream) -> None:
        for line in stream:
            with self.cond:
                self.lines.append(line)
                self.cond.notify_all()
        with self.cond:
            self.lines.append(None)  # the end
            self.cond.notify_all()

    def wait_for(self, text: str, timeout_s: float) -> str:
        with self.cond:
            found = self.cond.wait_for(lambda: any(line is None or text in line for line in self.lines), timeout_s)
            hit = next((line for line in self.lines if line is not None and text in line), None)
        assert found and hit is not None, f"no line with {text!r} in {self.lines}"
        return hit

    def text(self) -> str:
        self.thread.join(10)
        return "".join(line for line in self.lines if line is not None)


def live_job(lab, tmp_path) -> Job:
    """A stand-in endpoint job, live (its launcher needs the controller for srun, so it starts first)."""
    job = Job(lab, tmp_path)
    res = job.cli("wait", job.job_id, "--timeout", "90", "--poll", "0.5", "--progress", "none", timeout_s=120)
    assert res.returncode == 0 and res.stdout.startswith(BANNER), res.stderr
    return job


def test_wait_whose_first_look_meets_a_stopped_controller_retries_and_reports_live_once_it_is_back(netns_lab,
                                                                                                  tmp_path):
    job = live_job(netns_lab, tmp_path)
    with controller_down(netns_lab):
        proc = subprocess.Popen([sys.executable, "-m", "envlayers", "wait", job.job_id, "--progress", "plain"],
                                cwd=job.dir, env=job.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            err = Lines(proc)
            said = err.wait_for("Slurm did not answer", timeout_s=120)  # scontrol gives up after its retries
            assert "Unable to contact slurm controller" in said and "retrying" in said, said
            assert proc.poll() is None  # still waiting, not ended as bad input
        except BaseException:
            proc.kill()
            proc.wait()
            raise
    # the controller is back: the next ask answers and the job is live
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.text()
    assert out.startswith(BANNER), out
    assert err.text().count("Slurm did not answer") == 1  # said once for the outage


def test_wait_and_status_give_up_after_a_short_window_with_exit_75_not_bad_input(slurm_lab, tmp_path):
    jobid = slurm_lab.submit("sleep 300\n", "--time=5", "-p", "mi300")
    slurm_lab.wait_running(jobid)
    env = {**os.environ, **slurm_lab.env, "ENVLAYERS_SLURM_OUTAGE_S": "3"}
    with controller_down(slurm_lab):
        waited = subprocess.run([sys.executable, "-m", "envlayers", "wait", jobid, "--progress", "plain"],
                                cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
        status = subprocess.run([sys.executable, "-m", "envlayers", "status", jobid, "--slurm-outage", "2"],
                                cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    for res in (waited, status):
        assert res.returncode == 75, (res.returncode, res.stderr)
        last = res.stderr.strip().splitlines()[-1]
        assert last.startswith("env_layers: error: Slurm did not answer for "), res.stderr
        assert "Unable to contact slurm controller" in last and "scontrol ping" in last
        assert "no such job" not in res.stderr and "bad input" not in res.stderr
    # the job was never touched: it runs on once the controller is back
    assert slurm_lab.job_info(jobid)["JobState"] == "RUNNING"
