"""Every command that acts on a job or an endpoint says its exit codes in its --help, and keeps them: a job
id that is no job id and an endpoint that does not answer each give the code the help promises. One
spelling per concept across the commands: JOBID for the job, --timeout-s for a bound in seconds."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import click
import pytest

from envlayers.cli import COMMANDS, SECTIONS, cli as main

REPO = Path(__file__).resolve().parents[1]
OPERATE_INSPECT = [n for title, names in SECTIONS if title.startswith(("Operate", "Inspect")) for n in names]
LAUNCH = [n for title, names in SECTIONS if title == "Launch" for n in names]


def _command(name: str) -> click.Command:
    return main.get_command(click.Context(main), name)


def _help(name: str) -> str:
    cmd = _command(name)
    return cmd.get_help(click.Context(cmd, info_name=name, parent=click.Context(main, info_name="env_layers")))


def _promised(name: str) -> dict[int, str]:
    """exit code -> the words the help gives it, from its "Exit ..." sentences."""
    text = " ".join(_help(name).split()).replace("e.g.", "eg")
    out: dict[int, str] = {}
    for sentence in re.findall(r"Exit(?: status)?:? (.*?)(?:\.(?: |$)|$)", text):
        for code, said in re.findall(r"(\d+)(?: when| on| with| nothing| all| clean| once| at|:)?([^;,]*)", sentence):
            out.setdefault(int(code), said.strip())
    return out


def _run(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "ENVLAYERS_"))}
    return subprocess.run([sys.executable, "-m", "envlayers", *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env={**env, "PYTHONPATH": str(REPO / "src")})


@pytest.mark.parametrize("name", OPERATE_INSPECT + ["wait"])
def test_each_command_that_acts_on_a_job_or_endpoint_states_its_exit_codes(name):
    promised = _promised(name)
    assert 0 in promised, (name, _help(name))
    assert 2 in promised, (name, promised)  # bad input: every one of them can be given a job that is none


JOB_COMMANDS = [n for n in COMMANDS if any(isinstance(p, click.Argument) and p.name in ("job_id", "target")
                                           for p in _command(n).params)]


def test_the_job_argument_is_spelled_jobid_everywhere():
    spelled = {n: [p.make_metavar(click.Context(_command(n))) for p in _command(n).params
                   if isinstance(p, click.Argument) and p.name == "job_id"] for n in JOB_COMMANDS}
    assert {m for ms in spelled.values() for m in ms} == {"JOBID"}, spelled
    assert len(JOB_COMMANDS) >= 10, JOB_COMMANDS


@pytest.mark.parametrize("name", sorted(set(JOB_COMMANDS) - {"tunnel"}))
def test_a_job_id_that_is_none_exits_2_in_one_line(name, tmp_path):
    more = {"batch": ("in.jsonl", "-o", "out.jsonl")}.get(name, ())  # its other required arguments
    done = _run(name, "12ab", *more, cwd=tmp_path)
    assert done.returncode == 2, (name, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("env_layers: error:") and "12ab" in lines[0], done.stderr


def test_timeouts_in_seconds_are_spelled_timeout_s():
    for name in COMMANDS:
        for p in _command(name).params:
            if isinstance(p, click.Option) and any(o.startswith("--timeout") for o in p.opts):
                assert p.opts[0] == "--timeout-s", (name, p.opts)


@pytest.fixture
def dead_url():
    with socket.socket() as s:  # a port nothing listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{s.getsockname()[1]}/v1"


@pytest.mark.parametrize("name, argv", [
    ("ping", ()), ("verify", ()), ("bench", ("--requests", "1", "--concurrency", "1")),
])
def test_an_endpoint_that_does_not_answer_gives_the_code_the_help_promises(name, argv, dead_url, tmp_path):
    promised = _promised(name)
    done = _run(name, dead_url, *argv, cwd=tmp_path)
    code = done.returncode
    assert code in promised and code != 0, (name, code, promised, done.stderr)
    words = promised[code]
    # ping checks the endpoint (its failing is the answer, 1); verify and bench cannot run their checks (2)
    assert ("do not" in words) if name == "ping" else ("could not run" in words), (name, code, words)
    assert dead_url.rsplit(":", 1)[1].split("/")[0] in done.stdout + done.stderr
