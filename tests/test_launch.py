"""The in-job launcher's pure parts: the srun line, ranks.sh, the launch keys, the core guard."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from envlayers import engines, topology
from envlayers.launch import Launch, core_guard, launch_keys, rank_script

PIPELINE = {"INFERENCE_ENGINE": "sglang", "INFERENCE_MODEL": "zai-org/GLM-5.3", "VLLM_SERVED_MODEL": "s",
            "INFERENCE_NODES": "2", "PIPELINE_PARALLEL_SIZE": "2", "NCCL_NET_GDR_LEVEL": "LOC"}


def launch_for(tmp_path: Path, **environ: str) -> Launch:
    launch = Launch(tmp_path, {"SLURM_CPUS_ON_NODE": "192", **environ})
    launch.plan = topology.plan(PIPELINE)
    return launch


@pytest.mark.parametrize("edf, want", [
    ("hpcagent-bench-sglang-mi300-latest", ["--environment=hpcagent-bench-sglang-mi300-latest"]),
    ("", []),
], ids=["container-engine", "runtime-none"])
def test_srun_line_has_one_task_per_node_every_cpu_and_the_edf(tmp_path, edf, want):
    argv = launch_for(tmp_path, ENVLAYERS_EDF=edf).srun_argv()
    assert argv == ["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--cpus-per-task=192",
                    "--kill-on-bad-exit=1", *want, "bash", str(tmp_path / "ranks.sh")]


def test_ranks_script_is_bash_with_one_arm_per_rank_and_no_core_dumps(tmp_path):
    plan = topology.plan(PIPELINE)
    text = rank_script(engines.build_commands(plan, PIPELINE, "n1"), tmp_path)
    assert subprocess.run(["bash", "-n"], input=text, text=True, capture_output=True).returncode == 0
    assert "ulimit -c 0" in text.splitlines()
    assert "  0) export NCCL_NET_GDR_LEVEL=LOC; set -- python3 -m sglang.launch_server" in text
    assert "--node-rank 1 --dist-init-addr n1:29500" in text


def test_ranks_script_runs_the_rank_and_records_its_exit_code(tmp_path):
    fake = engines.RankCommand(argv=("bash", "-c", "echo serving; exit 7"), env={"X": "1"})
    (tmp_path / "ranks.sh").write_text(rank_script([fake], tmp_path))
    proc = subprocess.run(["bash", str(tmp_path / "ranks.sh")], env={"SLURM_PROCID": "0", "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=10)
    assert proc.returncode == 7
    assert (tmp_path / "rank-0.exit").read_text() == "7\n"
    log = (tmp_path / "server-0.log").read_text().splitlines()
    assert log[0].startswith("ENVLAYERS-STAGE: rank 0 up on ") and log[1] == "serving"
    assert log[-1] == "ENVLAYERS-STAGE: rank 0 exited with code 7"
    assert (tmp_path / "core-limit.txt").read_text() == "rank=0 limit=0\n"


def test_launch_keys_are_the_merged_keys_only():
    environ = {"A": "1", "EMPTY": "", "SGLANG_ATTENTION_BACKEND": "triton", "ENVLAYERS_EDF": "x", "PATH": "/bin",
               "ENVLAYERS_KEYS": "A EMPTY"}
    assert launch_keys(environ) == {"A": "1", "EMPTY": "", "ENVLAYERS_EDF": "x", "ENVLAYERS_KEYS": "A EMPTY"}


@pytest.mark.parametrize("limits, ok", [("rank=0 limit=0\n", True), ("rank=0 limit=unlimited\n", False)],
                         ids=["zero", "unlimited"])
def test_core_guard_fails_on_a_core_limit_that_is_not_zero(tmp_path, limits, ok, capsys):
    (tmp_path / "core-limit.txt").write_text(limits)
    assert core_guard(tmp_path, tmp_path) is ok
    assert ("ENVLAYERS-ERROR: rank 0 ran with core limit unlimited" in capsys.readouterr().out) is (not ok)


def test_core_guard_reports_a_core_file_in_the_working_directory(tmp_path, capsys):
    run_dir, workdir = tmp_path / "run", tmp_path / "work"
    run_dir.mkdir()
    workdir.mkdir()
    (workdir / "core.1234").write_bytes(b"\x7fELF")
    assert core_guard(run_dir, workdir) is True  # a core is reported; only a limit that is not 0 fails
    assert "ENVLAYERS-WARN: core file left: " in capsys.readouterr().out


def test_a_terminated_launcher_still_runs_the_core_guard(tmp_path):
    # scancel or the time limit is how a serving job ends: the guard must run then too
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "core-limit.txt").write_text("rank=0 limit=unlimited\n")
    script = ("import os, signal, time\nfrom pathlib import Path\nfrom envlayers import launch\n"
              "launch.Launch.run = lambda self: (os.kill(os.getpid(), signal.SIGTERM), time.sleep(5))\n"
              "raise SystemExit(launch.main(Path('run'), {}))\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert "ENVLAYERS-STAGE: received signal 15; stopping the ranks" in proc.stdout
    assert "ENVLAYERS-ERROR: rank 0 ran with core limit unlimited" in proc.stdout
    assert proc.returncode == 1


def test_exported_launcher_knobs_from_the_login_shell_are_not_launch_keys():
    environ = {"ENVLAYERS_KEYS": "A", "A": "1", "ENVLAYERS_HSN_IFACE": "ib", "ENVLAYERS_EDF": "e"}
    assert launch_keys(environ) == {"A": "1", "ENVLAYERS_KEYS": "A", "ENVLAYERS_EDF": "e"}
