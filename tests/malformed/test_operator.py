"""Bad job ids for every command that takes one, and malformed `possible:` blocks in the knowledge base:
one line, exit 2, no traceback (run through the real CLI, ``python -m envlayers``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from malformed_tools import assert_clean_error, run_cli

ID_COMMANDS = ["wait", "status", "logs", "stop", "verify", "connect", "release"]
BAD_IDS = [
    pytest.param("12a", "is not a Slurm job id", id="word"),
    pytest.param("1234.", "is not a Slurm job id", id="dangling-dot"),
    pytest.param("1234.x", "is not a Slurm job id", id="unknown-step"),
    pytest.param("1234_5", "is an array task id", id="array-task"),
    pytest.param("1234_[1-3]", "is an array task id", id="array-range"),
    pytest.param("9" * 400, "is not a Slurm job id: more than 4294967295", id="huge-number"),
]


@pytest.mark.parametrize("command", ID_COMMANDS)
@pytest.mark.parametrize("job_id, needle", BAD_IDS)
def test_a_bad_job_id_is_one_line(tmp_path: Path, command: str, job_id: str, needle: str):
    proc = run_cli(command, job_id, cwd=tmp_path, env={"PATH": "/nonexistent", "SCRATCH": ""})
    if needle == "is not a Slurm job id" and command == "verify":
        needle = "is neither a job id nor a URL"  # verify takes a URL too
    assert_clean_error(proc, needle)
    assert len(proc.stderr.strip().splitlines()) == 1


# An scontrol that answers every id with another user's running job, as `scontrol show job 0` lists every job;
# it writes down the ids it was asked for, and sacct knows nothing
FAKE_SCONTROL = """#!/bin/sh
echo "$*" >> {asked}
echo "JobId=777 JobName=serve-only UserId=someone(4242) JobState=RUNNING Reason=None NodeList=n9 NumNodes=1 \
StdOut={out} WorkDir=/tmp"
"""


def _slurm(tmp_path: Path) -> tuple[dict[str, str], Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    asked = tmp_path / "asked"
    (bin_dir / "scontrol").write_text(FAKE_SCONTROL.format(asked=asked, out=tmp_path / "serve-only-777.out"))
    (bin_dir / "sacct").write_text("#!/bin/sh\nexit 0\n")
    for tool in ("scontrol", "sacct"):
        (bin_dir / tool).chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "SCRATCH": ""}, asked


ZERO_COMMANDS = [*ID_COMMANDS, "ping", "bench", "diagnose", "tunnel"]


@pytest.mark.parametrize("command", ZERO_COMMANDS)
@pytest.mark.parametrize("job_id", ["0", "00", "0.batch", "0.0"])
def test_job_zero_is_refused_before_slurm_is_asked(tmp_path: Path, command: str, job_id: str):
    """Job 0 is no job: `scontrol show job 0` lists every job, so `wait 0` printed another job's endpoint."""
    env, asked = _slurm(tmp_path)
    args = [command, job_id] + (["--to", "u@gw", "--remote-port", "9000"] if command == "tunnel" else [])
    proc = run_cli(*args, cwd=tmp_path, env=env)
    assert_clean_error(proc, f"JOBID: '{job_id}' is not a Slurm job id: Slurm numbers jobs from 1", "; hint: ")
    assert len(proc.stderr.strip().splitlines()) == 1 and proc.stdout == ""
    assert not asked.exists(), "Slurm was asked about job 0"


@pytest.mark.parametrize("command", [*ID_COMMANDS, "ping", "bench"])
@pytest.mark.parametrize("job_id", ["", "  "])
def test_an_empty_job_id_is_refused(tmp_path: Path, command: str, job_id: str):
    env, asked = _slurm(tmp_path)
    proc = run_cli(command, job_id, cwd=tmp_path, env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "internal error" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not asked.exists()


@pytest.mark.parametrize("job_id", ["", "  "])
def test_diagnose_of_an_empty_id_does_not_read_the_directory_it_runs_in(tmp_path: Path, job_id: str):
    """`diagnose ''` read the current directory (Path('') is '.') and reported another job's findings."""
    (tmp_path / "server-0.log").write_text("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB\n")
    proc = run_cli("diagnose", job_id, cwd=tmp_path, env={"PATH": "/nonexistent"})
    assert_clean_error(proc, f"JOBID|LOGFILE|RUNDIR: {job_id!r} is empty: not a job id, a log file or a run directory")
    assert proc.stdout == ""


@pytest.mark.parametrize("job_id", ["1012.0", "1012.batch", "1012.extern", " 1012 ", "01012"])
def test_bench_takes_the_step_ids_every_other_command_takes(tmp_path: Path, job_id: str):
    """bench refused 1012.0 and 1234.batch as URLs; now it looks up job 1012 like wait, status and ping."""
    env, asked = _slurm(tmp_path)
    for command in ("bench", "wait"):
        asked.unlink(missing_ok=True)
        extra = ["--timeout", "1"] if command == "wait" else ["--concurrency", "1", "--requests", "1"]
        proc = run_cli(command, job_id, *extra, cwd=tmp_path, env=env)
        assert "is neither a job id nor" not in proc.stderr, proc.stderr
        assert set(asked.read_text().splitlines()) == {"show job -o 1012"}, (command, proc.stderr)


RULE = """rules:
  - id: x
    title: X
    cause: c
    fix: f
    see: docs/diagnose.md
    status: open
    signature: ['boom']
    requires: ['ctx']
{extra}"""


@pytest.mark.parametrize("extra, needle", [
    pytest.param("    possible: yes\n", "possible: must be a mapping", id="not-a-mapping"),
    pytest.param("    possible: {context: ['a'], confirm: 'when x'}\n", "must be a sentence starting with 'if'",
                 id="confirm-not-if"),
    pytest.param("    possible: {confirm: 'if x'}\n", "possible.context: missing", id="no-context"),
    pytest.param("    possible: {context: ['('], confirm: 'if x'}\n", "invalid regular expression", id="bad-regex"),
    pytest.param("    possible: {context: ['a'], confirm: 'if x', when: 1}\n", "possible.when: unknown key",
                 id="unknown-key"),
])
def test_a_malformed_possible_block_is_one_line(tmp_path: Path, extra: str, needle: str):
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULE.format(extra=extra))
    log = tmp_path / "a.log"
    log.write_text("boom\n")
    proc = run_cli("diagnose", "--rules", str(rules), str(log), cwd=tmp_path)
    assert_clean_error(proc, needle, f"{rules}:")


def test_possible_without_requires_is_refused(tmp_path: Path):
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULE.format(extra="    possible: {context: ['a'], confirm: 'if x'}\n").replace(
        "    requires: ['ctx']\n", ""))
    log = tmp_path / "a.log"
    log.write_text("boom\n")
    assert_clean_error(run_cli("diagnose", "--rules", str(rules), str(log), cwd=tmp_path),
                       "only applies to a rule with `requires`")
