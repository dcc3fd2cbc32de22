"""slurm.py: parsers fed with Slurm 22.05's real output, and the argv each call runs (fake runner)."""

from __future__ import annotations

import subprocess

import pytest

from envlayers import slurm
from envlayers.errors import SlurmError
from slurmtools import FakeRunner, answering as fake_run

# Captured from the local lab (Slurm 22.05.8), trimmed of nothing.
SCONTROL_RUNNING = (
    "JobId=1000 JobName=serve-only UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901759 Nice=0 "
    "Account=(null) QOS=(null) JobState=RUNNING Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 "
    "Reboot=0 ExitCode=0:0 RunTime=00:00:05 TimeLimit=00:10:00 TimeMin=N/A SubmitTime=2026-12-02T09:51:59 "
    "EligibleTime=2026-12-02T09:51:59 AccrueTime=2026-12-02T09:51:59 StartTime=2026-12-02T09:52:00 "
    "EndTime=2026-12-02T10:02:00 Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-12-02T09:52:00 "
    "Scheduler=Main Partition=mi300 AllocNode:Sid=localhost:17749 ReqNodeList=(null) ExcNodeList=(null) "
    "NodeList=n[1-2] BatchHost=n1 NumNodes=2 NumCPUs=2 NumTasks=2 CPUs/Task=1 ReqB:S:C:T=0:0:*:* "
    "TRES=cpu=2,mem=2000M,node=2,billing=2 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 "
    "MinMemoryCPU=1000M MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 "
    "Licenses=(null) Network=(null) Command=/tmp/opscap/j.sh WorkDir=/tmp/opscap "
    "StdErr=/tmp/opscap/serve-only-1000.out StdIn=/dev/null StdOut=/tmp/opscap/serve-only-1000.out Power= \n"
)
SCONTROL_PENDING = (
    "JobId=1001 JobName=serve-only UserId=alice(1234) GroupId=alice(1234) MCS_label=N/A Priority=4294901758 Nice=0 "
    "Account=(null) QOS=(null) JobState=PENDING Reason=BeginTime Dependency=(null) Requeue=1 Restarts=0 "
    "BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:00 TimeLimit=2-03:00:00 TimeMin=N/A "
    "SubmitTime=2026-12-02T09:52:00 EligibleTime=2026-12-02T10:52:00 AccrueTime=2026-12-02T10:52:00 "
    "StartTime=2026-12-02T10:52:00 EndTime=2026-12-02T11:02:00 Deadline=N/A SuspendTime=None SecsPreSuspend=0 "
    "LastSchedEval=2026-12-02T09:52:00 Scheduler=Main Partition=mi300 AllocNode:Sid=localhost:17749 "
    "ReqNodeList=(null) ExcNodeList=(null) NodeList= NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 "
    "ReqB:S:C:T=0:0:*:* TRES=cpu=1,mem=1000M,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* "
    "MinCPUsNode=1 MinMemoryCPU=1000M MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK "
    "Contiguous=0 Licenses=(null) Network=(null) Command=/scratch/my runs/j.sh WorkDir=/scratch/my runs "
    "StdErr=/scratch/my runs/serve-only-1001.out StdIn=/dev/null StdOut=/scratch/my runs/serve-only-1001.out Power= \n"
)
SCONTROL_FAILED = SCONTROL_RUNNING.replace("JobState=RUNNING Reason=None", "JobState=FAILED Reason=NonZeroExitCode") \
    .replace("ExitCode=0:0", "ExitCode=3:0")
SCONTROL_CANCELLED = SCONTROL_RUNNING.replace("JobState=RUNNING", "JobState=CANCELLED").replace("ExitCode=0:0",
                                                                                                 "ExitCode=0:15")
# the form without -o (what a human pastes)
SCONTROL_MULTILINE = """JobId=77 JobName=serve-only
   UserId=bob(501) GroupId=bob(501) MCS_label=N/A
   JobState=RUNNING Reason=None Dependency=(null)
   RunTime=01:00:00 TimeLimit=1-00:00:00 TimeMin=N/A
   StartTime=2026-12-02T08:00:00 EndTime=2026-12-03T08:00:00
   NodeList=gpu[01-04] BatchHost=gpu01
   NumNodes=4 NumCPUs=256 NumTasks=4 CPUs/Task=64
   WorkDir=/users/bob
   StdOut=/users/bob/serve-only-77.out
"""

# sacct -c -j ID -X -P -n -o JobID,JobName,State,Reason,NNodes,NodeList,Timelimit,Start,End,ExitCode,User,WorkDir
SACCT_COMPLETION = "1000|serve-only|CANCELLED||2|n[1-2]|10|2026-12-02T09:52:00|2026-12-02T09:52:04|0:0|root(0)|/tmp/opscap\n"
# the same with full accounting (sacct -j ...): "CANCELLED by UID", Timelimit as a duration
SACCT_FULL = ("1000|serve-only|CANCELLED by 0|None|2|n[1-2]|00:10:00|2026-12-02T09:52:00|2026-12-02T09:52:04|0:15|"
              "alice|/scratch/alice\n")
SACCT_NEVER_RAN = "1003|serve-only|CANCELLED||0|(null)|10|2026-12-02T09:52:16|2026-12-02T09:52:16|0:0|root(0)|/tmp\n"

SQUEUE_LIST = (
    "1005|serve-only|PENDING|BeginTime|1||5:00|5:00|2026-12-02T10:53:48|2026-12-02T10:58:48|root|/work/main\n"
    "1006|serve-only|RUNNING|None|2|n[1-2]|4:00:00|3:59:12|2026-12-02T09:55:00|2026-12-02T13:55:00|alice|/scratch/a|b\n"
    "1007|serve-only|PENDING|Resources|4||UNLIMITED|UNLIMITED|N/A|N/A|alice|/scratch/a\n"
)


# ----------------------------------------------------------------------------- parse_duration

@pytest.mark.parametrize("text, seconds", [
    pytest.param("10:00", 600, id="mm-ss"),
    pytest.param("0:00", 0, id="zero"),
    pytest.param("1:02:03", 3723, id="h-mm-ss"),
    pytest.param("04:00:00", 14400, id="hh-mm-ss"),
    pytest.param("2-03:00:00", 183600, id="days"),
    pytest.param("1-02:30", 95400, id="days-hh-mm"),
    pytest.param("1-2", 93600, id="days-hours"),
    pytest.param("10", 600, id="bare-minutes-sacct-c"),
    pytest.param(" 3:59:12\n", 14352, id="whitespace"),
    pytest.param("UNLIMITED", None, id="unlimited"),
    pytest.param("NOT_SET", None, id="not-set"),
    pytest.param("INVALID", None, id="invalid"),
    pytest.param("INFINITE", None, id="infinite"),
    pytest.param("Partition_Limit", None, id="partition-limit"),
    pytest.param("", None, id="empty"),
    pytest.param(None, None, id="none"),
    pytest.param("in 3 hours", None, id="relative-format-is-not-parsed"),
])
def test_parse_duration(text, seconds):
    assert slurm.parse_duration(text) == seconds


# ----------------------------------------------------------------------------- scontrol

@pytest.mark.parametrize("text, expect", [
    pytest.param(SCONTROL_RUNNING, dict(
        job_id="1000", name="serve-only", state="RUNNING", reason=None, nodes=2, nodelist="n[1-2]",
        stdout="/tmp/opscap/serve-only-1000.out", workdir="/tmp/opscap", time_limit_s=600, time_left_s=595,
        start_time="2026-12-02T09:52:00", end_time="2026-12-02T10:02:00", exit_code="0:0", user="root"),
        id="running"),
    pytest.param(SCONTROL_PENDING, dict(
        job_id="1001", state="PENDING", reason="BeginTime", nodes=1, nodelist=None, user="alice",
        stdout="/scratch/my runs/serve-only-1001.out", workdir="/scratch/my runs", time_limit_s=183600,
        time_left_s=183600), id="pending-with-spaces-in-paths"),
    pytest.param(SCONTROL_FAILED, dict(state="FAILED", reason="NonZeroExitCode", exit_code="3:0", time_left_s=None),
                 id="failed"),
    pytest.param(SCONTROL_CANCELLED, dict(state="CANCELLED", exit_code="0:15", time_left_s=None), id="cancelled"),
    pytest.param(SCONTROL_MULTILINE, dict(
        job_id="77", state="RUNNING", nodes=4, nodelist="gpu[01-04]", user="bob", time_limit_s=86400,
        time_left_s=82800, stdout="/users/bob/serve-only-77.out"), id="multi-line-form"),
])
def test_parse_scontrol_job(text, expect):
    info = slurm.parse_scontrol_job(text)
    for key, value in expect.items():
        assert getattr(info, key) == value, key


def test_parse_scontrol_job_without_record_is_an_error():
    with pytest.raises(SlurmError, match="no job record"):
        slurm.parse_scontrol_job("slurm_load_jobs error: Invalid job id specified\n")


def test_jobinfo_exit_code_and_flags():
    info = slurm.parse_scontrol_job(SCONTROL_CANCELLED)
    assert (info.exit_code, info.finished, info.running) == ("0:15", True, False)
    info = slurm.parse_scontrol_job(SCONTROL_FAILED)
    assert (info.exit_code, info.finished) == ("3:0", True)
    assert slurm.parse_scontrol_job(SCONTROL_PENDING).pending
    assert slurm.parse_scontrol_job(SCONTROL_RUNNING).to_dict()["nodelist"] == "n[1-2]"


def test_terminal_states():
    assert slurm.TERMINAL_STATES == {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                                     "PREEMPTED", "BOOT_FAIL", "DEADLINE"}


# ----------------------------------------------------------------------------- job_info

def test_job_info_reads_scontrol_while_slurm_knows_the_job():
    run = FakeRunner({("scontrol",): (0, SCONTROL_RUNNING, "")})
    info = slurm.job_info("1000", run=run)
    assert info.state == "RUNNING"
    assert run.argvs == [["scontrol", "show", "job", "-o", "1000"]]


def test_job_info_falls_back_to_sacct_with_accounting():
    run = FakeRunner({
        ("scontrol",): (1, "", "slurm_load_jobs error: Invalid job id specified\n"),
        ("sacct", "-j"): (0, SACCT_FULL, ""),
    })
    info = slurm.job_info("1000", run=run)
    assert (info.state, info.exit_code, info.user, info.time_limit_s) == ("CANCELLED", "0:15", "alice", 600)
    assert run.argvs[1] == ["sacct", "-j", "1000", "-X", "-P", "-n", "-o",
                            "JobID,JobName,State,Reason,NNodes,NodeList,Timelimit,Start,End,ExitCode,User,WorkDir"]


def test_job_info_falls_back_to_sacct_completion_log():
    run = FakeRunner({
        ("scontrol",): (1, "", "slurm_load_jobs error: Invalid job id specified\n"),
        ("sacct", "-j"): (1, "", "Slurm accounting storage is disabled\n"),
        ("sacct", "-c"): (0, SACCT_COMPLETION, ""),
    })
    info = slurm.job_info("1000", run=run)
    assert (info.state, info.nodes, info.nodelist, info.time_limit_s, info.user, info.workdir) == (
        "CANCELLED", 2, "n[1-2]", 600, "root", "/tmp/opscap")
    assert [a[:3] for a in run.argvs] == [["scontrol", "show", "job"], ["sacct", "-j", "1000"],
                                          ["sacct", "-c", "-j"]]


def test_job_info_of_a_job_that_never_ran():
    run = FakeRunner({
        ("scontrol",): (1, "", "slurm_load_jobs error: Invalid job id specified\n"),
        ("sacct", "-c"): (0, SACCT_NEVER_RAN, ""),
    })
    info = slurm.job_info("1003", run=run)
    assert (info.nodes, info.nodelist, info.state) == (0, None, "CANCELLED")


def test_job_info_unknown_everywhere_is_none():
    run = FakeRunner({
        ("scontrol",): (1, "", "slurm_load_jobs error: Invalid job id specified\n"),
        ("sacct",): (0, "", ""),
    })
    assert slurm.job_info("99999", run=run) is None


def test_job_info_ignores_other_jobs_in_sacct_output():
    run = FakeRunner({
        ("scontrol",): (1, "", "slurm_load_jobs error: Invalid job id specified\n"),
        ("sacct",): (0, SACCT_COMPLETION, ""),
    })
    assert slurm.job_info("100", run=run) is None


def test_job_info_controller_down_is_an_error_not_unknown():
    run = FakeRunner({("scontrol",): (1, "", "slurm_load_jobs error: Unable to contact slurm controller "
                                             "(connect failure)\n")})
    with pytest.raises(SlurmError, match="Unable to contact slurm controller"):
        slurm.job_info("1000", run=run)


# ----------------------------------------------------------------------------- squeue

def test_list_jobs_argv_and_parse():
    run = FakeRunner({("squeue",): (0, SQUEUE_LIST, "")})
    jobs = slurm.list_jobs(user="alice", run=run)
    assert run.argvs == [["squeue", "-h", "-o", "%i|%j|%T|%r|%D|%N|%l|%L|%S|%e|%u|%Z", "--name=serve-only",
                          "-u", "alice"]]
    assert [(j.job_id, j.state, j.nodes, j.time_left_s) for j in jobs] == [
        ("1005", "PENDING", 1, 300), ("1006", "RUNNING", 2, 14352), ("1007", "PENDING", 4, None)]
    assert jobs[1].workdir == "/scratch/a|b"
    assert jobs[0].nodelist is None and jobs[1].nodelist == "n[1-2]"


def test_list_jobs_everyone_any_name():
    run = FakeRunner({("squeue",): (0, "", "")})
    assert slurm.list_jobs(user=None, name=None, run=run) == []
    assert run.argvs == [["squeue", "-h", "-o", "%i|%j|%T|%r|%D|%N|%l|%L|%S|%e|%u|%Z"]]


def test_list_jobs_failure_is_an_error():
    run = FakeRunner({("squeue",): (1, "", "squeue: error: Invalid user: nobody-here\n")})
    with pytest.raises(SlurmError, match="Invalid user"):
        slurm.list_jobs(user="nobody-here", run=run)


@pytest.mark.parametrize("answer, seconds", [
    pytest.param((0, "3:59:12\n", ""), 14352, id="running"),
    pytest.param((0, "UNLIMITED\n", ""), None, id="unlimited"),
    pytest.param((0, "NOT_SET\n", ""), None, id="not-set"),
    pytest.param((0, "", ""), None, id="ended"),
    pytest.param((1, "", "slurm_load_jobs error: Invalid job id specified\n"), None, id="unknown"),
])
def test_remaining_s(answer, seconds):
    run = FakeRunner({("squeue",): answer})
    assert slurm.remaining_s("42", run=run) == seconds
    assert run.argvs == [["squeue", "-h", "-j", "42", "-o", "%L"]]


def test_hostnames():
    run = FakeRunner({("scontrol", "show", "hostnames"): (0, "n1\nn2\nn3\n", "")})
    assert slurm.hostnames("n[1-3]", run=run) == ["n1", "n2", "n3"]
    assert run.argvs == [["scontrol", "show", "hostnames", "n[1-3]"]]
    assert slurm.hostnames("", run=run) == [] and slurm.hostnames(None, run=run) == []
    assert len(run.calls) == 1


# the lab's --no-netns nodes (all on 127.0.0.1, names that do not resolve), and a cloud-style node
NODE_LINES = (
    "NodeName=n1 Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 CPUTot=8 CPULoad=0.10 AvailableFeatures=(null) "
    "ActiveFeatures=(null) Gres=gpu:4 NodeAddr=127.0.0.1 NodeHostName=localhost Port=6821 Version=22.05.8 "
    "OS=Linux 6.1.0 #1 SMP RealMemory=65536 State=IDLE Reason=test [root@2026-12-02T17:00:00]\n"
    "NodeName=gpu-a7 NodeAddr=10.9.8.7 NodeHostName=gpu-a7 State=ALLOCATED\n"
    "NodeName=bare State=DOWN\n"
)


def test_parse_node_addrs():
    assert slurm.parse_node_addrs(NODE_LINES) == {"n1": "127.0.0.1", "gpu-a7": "10.9.8.7"}
    assert slurm.parse_node_addrs("") == {}


def test_node_addrs_asks_slurm_for_each_node_and_leaves_out_what_it_cannot_show():
    run = FakeRunner({("scontrol", "show", "node", "-o", "n1"): (0, NODE_LINES.splitlines()[0] + "\n", ""),
                      ("scontrol", "show", "node", "-o", "n9"): (1, "", "Node n9 not found\n")})
    assert slurm.node_addrs(["n1", "n9"], run=run) == {"n1": "127.0.0.1"}
    assert run.argvs == [["scontrol", "show", "node", "-o", "n1"], ["scontrol", "show", "node", "-o", "n9"]]


# ----------------------------------------------------------------------------- sbatch / scancel

@pytest.mark.parametrize("stdout, job_id", [
    pytest.param("1234\n", "1234", id="plain"),
    pytest.param("1234;alps\n", "1234", id="with-cluster"),
    pytest.param("sbatch: warning: something\n987\n", "987", id="warning-before"),
])
def test_submit_parses_the_job_id(stdout, job_id):
    run = FakeRunner({("sbatch",): (0, stdout, "")})
    assert slurm.submit(["--nodes", "2", "-t", "04:00:00"], "#!/bin/bash\necho hi\n", run=run) == job_id
    assert run.calls == [(["sbatch", "--parsable", "--nodes", "2", "-t", "04:00:00"], "#!/bin/bash\necho hi\n")]


@pytest.mark.parametrize("stderr, message, hint", [
    pytest.param("sbatch: error: invalid partition specified: nope\n"
                 "sbatch: error: Batch job submission failed: Invalid partition name specified\n",
                 "Batch job submission failed: Invalid partition name specified", "SLURM_PARTITION", id="partition"),
    pytest.param("sbatch: error: Batch job submission failed: Invalid account or account/partition combination "
                 "specified\n", "Invalid account", "SBATCH_ACCOUNT", id="account"),
    pytest.param("sbatch: error: Batch job submission failed: Requested time limit is invalid (missing or exceeds "
                 "some limit)\n", "Requested time limit", "SERVE_TIME", id="time-limit"),
    pytest.param("sbatch: error: Batch job submission failed: Requested node configuration is not available\n",
                 "node configuration", "sinfo", id="nodes"),
    pytest.param("", "exit status 1, no message", "SUBMIT=0", id="silent"),
])
def test_submit_refusal_carries_sbatchs_words_and_a_hint(stderr, message, hint):
    run = FakeRunner({("sbatch",): (1, "", stderr)})
    with pytest.raises(SlurmError) as err:
        slurm.submit([], "#!/bin/bash\n", run=run)
    assert message in err.value.message and "sbatch: error:" not in err.value.message
    assert hint in err.value.hint


def test_submit_without_job_id_is_an_error():
    run = FakeRunner({("sbatch",): (0, "Submitted batch job 12\n", "")})
    with pytest.raises(SlurmError, match="no job id"):
        slurm.submit([], "#!/bin/bash\n", run=run)


def test_cancel_argv():
    run = FakeRunner({("scancel",): (0, "", "")})
    slurm.cancel("42", run=run)
    slurm.cancel(42, run=run, signal="TERM")
    assert run.argvs == [["scancel", "42"], ["scancel", "--signal=TERM", "42"]]


@pytest.mark.parametrize("stderr", [
    pytest.param("scancel: error: Kill job error on job id 42: Job/step already completing or completed\n", id="done"),
    pytest.param("scancel: error: Kill job error on job id 42: Invalid job id specified\n", id="unknown"),
])
def test_cancel_of_an_ended_job_is_fine(stderr):
    run = FakeRunner({("scancel",): (1, "", stderr)})
    assert slurm.cancel("42", run=run) is None
    assert [argv for argv, _ in run.calls] == [["scancel", "42"]]


def test_cancel_refused_is_an_error():
    run = FakeRunner({("scancel",): (1, "", "scancel: error: Kill job error on job id 42: Access/permission denied\n")})
    with pytest.raises(SlurmError, match="permission denied"):
        slurm.cancel("42", run=run)


# ----------------------------------------------------------------------------- the runner

def test_run_forces_standard_time_format_and_has_no_shell(monkeypatch):
    seen = {}

    def fake_run(argv, **kw):
        seen.update(kw, argv=argv)
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setenv("SLURM_TIME_FORMAT", "relative")
    monkeypatch.setattr(subprocess, "run", fake_run)
    slurm.run(["squeue", "-h"], timeout_s=7)
    assert seen["env"]["SLURM_TIME_FORMAT"] == "standard"
    assert seen["timeout"] == 7 and seen["argv"] == ["squeue", "-h"] and not seen.get("shell")


def test_run_missing_binary_is_a_slurm_error():
    with pytest.raises(SlurmError, match="not on PATH"):
        slurm.run(["envlayers-no-such-slurm-binary"])


def test_run_timeout_is_a_slurm_error():
    with pytest.raises(SlurmError, match="did not answer within"):
        slurm.run(["sleep", "5"], timeout_s=0.2)


def test_public_names():
    assert sorted(slurm.__all__) == sorted([
        "RESUBMIT_OPTIONS", "TERMINAL_STATES", "WINDOW_FIELDS", "JobInfo", "SacctJob", "cancel",
        "dependent_sbatch_argv", "format_time_limit", "hostnames", "job_fields", "job_info", "list_jobs",
        "one_node_step_argv", "overlap_step_argv", "parse_duration", "parse_job_fields", "parse_parsable",
        "parse_partitions", "parse_scontrol_job", "parse_window", "partition_max_times", "ranks_step_argv",
        "remaining_s", "resubmit_options", "run", "sbatch_argv", "shrink_argv", "slurm_cancelled", "step_listed",
        "submit", "unreachable", "window_argv", "window_jobs"])
    assert all(hasattr(slurm, name) for name in slurm.__all__)


def test_parse_partitions_reads_name_default_and_maxtime():
    text = ("PartitionName=mi300 AllowGroups=ALL Default=YES MaxTime=UNLIMITED Nodes=n[1-3] State=UP\n"
            "PartitionName=mi200 AllowGroups=ALL Default=NO MaxTime=1-12:00:00 Nodes=n[1-3] State=UP\n"
            "PartitionName=short Default=NO MaxTime=00:30:00 State=UP\n")
    assert slurm.parse_partitions(text) == [("mi300", True, None), ("mi200", False, 129600), ("short", False, 1800)]


@pytest.mark.parametrize("seconds, text", [
    pytest.param(1800, "00:30:00", id="half-an-hour"),
    pytest.param(86400, "1-00:00:00", id="a-day"),
    pytest.param(129661, "1-12:01:01", id="a-day-and-a-half"),
])
def test_format_duration_is_what_parse_duration_reads(seconds, text):
    from envlayers.durations import format_duration

    assert format_duration(seconds) == text and slurm.parse_duration(text) == seconds


# ------------------------------------------------------------------ builders and calls other modules make


@pytest.mark.parametrize("seconds, text", [
    pytest.param(600, "0:10:00", id="ten-minutes"),
    pytest.param(3661, "1:01:01", id="hour-minute-second"),
    pytest.param(93600, "26:00:00", id="past-a-day-in-hours"),
])
def test_format_time_limit(seconds, text):
    assert slurm.format_time_limit(seconds) == text


def test_dependent_sbatch_argv_names_the_script_file_last():
    assert slurm.dependent_sbatch_argv("/r/41/job.sh", "after:41+7", 600, ["--partition=mi200"]) == [
        "sbatch", "--parsable", "--dependency=after:41+7", "--time=0:10:00", "--partition=mi200", "/r/41/job.sh"]


def test_sbatch_argv_without_a_script_reads_it_on_stdin():
    assert slurm.sbatch_argv(["--nodes=2"]) == ["sbatch", "--parsable", "--nodes=2"]


def test_resubmit_options_come_from_the_job_fields_slurm_set():
    fields = slurm.parse_job_fields(SCONTROL_PENDING)
    assert slurm.resubmit_options(fields) == ["--partition=mi300", "--chdir=/scratch/my runs"]


def test_job_fields_are_empty_when_scontrol_refuses():
    assert slurm.job_fields("9", run=fake_run(rc=1, stderr="Invalid job id specified")) == {}
    run = fake_run(SCONTROL_RUNNING)
    assert slurm.job_fields("1000", run=run)["Partition"] == "mi300"
    assert run.calls[0][0] == ["scontrol", "show", "job", "-o", "1000"]


def test_overlap_step_and_shrink_argv():
    assert slurm.overlap_step_argv("9", "n1", ["true"], options=["--gres=none"]) == [
        "srun", "--overlap", "--jobid=9", "--nodes=1", "--ntasks=1", "--nodelist=n1", "--gres=none", "true"]
    assert slurm.shrink_argv("42", ["n1", "n3"]) == ["scontrol", "update", "JobId=42", "NodeList=n1,n3"]


@pytest.mark.parametrize("stdout, rc, want", [
    pytest.param("5.0\n5.1\n5.batch\n", 0, True, id="listed"),
    pytest.param("5.0\n", 0, False, id="gone"),
    pytest.param("", 1, None, id="slurm-did-not-answer"),
])
def test_step_listed(stdout, rc, want):
    run = fake_run(stdout, rc)
    assert slurm.step_listed("5.1", run=run) is want
    assert run.calls[0][0] == ["squeue", "-h", "-s", "-j", "5", "-o", "%i"]


def test_window_argv_and_the_error_when_sacct_cannot_tell():
    argv = slurm.window_argv("serve-only", 0.0, "alice")
    assert argv[:5] == ["sacct", "-X", "-P", "-n", "--name=serve-only"] and argv[-1] == "--user=alice"
    assert slurm.window_argv("serve-only", 0.0, None)[-1] == "--allusers"
    with pytest.raises(SlurmError, match="^sacct: error: Slurm accounting storage is disabled$"):
        slurm.window_jobs("serve-only", 0.0, None, run=fake_run(rc=1, stderr="sacct: error: Slurm accounting "
                                                                             "storage is disabled\n"))


def test_run_takes_the_environment_and_directory_and_gives_no_stdin(tmp_path):
    proc = slurm.run(["bash", "-c", 'echo "$WHO $SLURM_TIME_FORMAT $PWD"; cat'],
                     env={"WHO": "me", "PATH": "/usr/bin:/bin"}, cwd=tmp_path)
    assert proc.stdout == f"me standard {tmp_path}\n"  # cat read nothing: stdin is /dev/null


@pytest.mark.parametrize("seconds, text", [(0, "0 s"), (45, "45 s"), (240, "4 min"), (7200, "2 h"),
                                           (5400, "1 h 30 min"), (90061, "1 d 1 h 1 min 1 s")])
def test_spoken_durations(seconds, text):
    from envlayers.durations import spoken

    assert spoken(seconds) == text



@pytest.mark.parametrize("text, said", [
    pytest.param("slurmstepd: error: *** STEP 5.2 ON n1 CANCELLED AT 2026-12-05T07:00:00 DUE TO TIME LIMIT ***\n",
                 "STEP 5.2 ON n1 CANCELLED AT 2026-12-05T07:00:00 DUE TO TIME LIMIT", id="time-limit"),
    pytest.param("srun: Job step aborted\nslurmstepd: error: *** JOB 5 ON n1 CANCELLED AT 2026-12-05T07:00:00 ***\n",
                 "JOB 5 ON n1 CANCELLED AT 2026-12-05T07:00:00", id="scancel"),
    pytest.param("ssh: connect to host gw port 22: Connection refused\n", None, id="not-slurm"),
])
def test_slurm_cancelled_reads_slurmstepds_line(text, said):
    assert slurm.slurm_cancelled(text) == said
