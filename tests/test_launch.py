"""The in-job launcher without Slurm or root: the plan, ranks.sh through real bash, the supervision
loop on fake exit files with a fake clock, the launcher's end records and the core guard."""

from __future__ import annotations

import json
import re
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envlayers.errors import KeyValueError
from envlayers import engines, rundir, topology
from envlayers.launch.launcher import core_guard, read_api_key, resolve_nodes
from envlayers.launch.prepare import LaunchFailure, Node, launch_keys, prepare
from envlayers.jobscript import srun_dry_line
from envlayers.slurm import ranks_step_argv
from envlayers.launch.ranks import rank_script
from envlayers.launch.supervise import EXIT_SETTLE_S, POLL_S
from envlayers.readiness import Probe, add_usage, block
from envlayers.rundir import EndpointRecord
from clocktools import Clock
from launchtools import (N1, N2, PIPELINE, SINGLE_SGLANG, SINGLE_VLLM, Step, Stop, alloc, exited, grow, run_dir_block,
                         started, supervisor)


# ----------------------------------------------------------------------- the plan (pure)


@pytest.mark.parametrize("edf, want", [
    ("hpcagent-bench-sglang-mi300-latest", ["--environment=hpcagent-bench-sglang-mi300-latest"]),
    (None, []),
], ids=["container-engine", "runtime-none"])
def test_srun_line_has_one_task_per_node_every_cpu_and_the_edf(edf, want):
    assert ranks_step_argv(2, "192", edf, "/r/ranks.sh") == ["srun", "--nodes=2", "--ntasks=2",
                                                             "--ntasks-per-node=1", "--cpus-per-task=192",
                                                             "--kill-on-bad-exit=1", *want, "bash", "/r/ranks.sh"]


def test_the_dry_run_srun_line_is_the_jobs_with_the_cpu_count_left_to_the_job(tmp_path):
    lp = prepare({**PIPELINE, "ENVLAYERS_EDF": "e"}, alloc(tmp_path, ifaces={"hsn0": "1.2.3.4"}))
    dry = subprocess.run(["bash", "-c", f"SLURM_CPUS_ON_NODE=192 RUN_DIR={shlex.quote(str(tmp_path))}; "
                          f"printf '%s\\n' {srun_dry_line(2, 'e').replace('srun ', '', 1)}"],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert ["srun", *dry] == list(lp.srun)


def test_prepare_substitutes_the_master_and_records_the_restart(tmp_path):
    lp = prepare(PIPELINE, alloc(tmp_path, restart=2, ifaces={"hsn0": "1.2.3.4"}))
    assert "--node-rank 1 --dist-init-addr n1:29500" in lp.files["ranks.sh"]
    assert "ENVLAYERS_MASTER_ADDR" not in lp.files["ranks.sh"]
    assert json.loads(lp.files["launch.json"])["restart"] == 2
    assert "ENVLAYERS-TOPOLOGY: nccl_socket_ifname==hsn0 (derived)" in lp.lines
    assert [t.url for t in lp.targets] == ["http://n1:8000/v1"]


@pytest.mark.parametrize("shape_keys", [
    pytest.param({"INFERENCE_NODES": "2", "PIPELINE_PARALLEL_SIZE": "2"}, id="pipeline"),
    pytest.param({"INFERENCE_NODES": "2", "NUMBER_OF_INSTANCES": "2"}, id="data-parallel"),
])
def test_every_multi_node_vllm_rank_announces_its_own_node_address(tmp_path, shape_keys):
    # without VLLM_HOST_IP a rank on a node with no default route says "Failed to get the IP address,
    # using 0.0.0.0 by default" and the ranks never meet
    lp = prepare({**SINGLE_VLLM, **shape_keys}, alloc(tmp_path, ifaces={"hsn0": "1.2.3.4"}))
    assert [c.env["VLLM_HOST_IP"] for c in lp.commands] == ["10.0.0.1", "10.0.0.2"]
    arms = lp.files["ranks.sh"].split("\n  1)\n", 1)
    assert "export VLLM_HOST_IP=10.0.0.1\n" in arms[0] and "export VLLM_HOST_IP=10.0.0.2\n" in arms[1]


def test_a_single_node_vllm_rank_gets_no_host_address(tmp_path):
    lp = prepare(SINGLE_VLLM, alloc(tmp_path, nodes=(N1,)))
    assert "VLLM_HOST_IP" not in lp.commands[0].env


def test_a_node_name_that_does_not_resolve_is_reached_at_its_slurm_address(tmp_path):
    def resolve(name):
        if name == "n1":
            raise OSError("no such host")
        return "10.0.0.2"

    nodes = resolve_nodes(["n1", "n2"], resolve, lambda names: {"n1": "192.168.7.1"} if names == ["n1"] else {})
    assert nodes == (Node("n1", "192.168.7.1", False), Node("n2", "10.0.0.2", True))
    lp = prepare({**SINGLE_VLLM, "INFERENCE_NODES": "2", "INFERENCE_MODE": "replicas"}, alloc(tmp_path, nodes=nodes))
    assert [(t.url, t.probe_url) for t in lp.targets] == [
        ("http://192.168.7.1:8000/v1", "http://192.168.7.1:8000/v1"), ("http://n2:8000/v1", "http://10.0.0.2:8000/v1")]
    assert resolve_nodes(["gone"], resolve=lambda n: (_ for _ in ()).throw(OSError()), slurm_addrs=lambda n: {}) == (
        Node("gone", "gone", False),)


def test_an_asked_fabric_that_is_missing_stops_before_srun_and_says_what_it_saw(tmp_path):
    with pytest.raises(LaunchFailure) as err:
        prepare({**PIPELINE, "ENVLAYERS_HSN_IFACE": "ib"}, alloc(tmp_path, ifaces={"eth0": "1.2.3.4"}))
    assert "no interface ib<N> with an IPv4 address (have: eth0)" in str(err.value)
    assert err.value.lines[0].startswith("ENVLAYERS-TOPOLOGY: shape=pipeline")


def test_sglang_with_a_key_warns_that_the_key_is_on_its_command_line(tmp_path):
    keyed = prepare({**SINGLE_SGLANG, "SERVER_API_KEY_FILE": "/k"}, alloc(tmp_path, nodes=(N1,), api_key=True))
    assert any(line.startswith("ENVLAYERS-WARN: SGLang takes the API key only on its command line") for line in keyed.lines)
    vllm = prepare({**SINGLE_VLLM, "SERVER_API_KEY_FILE": "/k"}, alloc(tmp_path, nodes=(N1,), api_key=True))
    assert not any("ENVLAYERS-WARN" in line for line in vllm.lines)
    assert "VLLM_API_KEY=*** vllm serve" in " ".join(vllm.lines).replace("'", "")


@pytest.mark.parametrize("keys, served", [
    pytest.param(SINGLE_VLLM, True, id="vllm-always"),
    pytest.param(SINGLE_SGLANG, True, id="sglang-default-on"),
    pytest.param({**SINGLE_SGLANG, "SGLANG_ENABLE_METRICS": "false"}, False, id="sglang-turned-off"),
    pytest.param({**SINGLE_SGLANG, "SGLANG_ENABLE_METRICS": ""}, False, id="sglang-empty-is-off"),
])
def test_the_plan_knows_whether_the_engine_serves_metrics(tmp_path, keys, served):
    assert prepare(keys, alloc(tmp_path, nodes=(N1,))).metrics is served


@pytest.mark.parametrize("text", [pytest.param("", id="empty"), pytest.param(" \n\n", id="only-whitespace")])
def test_an_empty_key_file_is_an_error_naming_the_file(tmp_path, text):
    key = tmp_path / "key"
    key.write_text(text)
    with pytest.raises(LaunchFailure, match=f"SERVER_API_KEY_FILE {key}: the key file is empty"):
        read_api_key(str(key))
    with pytest.raises(LaunchFailure, match=f"SERVER_API_KEY_FILE {tmp_path / 'nope'}: the key file does not exist"):
        read_api_key(str(tmp_path / "nope"))


def test_launch_keys_are_the_merged_keys_only():
    environ = {"A": "1", "EMPTY": "", "SGLANG_ATTENTION_BACKEND": "triton", "ENVLAYERS_EDF": "x", "PATH": "/bin",
               "ENVLAYERS_KEYS": "A EMPTY"}
    assert launch_keys(environ) == {"A": "1", "EMPTY": "", "ENVLAYERS_EDF": "x", "ENVLAYERS_KEYS": "A EMPTY"}


def test_exported_launcher_knobs_from_the_login_shell_are_not_launch_keys():
    environ = {"ENVLAYERS_KEYS": "A", "A": "1", "ENVLAYERS_HSN_IFACE": "ib", "ENVLAYERS_EDF": "e"}
    assert launch_keys(environ) == {"A": "1", "ENVLAYERS_KEYS": "A", "ENVLAYERS_EDF": "e"}


# --------------------------------------------------------------------------- ranks.sh through real bash


def test_ranks_script_is_bash_with_one_arm_per_rank_and_no_core_dumps(tmp_path):
    plan = topology.plan(PIPELINE)
    text = rank_script(engines.build_commands(plan, PIPELINE, "n1"), tmp_path)
    assert subprocess.run(["bash", "-n"], input=text, text=True, capture_output=True).returncode == 0
    assert "ulimit -c 0" in text.splitlines()
    assert "    export NCCL_NET_GDR_LEVEL=LOC\n    set -- python3 -m sglang.launch_server" in text


def run_rank(tmp_path: Path, cmds, rank=0, key: str | None = None, timeout=20) -> subprocess.CompletedProcess:
    (tmp_path / "ranks.sh").write_text(rank_script(cmds, tmp_path))
    env = {"SLURM_PROCID": str(rank), "PATH": os.environ["PATH"], "HOME": "/home/nobody-here"}
    if key is not None:
        env["SERVER_API_KEY"] = key
    return subprocess.run(["bash", str(tmp_path / "ranks.sh")], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=tmp_path)


@pytest.mark.parametrize("key", [None, "k3y"], ids=["keyless", "masked"])
def test_the_rank_exit_line_stands_on_its_own_line_after_output_without_a_newline(tmp_path, key):
    cmd = engines.RankCommand(argv=("printf", "%s", "last words"), key_env="K" if key else None)
    run_rank(tmp_path, [cmd], key=key)
    lines = (tmp_path / "server-0.log").read_text().splitlines()
    assert lines[-2:] == ["last words", "ENVLAYERS-STAGE: rank 0 exited with code 0"]


def test_ranks_script_runs_the_rank_and_records_its_exit_code(tmp_path):
    fake = engines.RankCommand(argv=("bash", "-c", "echo serving; exit 7"), env={"X": "1"})
    proc = run_rank(tmp_path, [fake])
    assert proc.returncode == 7
    assert (tmp_path / "rank-0.exit").read_text() == "7\n"
    log = (tmp_path / "server-0.log").read_text().splitlines()
    assert log[0].startswith("ENVLAYERS-STAGE: rank 0 up on ") and log[1] == "serving"
    assert log[-1] == "ENVLAYERS-STAGE: rank 0 exited with code 7"
    assert (tmp_path / "core-limit.txt").read_text() == "rank=0 limit=0\n"


DUMP = ("import json, os, sys\n"
        "json.dump({'argv': sys.argv[1:], 'env': {k: v for k, v in os.environ.items() if k in "
        "('NCCL_NET_GDR_LEVEL', 'NCCL_SOCKET_IFNAME', 'VLLM_API_KEY', 'SERVER_API_KEY')}}, "
        "open(os.environ.get('DUMP_TO', 'dump.json'), 'w'))\n")

HOSTILE = [
    pytest.param("${HOME}", id="brace-reference"),
    pytest.param("$HOME", id="bare-reference"),
    pytest.param("${SERVER_API_KEY}", id="the-key-by-reference"),
    pytest.param("$(touch CANARY)", id="command-substitution"),
    pytest.param("`touch CANARY`", id="backticks"),
    pytest.param("it's \"quoted\" \\ back", id="quotes-and-backslash"),
    pytest.param("line one\nline two\n", id="newlines"),
    pytest.param("EOF\nENVLAYERS_ENV\n'", id="heredoc-delimiters"),
    pytest.param("; touch CANARY; #", id="command-separator"),
    pytest.param("x" * 100_000, id="very-long"),
    pytest.param("${HOME:+$(touch CANARY)}", id="nested-expansion"),
]


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize("value", HOSTILE)
def test_every_value_reaches_the_engine_byte_exact_and_nothing_executes(tmp_path, engine, value):
    env = {**SINGLE_VLLM, "INFERENCE_ENGINE": engine, "TOOL_CALL_PARSER": value, "REASONING_PARSER": value,
           "VLLM_SERVED_MODEL": value, "NCCL_NET_GDR_LEVEL": value,
           "SERVER_EXTRA_ARGS": shlex.join(["--x", value]), "SERVER_API_KEY": "<present>"}
    plan = topology.plan(env)
    cmd = engines.build_commands(plan, env, "n1")[0]
    (tmp_path / "dump.py").write_text(DUMP)
    fake = engines.RankCommand((sys.executable, str(tmp_path / "dump.py"), *cmd.argv), cmd.env, cmd.key_env,
                               cmd.key_flag)
    key = "k3y-" + os.urandom(4).hex()
    proc = run_rank(tmp_path, [fake], key=key)
    assert proc.returncode == 0, (tmp_path / "server-0.log").read_text()[-2000:]
    got = json.loads((tmp_path / "dump.json").read_text())
    want_argv = list(cmd.argv) + (["--api-key", key] if engine == "sglang" else [])
    assert got["argv"] == want_argv
    assert value in got["argv"] and ["--x", value] == got["argv"][got["argv"].index("--x"):][:2]
    assert got["env"]["NCCL_NET_GDR_LEVEL"] == value
    assert "SERVER_API_KEY" not in got["env"]  # the engine gets the key only the way it reads it
    assert got["env"].get("VLLM_API_KEY") == (key if engine == "vllm" else None)
    assert not (tmp_path / "CANARY").exists()


@pytest.mark.parametrize("key", [
    pytest.param("plain-Key.123", id="plain"),
    pytest.param("it's", id="single-quote"),
    pytest.param('say "hi"', id="double-quote"),
    pytest.param("back\\slash", id="backslash"),
    pytest.param("a'b\"c\\d", id="all-three"),
])
def test_the_key_is_masked_in_every_form_an_engine_prints_it(tmp_path, key):
    # SGLang prints ServerArgs with repr(); other tools print JSON; the raw key as well
    printer = ("import json, sys\nk = sys.argv[sys.argv.index('--api-key') + 1]\n"
               "print(f'server_args=ServerArgs(api_key={k!r})'); print(json.dumps({'api_key': k})); print(k)\n"
               "print(repr(sys.argv))\n")
    (tmp_path / "p.py").write_text(printer)
    cmd = engines.RankCommand((sys.executable, str(tmp_path / "p.py")), key_flag="--api-key")
    assert run_rank(tmp_path, [cmd], key=key).returncode == 0
    log = (tmp_path / "server-0.log").read_text()
    assert "server_args=ServerArgs(api_key='***')" in log or "server_args=ServerArgs(api_key=\"***\")" in log
    for form in (key, repr(key)[1:-1], json.dumps(key)[1:-1]):
        assert form not in log, form
    assert log.count("***") >= 4


@pytest.mark.parametrize("key_env, key_flag", [("VLLM_API_KEY", None), (None, "--api-key")], ids=["vllm", "sglang"])
def test_a_rank_without_its_key_says_so_and_records_the_exit(tmp_path, key_env, key_flag):
    cmd = engines.RankCommand(("true",), key_env=key_env, key_flag=key_flag)
    proc = run_rank(tmp_path, [cmd], key="")
    assert proc.returncode == 2
    assert "ENVLAYERS-ERROR: rank 0: no API key reached the rank" in (tmp_path / "server-0.log").read_text()
    assert (tmp_path / "rank-0.exit").read_text() == "2\n"


# --------------------------------------------------------------------------- the supervision loop


@pytest.mark.parametrize("exits, blamed, code", [
    pytest.param([(1, 3, 10.0), (0, 143, 11.0)], 1, "3", id="first-failure-not-the-rank-srun-stopped"),
    pytest.param([(0, 143, 10.0), (1, 137, 11.0)], 1, "137", id="sigkill-is-a-real-failure"),
    pytest.param([(1, 9, 10.0), (0, 4, 11.0)], 1, "9", id="the-earlier-of-two-failures"),
    pytest.param([(0, 0, 10.0), (1, 143, 11.0)], 0, "0", id="all-stopped-the-earliest"),
])
def test_the_loop_blames_the_rank_that_failed_first(tmp_path, exits, blamed, code):
    clock, step = Clock(), Step()
    sup = supervisor(tmp_path, clock, step)
    started(tmp_path, 0), started(tmp_path, 1)
    first, second = exits
    clock.at(5, lambda: exited(tmp_path, *first))
    clock.at(5 + EXIT_SETTLE_S / 2, lambda: exited(tmp_path, *second))  # srun stops the other one a bit later
    with pytest.raises(LaunchFailure) as err:
        sup.run()
    assert err.value.rank == blamed
    assert str(err.value).startswith(f"rank {blamed} on n{blamed + 1} exited with code {code} before the endpoint")


def test_the_loop_waits_for_the_other_ranks_exit_before_blaming(tmp_path):
    clock, step = Clock(), Step()
    sup = supervisor(tmp_path, clock, step)
    started(tmp_path, 0), started(tmp_path, 1)
    # rank 0 (stopped by srun) lands first in the loop's view, rank 1's earlier failure a moment later
    clock.at(5, lambda: exited(tmp_path, 0, 143, 20.0))
    clock.at(5 + EXIT_SETTLE_S - 0.5, lambda: exited(tmp_path, 1, 3, 10.0))
    with pytest.raises(LaunchFailure) as err:
        sup.run()
    assert err.value.rank == 1 and "(then: rank 0 code 143)" in str(err.value)


def test_a_lone_exit_is_blamed_once_the_settle_time_passed(tmp_path):
    clock, step = Clock(), Step()
    sup = supervisor(tmp_path, clock, step)
    started(tmp_path, 0), started(tmp_path, 1)
    clock.at(5, lambda: exited(tmp_path, 1, 3, 10.0))
    with pytest.raises(LaunchFailure, match="rank 1 on n2 exited with code 3"):
        sup.run()
    assert 1000 + 5 + EXIT_SETTLE_S <= clock.t <= 1000 + 5 + EXIT_SETTLE_S + 2 * POLL_S


@pytest.mark.parametrize("code, at_once", [("137", True), ("139", True), ("134", True), ("143", False),
                                           ("130", False), ("3", False), ("1", False)])
def test_a_rank_killed_by_a_signal_is_blamed_at_once_others_after_the_settle_time(tmp_path, code, at_once):
    clock, step = Clock(), Step()
    sup = supervisor(tmp_path, clock, step)
    started(tmp_path, 0), started(tmp_path, 1)
    clock.at(5, lambda: exited(tmp_path, 1, int(code), 10.0))
    with pytest.raises(LaunchFailure, match=f"rank 1 on n2 exited with code {code}"):
        sup.run()
    waited = clock.t - 1000 - 5
    assert (waited <= 2 * POLL_S) if at_once else (EXIT_SETTLE_S <= waited <= EXIT_SETTLE_S + 2 * POLL_S)


@pytest.mark.parametrize("rank_start", [3, 12])
def test_a_rank_that_never_starts_fails_at_the_rank_start_budget_not_before(tmp_path, rank_start):
    clock, step = Clock(), Step()
    sup = supervisor(tmp_path, clock, step, rank_start=rank_start, budget=100)
    started(tmp_path, 0)
    with pytest.raises(LaunchFailure) as err:
        sup.run()
    assert str(err.value).startswith(f"only 1 of 2 ranks started within {rank_start}s (missing: 1)")
    assert rank_start < clock.t - 1000 <= rank_start + POLL_S


@pytest.mark.parametrize("ends", ["rank-start-budget", "step-ended"])
def test_ranks_that_never_start_carry_what_slurm_says_of_the_missing_ranks(tmp_path, ends):
    clock, step = Clock(), Step()
    asked = []
    sup = supervisor(tmp_path, clock, step, rank_start=3,
                     diag=lambda missing: asked.append(missing) or [f"ENVLAYERS-DIAG: missing {missing}"])
    started(tmp_path, 0)
    if ends == "step-ended":
        clock.at(2, lambda: setattr(step, "code", 1))
    with pytest.raises(LaunchFailure) as err:
        sup.run()
    assert asked == [[1]] and err.value.lines == ("ENVLAYERS-DIAG: missing [1]",)


def test_a_failing_slurm_diagnosis_does_not_hide_the_failure(tmp_path):
    clock, step = Clock(), Step()

    def broken(missing):
        raise RuntimeError("scontrol exploded")

    sup = supervisor(tmp_path, clock, step, rank_start=3, diag=broken)
    started(tmp_path, 0)
    with pytest.raises(LaunchFailure, match=r"only 1 of 2 ranks started") as err:
        sup.run()
    assert err.value.lines == ("ENVLAYERS-DIAG: asking Slurm failed: RuntimeError: scontrol exploded",)


def test_ranks_that_start_late_but_within_the_budget_are_fine(tmp_path):
    clock, step = Clock(), Step()
    live: list[float] = []
    sup = supervisor(tmp_path, clock, step, rank_start=5, probe_ok=lambda url: clock.t > 1007, live=live)
    started(tmp_path, 0)
    clock.at(4.5, lambda: started(tmp_path, 1))
    clock.at(20, lambda: (_ for _ in ()).throw(Stop()))
    with pytest.raises(Stop):
        sup.run()
    assert sup.started == {0, 1} and len(live) == 1 and 7 <= live[0] <= 8


@pytest.mark.parametrize("budget", [4, 9])
def test_the_readiness_budget_ends_the_launch_when_spent_not_before(tmp_path, budget):
    clock, step = Clock(), Step()
    said: list[str] = []
    sup = supervisor(tmp_path, clock, step, budget=budget, rank_start=1, said=said)
    started(tmp_path, 0), started(tmp_path, 1)
    with pytest.raises(LaunchFailure) as err:
        sup.run()
    assert str(err.value) == (f"endpoint not live after {budget}s (readiness budget): 0 of 1 answered; last probe "
                              "of rank 0: no answer: [Errno 111] Connection refused")
    assert err.value.rank == 0
    assert budget < clock.t - 1000 <= budget + 0.5 + POLL_S


def completions(*answers):
    """A fake readiness.generates: the given (status, detail) answers in turn, the last one repeated."""
    calls = []

    def generate(url, served, key, timeout_s):
        status, detail = answers[min(len(calls), len(answers) - 1)]
        calls.append(timeout_s)
        return Probe(url, status == 200, status, detail)

    generate.calls = calls
    return generate


def test_a_server_that_lists_its_model_but_cannot_generate_ends_the_launch(tmp_path):
    clock, step = Clock(), Step()
    live: list[float] = []
    generate = completions((500, "HTTP 500: EngineCore encountered an issue"))
    sup = supervisor(tmp_path, clock, step, probe_ok=lambda url: True, live=live, generate=generate)
    started(tmp_path, 0), started(tmp_path, 1)
    with pytest.raises(LaunchFailure) as err:
        sup.run()
    assert str(err.value) == ("rank 0 on n1 lists 's' but cannot generate: a one-token completion answered "
                              "HTTP 500: EngineCore encountered an issue")
    assert err.value.rank == 0 and live == [] and not sup.live


@pytest.mark.parametrize("first", [
    pytest.param((None, "no answer: timed out"), id="no-answer-yet"),
    pytest.param((503, "HTTP 503"), id="busy"),
    pytest.param((429, "HTTP 429"), id="too-many-requests"),
])
def test_live_waits_for_a_completion_and_asks_again_after_no_answer(tmp_path, first):
    clock, step = Clock(), Step()
    live: list[float] = []
    generate = completions(first, first, (200, "ok"))
    sup = supervisor(tmp_path, clock, step, probe_ok=lambda url: True, live=live, generate=generate)
    started(tmp_path, 0), started(tmp_path, 1)
    clock.at(10, lambda: (_ for _ in ()).throw(Stop()))
    with pytest.raises(Stop):
        sup.run()
    assert len(generate.calls) == 3 and len(live) == 1 and sup.live


def test_a_completion_that_never_answers_ends_at_the_readiness_budget_saying_so(tmp_path):
    clock, step = Clock(), Step()
    generate = completions((None, "no answer: timed out"))
    sup = supervisor(tmp_path, clock, step, probe_ok=lambda url: True, budget=6, generate=generate)
    started(tmp_path, 0), started(tmp_path, 1)
    with pytest.raises(LaunchFailure) as err:
        sup.run()
    assert str(err.value).startswith("endpoint not live after 6s (readiness budget): 0 of 1 answered; last probe of "
                                     "rank 0: lists 's'; a one-token completion: no answer: timed out")
    assert all(t <= 6 for t in generate.calls)  # each completion is bounded by the budget left


def test_a_startup_whose_logs_stop_growing_ends_at_the_stall_window_naming_each_ranks_phase(tmp_path):
    clock, step = Clock(), Step()
    sup = supervisor(tmp_path, clock, step, budget=3600, STARTUP_STALL_S="20")
    started(tmp_path, 0), started(tmp_path, 1)
    clock.at(5, lambda: grow(tmp_path, 0, "[2026-12-03 10:00:00 TP0] Load weight begin. avail mem=120.00 GB"))
    clock.at(8, lambda: grow(tmp_path, 1, "rank 1 waits for its peers"))
    with pytest.raises(LaunchFailure) as err:
        sup.run()
    assert str(err.value) == ("startup stalled: no rank's log grew for 20s (STARTUP_STALL_S) before the endpoint was "
                              "live: rank 0 (loading weights): [2026-12-03 10:00:00 TP0] Load weight begin. avail "
                              "mem=120.00 GB; rank 1 (started): rank 1 waits for its peers")
    assert 28 <= clock.t - 1000 <= 28 + 2 * POLL_S  # 20 s after the last growth, not after the start


def test_logs_that_keep_growing_are_no_stall(tmp_path):
    clock, step = Clock(), Step()
    sup = supervisor(tmp_path, clock, step, budget=3600, STARTUP_STALL_S="20")
    started(tmp_path, 0), started(tmp_path, 1)
    for t in range(10, 200, 15):
        clock.at(t, lambda t=t: grow(tmp_path, t % 2, f"progress {t}"))
    clock.at(200, lambda: (_ for _ in ()).throw(Stop()))
    with pytest.raises(Stop):
        sup.run()


def test_stall_detector_off_with_zero(tmp_path):
    clock, step = Clock(), Step()
    sup = supervisor(tmp_path, clock, step, budget=3600, STARTUP_STALL_S="0")
    started(tmp_path, 0), started(tmp_path, 1)
    clock.at(1000, lambda: (_ for _ in ()).throw(Stop()))
    with pytest.raises(Stop):
        sup.run()


@pytest.mark.parametrize("value", ["15m", "-1", "1.5"])
def test_a_stall_window_that_is_not_whole_seconds_stops_the_launch_naming_the_key(tmp_path, value):
    with pytest.raises(KeyValueError, match=rf"^STARTUP_STALL_S: must be a whole number of seconds, got '{re.escape(value)}'; hint"):
        prepare({**PIPELINE, "STARTUP_STALL_S": value}, alloc(tmp_path, ifaces={"hsn0": "1.2.3.4"}))


def test_the_step_ending_before_the_ranks_started_is_named(tmp_path):
    clock, step = Clock(), Step()
    sup = supervisor(tmp_path, clock, step)
    started(tmp_path, 0)
    clock.at(2, lambda: setattr(step, "code", 1))
    with pytest.raises(LaunchFailure, match=r"srun step exited with code 1 before all ranks started \(1 of 2\)"):
        sup.run()


def test_a_rank_exit_after_live_says_after(tmp_path):
    clock, step = Clock(), Step()
    sup = supervisor(tmp_path, clock, step, probe_ok=lambda url: True)
    started(tmp_path, 0), started(tmp_path, 1)
    clock.at(10, lambda: exited(tmp_path, 0, 9, 10.0))
    with pytest.raises(LaunchFailure, match="rank 0 on n1 exited with code 9 after the endpoint was live"):
        sup.run()
    assert sup.live


def test_ranks_that_all_ended_on_a_signal_to_the_step_are_a_signalled_end_not_a_failure(tmp_path):
    # scancel --signal=TERM JOB: every rank's script wrote the signal before passing it on; the end used to
    # read "rank 0 on n1 exited with code 0 after the endpoint was live", a failure
    from envlayers.errors import StepSignalled

    clock, step = Clock(), Step()
    sup = supervisor(tmp_path, clock, step, probe_ok=lambda url: True)
    started(tmp_path, 0), started(tmp_path, 1)
    for rank in (0, 1):
        (tmp_path / f"rank-{rank}.signal").write_text("TERM\n")
    clock.at(10, lambda: exited(tmp_path, 0, 0, 10.0))
    clock.at(10.2, lambda: exited(tmp_path, 1, 143, 10.2))
    with pytest.raises(StepSignalled) as err:
        sup.run()
    assert (err.value.signum, err.value.live) == (15, True)
    assert str(err.value) == ("the server step received SIGTERM after the endpoint was live (scancel --signal, or "
                              "Slurm); the ranks stopped (rank 0 code 0, rank 1 code 143)")


def test_a_rank_that_failed_on_its_own_is_blamed_though_srun_then_signalled_the_others(tmp_path):
    clock, step = Clock(), Step()
    sup = supervisor(tmp_path, clock, step, probe_ok=lambda url: True)
    started(tmp_path, 0), started(tmp_path, 1)
    (tmp_path / "rank-0.signal").write_text("TERM\n")  # srun stopped rank 0 after rank 1 failed
    clock.at(10, lambda: exited(tmp_path, 1, 3, 10.0))
    clock.at(10.2, lambda: exited(tmp_path, 0, 143, 10.2))
    with pytest.raises(LaunchFailure, match="rank 1 on n2 exited with code 3 after the endpoint was live"):
        sup.run()


# --------------------------------------------------------------------------- the launcher's end


def run_main(tmp_path: Path, body: str, environ: dict | None = None) -> subprocess.CompletedProcess:
    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    script = ("import os, signal, sys, time\nfrom pathlib import Path\nfrom envlayers.launch import launcher\n"
              "from envlayers.launch.prepare import LaunchFailure\n"
              f"def run(self):\n{body}\n"
              "launcher.Launcher.run = run\n"
              f"raise SystemExit(launcher.main(Path('run'), {environ or {}!r}))\n")
    return subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=30)


def test_a_terminated_launcher_still_runs_the_core_guard_and_records_its_end(tmp_path):
    # scancel or the time limit is how a serving job ends: the guard must run then too
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "core-limit.txt").write_text("rank=0 limit=unlimited\n")
    proc = run_main(tmp_path, "    os.kill(os.getpid(), signal.SIGTERM); time.sleep(5)", {"SLURM_RESTART_COUNT": "3"})
    assert "ENVLAYERS-STAGE: received signal 15; stopping the ranks" in proc.stdout
    assert "ENVLAYERS-ERROR: rank 0 ran with core limit unlimited" in proc.stdout
    assert proc.returncode == 1
    end = json.loads((tmp_path / "run" / "launch-end.json").read_text())
    assert end["restart"] == 3 and end["code"] == 1
    assert end["reason"] == "signal 15 before the endpoint was live; a rank ran with a core limit that is not 0"


def test_a_signal_to_the_step_is_recorded_as_that_signal(tmp_path):
    proc = run_main(tmp_path, "    from envlayers.errors import StepSignalled\n"
                              "    raise StepSignalled('the server step received SIGTERM', signum=15, live=True)")
    assert proc.returncode == 143, proc.stdout + proc.stderr
    assert "ENVLAYERS-STAGE: the server step received SIGTERM; ending job" in proc.stdout
    assert "ENVLAYERS-ERROR" not in proc.stdout
    end = json.loads((tmp_path / "run" / "launch-end.json").read_text())
    assert (end["code"], end["reason"]) == (143, "live then signal 15 to the server step")


def test_a_failed_launch_records_the_reason_and_code(tmp_path):
    proc = run_main(tmp_path, "    raise LaunchFailure('rank 1 on n2 exited with code 137 before the endpoint was live')")
    assert proc.returncode == 1
    end = json.loads((tmp_path / "run" / "launch-end.json").read_text())
    assert end == {"restart": 0, "code": 1, "reason": "rank 1 on n2 exited with code 137 before the endpoint was live",
                   "ended_at": end["ended_at"]}
    assert abs(end["ended_at"] - __import__("time").time()) < 60


def test_a_bad_launch_key_in_the_job_is_an_error_line_naming_the_key_not_a_launcher_crash(tmp_path):
    proc = run_main(tmp_path, "    from envlayers.launch.health import health_settings\n"
                              "    health_settings({'HEALTH_FAIL_AFTER_S': '5m'})")
    assert proc.returncode == 1
    assert "ENVLAYERS-ERROR: HEALTH_FAIL_AFTER_S: must be a whole number of seconds, got '5m'; hint: " in proc.stdout
    assert "launcher failed" not in proc.stdout


def test_a_failed_launch_quotes_each_ranks_root_cause_from_far_up_its_log(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    cause = "ValueError: Unsupported CPU attention configuration: head_dim=16"
    (run / "server-0.log").write_text("ENVLAYERS-STAGE: rank 0 up on n1\nINFO starting\n")
    (run / "server-1.log").write_text("\n".join(
        ["ENVLAYERS-STAGE: rank 1 up on n2", f"(EngineCore pid=7) ERROR 12-03 10:00:00 [core.py:1] {cause}",
         *[f"  File \"x.py\", line {i}, in f" for i in range(90)],
         "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"]) + "\n")
    proc = run_main(tmp_path, "    self.lp = type('LaunchPlan', (), {'ranks': 2})()\n"
                              "    raise LaunchFailure('rank 1 on n2 exited with code 1 before the endpoint was live', rank=1)")
    out = proc.stdout
    assert proc.returncode == 1
    said = f"ENVLAYERS-ERROR: rank 1 engine said: {cause}\n"
    assert said in out and out.index(said) < out.index("ENVLAYERS-ERROR: last 20 lines of")
    assert "rank 0 engine said" not in out  # its log holds no error line


def test_a_launcher_killed_by_sigkill_leaves_no_end_record(tmp_path):
    proc = run_main(tmp_path, "    os.kill(os.getpid(), signal.SIGKILL)")
    assert proc.returncode == -9
    assert not (tmp_path / "run" / "launch-end.json").exists()


# --------------------------------------------------------------------------- the endpoint block


def test_the_printed_curl_works_as_pasted_and_never_shows_the_key(tmp_path):
    key_file = tmp_path / "my key's file"
    key_file.write_text("s3cret-k\n")
    ep = add_usage(EndpointRecord("7", "m", "M", "vllm", "single", ["http://n1:8000/v1"], True, "/r",
                                  key_file=str(key_file)))
    assert "s3cret" not in block(ep) and "s3cret" not in rundir.json_text(ep.to_dict())
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "curl").write_text("#!/bin/bash\nprintf '%s\\n' \"$@\"\n")
    (bin_dir / "curl").chmod(0o755)
    printed = block(ep).split("try (curl):\n", 1)[1].splitlines()[0].strip()
    out = subprocess.run(["bash", "-c", printed], env={"PATH": f"{bin_dir}:{os.environ['PATH']}"},
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert "Authorization: Bearer s3cret-k" in out
    assert EndpointRecord.from_dict(json.loads(rundir.json_text(ep.to_dict()))).to_dict()["key_file"] == str(key_file)


def test_core_guard_reports_a_core_file_in_the_working_directory(tmp_path, capsys):
    run_dir, workdir = tmp_path / "run", tmp_path / "work"
    run_dir.mkdir()
    workdir.mkdir()
    (workdir / "core.1234").write_bytes(b"\x7fELF")
    assert core_guard(run_dir, workdir) is True  # a core is reported; only a limit that is not 0 fails
    assert "ENVLAYERS-WARN: core file left: " in capsys.readouterr().out


# --------------------------------------------------------------------------- a requeued job starts clean


def requeue_block(tmp_path: Path) -> str:
    """The job script's block that files an earlier run away, cut from a real rendered job."""
    from envlayers.jobscript import prepare as prepare_job

    mine = tmp_path / "mine.env"
    mine.write_text("CONTAINER_RUNTIME=none\n")
    script = prepare_job(Path(__file__).resolve().parents[1], "qwen38", env_file=mine, python="python3").script
    last = "unset ENVLAYERS_PREV ENVLAYERS_F ENVLAYERS_N\n"
    start = script.index("envlayers_unwritable() {\n")
    return "set -euo pipefail\n" + script[start:script.index(last) + len(last)]


def files_under(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


@pytest.mark.parametrize("before, after, said", [
    pytest.param([], [], None, id="first-run-nothing-to-move"),
    pytest.param(["rank-0.exit", "server-0.log", ".endpoint.json.x.tmp", "cache/"],
                 ["run-0", "run-0/.endpoint.json.x.tmp", "run-0/cache", "run-0/rank-0.exit", "run-0/server-0.log"],
                 "run-0", id="earlier-files-into-run-0"),
    pytest.param(["run-0/rank-0.exit", "rank-0.exit", "run-x/"],
                 ["run-0", "run-0/rank-0.exit", "run-1", "run-1/rank-0.exit", "run-1/run-x"], "run-1",
                 id="second-restart-into-run-1"),
    pytest.param(["run-0/launch.json", "run-2/launch.json", "serve.env"],
                 ["run-0", "run-0/launch.json", "run-1", "run-1/serve.env", "run-2", "run-2/launch.json"], "run-1",
                 id="first-free-number"),
    pytest.param(["run-0/launch.json"], ["run-0", "run-0/launch.json"], None, id="only-earlier-runs"),
])
def test_a_requeued_job_files_the_earlier_run_away(tmp_path, before, after, said):
    run_dir = tmp_path / "7"
    for entry in before:
        path = run_dir / entry
        if entry.endswith("/"):
            path.mkdir(parents=True, exist_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("old\n")
    proc = subprocess.run(["bash", "-c", requeue_block(tmp_path)], capture_output=True, text=True, timeout=10,
                          env={"PATH": os.environ["PATH"], "RUN_DIR": str(run_dir), "SLURM_JOB_ID": "7",
                               "SLURM_RESTART_COUNT": "1"})
    assert proc.returncode == 0, proc.stderr
    assert files_under(run_dir) == after
    if said:
        assert proc.stdout == (f"ENVLAYERS-STAGE: restart 1 of job 7 (requeued by Slurm); the previous run's files "
                               f"are in {run_dir}/{said}\n")
    else:
        assert proc.stdout == ""


def test_the_dry_run_prints_the_srun_line_the_job_runs(tmp_path):
    from envlayers.jobscript import prepare as prepare_job

    mine = tmp_path / "mine.env"
    mine.write_text("CONTAINER_RUNTIME=none\nINFERENCE_NODES=2\nPIPELINE_PARALLEL_SIZE=2\n")
    job = prepare_job(Path(__file__).resolve().parents[1], "glm53", env_file=mine, python="/usr/bin/python3")
    lines = job.dry_run_text().splitlines()
    assert lines[-1] == ('#   srun --nodes=2 --ntasks=2 --ntasks-per-node=1 "--cpus-per-task=${SLURM_CPUS_ON_NODE}" '
                         '--kill-on-bad-exit=1 bash "${RUN_DIR}/ranks.sh"')


# --------------------------------------------------------------------------- a run folder the job cannot write


@pytest.mark.parametrize("root, limit_kb, said, doing", [
    pytest.param("file/under", "", "Not a directory", "creating it", id="cannot-create-the-folder"),
    pytest.param("runs", "1", "File too large", "writing serve.env", id="a-write-the-os-refuses"),
])
def test_a_run_folder_the_job_cannot_write_ends_it_in_one_line_with_no_half_written_file(tmp_path, root, limit_kb,
                                                                                          said, doing):
    # the OS refuses for real: a path through a regular file, or a file-size limit (ulimit -f, SIGXFSZ
    # ignored) that a write of serve.env passes; a full or read-only file system is the lab test's
    (tmp_path / "file").write_text("")
    block = run_dir_block(tmp_path)
    env = {"PATH": os.environ["PATH"], "RUN_ROOT": str(tmp_path / root), "SLURM_JOB_ID": "7", "LIMIT_KB": limit_kb,
           "ENVLAYERS_SERVE_ENV": "X=1\n" * 2000}
    proc = subprocess.run(["bash", str(block)], capture_output=True, text=True, timeout=10, env=env)
    run_dir = tmp_path / root / "7"
    assert proc.returncode == 1 and proc.stderr == "", proc.stderr
    assert proc.stdout == (f"ENVLAYERS-ERROR: cannot write the run directory {run_dir}: {said} ({doing}); the job "
                           "ends before any rank starts: free space there, or point SCRATCH (or RUN_ROOT) at a "
                           "writable file system\n")
    assert not run_dir.is_dir() or list(run_dir.iterdir()) == []  # no empty serve.env, no temp file


def test_a_variable_longer_than_linux_takes_ends_the_job_naming_it_not_the_disk(tmp_path):
    # before: "Argument list too long (creating it) ... free space there": E2BIG is no full disk. The login
    # node refuses such a layer value; a value the job makes itself still lands here
    block = run_dir_block(tmp_path)
    block.write_text("BIG=$(head -c 131070 /dev/zero | tr '\\0' x); FIT=${BIG:3}; export BIG FIT\n"
                     + block.read_text())
    env = {"PATH": os.environ["PATH"], "RUN_ROOT": str(tmp_path / "runs"), "SLURM_JOB_ID": "7",
           "ENVLAYERS_SERVE_ENV": "X=1\n"}
    proc = subprocess.run(["bash", str(block)], capture_output=True, text=True, timeout=10, env=env)
    run_dir = tmp_path / "runs" / "7"
    assert proc.returncode == 1 and proc.stderr == "", proc.stderr
    # BIG=<131070 x> and its NUL are 131075 bytes, over; FIT=<131067 x> and its NUL are 131072: Linux takes it
    assert proc.stdout == (f"ENVLAYERS-ERROR: cannot prepare the run directory {run_dir} (creating it): Argument list "
                           "too long: the job's environment has a variable longer than the 131072 bytes Linux takes "
                           "for one (BIG), so no program starts; the job ends before any rank starts: keep long "
                           "values in a file and name the file in the layer\n")


def test_a_writable_run_folder_gets_serve_env_and_job_sh_whole(tmp_path):
    block = run_dir_block(tmp_path)
    env = {"PATH": os.environ["PATH"], "RUN_ROOT": str(tmp_path / "runs"), "SLURM_JOB_ID": "7",
           "ENVLAYERS_SERVE_ENV": "X=1\n" * 2000}
    proc = subprocess.run(["bash", str(block)], capture_output=True, text=True, timeout=10, env=env)
    run_dir = tmp_path / "runs" / "7"
    assert proc.returncode == 0 and proc.stdout == f"ENVLAYERS-STAGE: run_dir={run_dir}\n", proc.stderr
    assert sorted(p.name for p in run_dir.iterdir()) == ["job.sh", "serve.env"]
    assert (run_dir / "serve.env").read_text() == "# site: mi300a\n" + "X=1\n" * 2000  # the catalog's default site
    assert (run_dir / "job.sh").read_text() == block.read_text()


@pytest.mark.parametrize("blocked", ["ranks.sh", "launch.json", "api-key"])
def test_a_file_the_launcher_cannot_write_before_srun_ends_the_launch_naming_it(tmp_path, monkeypatch, blocked):
    # the OS refuses the write for real: the file's name is taken by a folder that is not empty
    from envlayers.launch import launcher

    (tmp_path / blocked).mkdir()
    (tmp_path / blocked / "x").write_text("")
    started = []
    monkeypatch.setattr(launcher, "allocation", lambda run_dir, environ: alloc(run_dir, nodes=(N1,)))
    monkeypatch.setattr(launcher.Launcher, "start", lambda self, lp, key: started.append(lp))
    keys = {**SINGLE_VLLM, "SERVER_API_KEY_FILE": "generate"}
    launch = launcher.Launcher(tmp_path, {**keys, "ENVLAYERS_KEYS": " ".join(keys), "SLURM_JOB_ID": "42"})
    with pytest.raises(LaunchFailure) as err:
        launch.run()
    assert str(err.value) == (f"cannot write the run directory {tmp_path}: Is a directory (writing {blocked}); the "
                              "job ends before any rank starts: free space there, or point SCRATCH (or RUN_ROOT) at "
                              "a writable file system")
    assert started == []  # no srun
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_an_endpoint_record_the_os_refuses_at_live_is_said_and_the_endpoint_is_still_announced(tmp_path, capsys):
    # a full file system at the moment of live must not end a serving job: the block still goes to the job
    # output (wait and status read it there), and the refused write is said once
    from envlayers.launch import launcher

    (tmp_path / "endpoint.json").mkdir()
    (tmp_path / "endpoint.json" / "x").write_text("")
    lp = prepare(SINGLE_VLLM, alloc(tmp_path, nodes=(N1,)))
    launch = launcher.Launcher(tmp_path, {})
    launch.on_live(lp, 3.0)
    out = capsys.readouterr().out
    assert out.startswith(f"ENVLAYERS-WARN: cannot write {tmp_path}/endpoint.json: Is a directory; the job goes on "
                          "without this record")
    assert "ENVLAYERS-STAGE: endpoint live after 3.0s\n===== endpoint is live =====\n" in out
    assert rundir.parse_job_output(out).live


# --------------------------------------------------------------------------- SERVER_HOST on loopback


@pytest.mark.parametrize("keys, nodes", [
    pytest.param(SINGLE_VLLM, (N1,), id="single"),
    pytest.param(PIPELINE, (N1, N2), id="pipeline-api-on-node-0"),
])
def test_a_loopback_server_is_probed_and_printed_on_node_0s_loopback(tmp_path, keys, nodes):
    lp = prepare({**keys, "SERVER_HOST": "127.0.0.1"}, alloc(tmp_path, nodes=nodes))
    assert [(t.url, t.probe_url, t.address) for t in lp.targets] == [
        ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1", "127.0.0.1")]
    assert lp.node_local and "--host 127.0.0.1" in " ".join(lp.commands[0].argv)


def test_loopback_replicas_on_two_nodes_stop_before_srun(tmp_path):
    with pytest.raises(LaunchFailure, match=r"binds loopback only \(SERVER_HOST=127.0.0.1\), but this shape serves on "
                                            r"1 node\(s\) besides the first"):
        prepare({**SINGLE_VLLM, "INFERENCE_NODES": "2", "INFERENCE_MODE": "replicas", "SERVER_HOST": "127.0.0.1"},
                alloc(tmp_path))


def test_the_block_of_a_loopback_endpoint_says_where_it_is_reached_and_the_tunnel_command():
    ep = EndpointRecord("42", "q", "Qwen/Qwen3-8B", "vllm", "single", ["http://127.0.0.1:8000/v1"], True, "/r",
                  nodes=["n1"], key_file="/r/api-key", node_local=True)
    assert ("reach: on n1 only (SERVER_HOST binds loopback); from elsewhere open a tunnel: env_layers tunnel 42 "
            "(docs/access.md)") in block(ep).splitlines()
    assert EndpointRecord.from_dict(add_usage(ep).to_dict()).node_local
    assert "reach:" not in block(EndpointRecord("42", "q", "m", "vllm", "single", ["http://n1:8000/v1"], True, "/r"))


@pytest.mark.parametrize("key", [None, "k3y-masked"], ids=["keyless", "masked"])
def test_a_term_to_the_whole_step_keeps_the_engines_last_lines_and_its_code(tmp_path, key):
    # scancel --signal=TERM signals every process of the step, the log-masking reader among them: it used to
    # die first, the rank then died of SIGPIPE (recorded as 141) and the engine's shutdown lines were lost
    engine = tmp_path / "engine.py"
    engine.write_text("import signal, sys, time\n"
                      "def bye(*_):\n"
                      "    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once is enough, as for the engines\n"
                      "    for i in range(50):\n"
                      "        print(f'shutting down {i}', flush=True)\n"
                      "    sys.exit(0)\n"
                      "signal.signal(signal.SIGTERM, bye)\n"
                      "print('ready', flush=True)\n"
                      "while True:\n"
                      "    time.sleep(1)\n")
    cmd = engines.RankCommand((sys.executable, str(engine)), key_env="K" if key else None)
    (tmp_path / "ranks.sh").write_text(rank_script([cmd], tmp_path))
    env = {"SLURM_PROCID": "0", "PATH": os.environ["PATH"], **({"SERVER_API_KEY": key} if key else {})}
    proc = subprocess.Popen(["bash", str(tmp_path / "ranks.sh")], env=env, cwd=tmp_path, start_new_session=True)
    log = tmp_path / "server-0.log"
    try:
        while "ready" not in (log.read_text() if log.exists() else ""):  # the event, not a clock
            assert proc.poll() is None, log.read_text() if log.exists() else "no log"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGTERM)
        code = proc.wait(60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = log.read_text()
    assert code == 0 and (tmp_path / "rank-0.exit").read_text() == "0\n", text
    assert "shutting down 49" in text and "ENVLAYERS-STAGE: rank 0 exited with code 0 after SIGTERM\n" in text
    assert (tmp_path / "rank-0.signal").read_text() == "TERM\n"  # the launcher records the end as the signal


def test_a_rank_number_the_job_inherited_does_not_reach_the_ranks(tmp_path):
    # ranks.sh takes ENVLAYERS_RANK before SLURM_PROCID; only the launcher sets it (one step per replica). One
    # exported in the shell that submitted the job must not make every node run the same rank.
    from envlayers.launch.launcher import Launcher

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    seen = tmp_path / "seen"
    srun = bin_dir / "srun"
    srun.write_text(f"#!/bin/bash\necho \"${{ENVLAYERS_RANK-unset}}\" > {shlex.quote(str(seen))}\n")
    srun.chmod(0o755)
    lp = prepare({**PIPELINE}, alloc(tmp_path))
    launcher = Launcher(tmp_path, {"PATH": f"{bin_dir}:/usr/bin:/bin", "ENVLAYERS_RANK": "0"})
    launcher.start(lp, None)
    assert launcher.proc.wait(timeout=30) == 0
    assert seen.read_text() == "unset\n"
