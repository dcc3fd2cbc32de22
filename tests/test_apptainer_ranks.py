"""CONTAINER_RUNTIME=apptainer in the job: ranks.sh as the launcher writes it, run by real bash against a
program named `apptainer` that records what it was given (Apptainer itself cannot be installed here).

What is held: the engine's argv follows `apptainer exec --cleanenv --nv --bind ... SIF` unchanged; every
value reaches the container by name through APPTAINERENV_<NAME>, the API key among them, never on a
command line; a SIF the node cannot read ends the rank in one line naming the pull command.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from envlayers import engines, topology
from envlayers.launch.ranks import rank_script
from envlayers.runtimes import apptainer

RECORDER = """#!/usr/bin/env python3
import json, os, sys
with open(os.environ["RECORD_TO"], "w") as fh:
    json.dump({"argv": sys.argv[1:], "env": {k: v for k, v in os.environ.items() if k.startswith("APPTAINERENV_")}}, fh)
"""

KEYS = {"INFERENCE_ENGINE": "vllm", "INFERENCE_MODEL": "/models/tiny", "VLLM_SERVED_MODEL": "tiny",
        "SERVER_HOST": "0.0.0.0", "SERVER_PORT": "8000", "GPUS_PER_NODE": "8", "TENSOR_PARALLEL_SIZE": "8",
        "HF_HOME": "/scratch/hf", "CONTAINER_RUNTIME": "apptainer", "GPU_VENDOR": "nvidia",
        "NCCL_NET_GDR_LEVEL": "PHB"}


def _run_rank(tmp_path: Path, sif: Path, key: str = "s3cret-key'\"") -> tuple[int, dict | None, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "apptainer").write_text(RECORDER)
    (bin_dir / "apptainer").chmod(0o755)
    keys = {**KEYS, "ENVLAYERS_IMAGE": str(sif), "ENVLAYERS_GPU_DEVICES": "--nv",
            "ENVLAYERS_KEYS": " ".join(KEYS)}
    plan = topology.plan(keys)
    commands = engines.build_commands(plan, {**keys, "SERVER_API_KEY": "${SERVER_API_KEY}"}, "127.0.0.1")
    wrappers, lines = apptainer.rank_wrappers({**keys, **{k: keys[k] for k in KEYS}}, plan, commands)
    script = tmp_path / "ranks.sh"
    script.write_text(rank_script(commands, tmp_path, wrappers))
    record = tmp_path / "record.json"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_PROCID": "0", "RECORD_TO": str(record),
           "SERVER_API_KEY": key, **{k: v for k, v in KEYS.items()}}
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=120)
    log = (tmp_path / "server-0.log").read_text() if (tmp_path / "server-0.log").exists() else ""
    assert lines and "runs in apptainer" in lines[0]
    return proc.returncode, json.loads(record.read_text()) if record.exists() else None, log


def test_the_engine_runs_in_apptainer_exec_with_values_by_name(tmp_path):
    sif = tmp_path / "vllm.sif"
    sif.write_bytes(b"SIF")
    key = "s3cret-key'\""
    code, rec, log = _run_rank(tmp_path, sif, key)
    assert code == 0, log
    argv = rec["argv"]
    assert argv[:3] == ["exec", "--cleanenv", "--nv"]
    assert argv[3:5] == ["--bind", "/scratch/hf:/scratch/hf:ro"]
    i = argv.index(str(sif))
    assert argv[i + 1:i + 3] == ["vllm", "serve"] and "--tensor-parallel-size" in argv
    assert not any(key in word for word in argv), "the key is on a command line"
    assert rec["env"]["APPTAINERENV_VLLM_API_KEY"] == key
    assert rec["env"]["APPTAINERENV_NCCL_NET_GDR_LEVEL"] == "PHB"
    assert rec["env"]["APPTAINERENV_HF_HOME"] == "/scratch/hf"
    assert "APPTAINERENV_PATH" not in rec["env"] and "APPTAINERENV_SERVER_API_KEY" not in rec["env"]
    assert key not in log


def test_a_sif_the_node_cannot_read_ends_the_rank_in_one_line(tmp_path):
    code, rec, log = _run_rank(tmp_path, tmp_path / "missing.sif")
    assert code == 2 and rec is None
    errors = [line for line in log.splitlines() if line.startswith("ENVLAYERS-ERROR")]
    assert len(errors) == 1 and "cannot read" in errors[0] and "missing.sif" in errors[0], log
    assert (tmp_path / "rank-0.exit").read_text().strip() == "2"


def test_the_rendered_exec_line_is_apptainers_own_grammar(tmp_path):
    defs = pytest.importorskip("envlayers.runtimes.definitions")
    s = apptainer.Settings("apptainer", "/s/x.sif", "--nv")
    argv = apptainer.run_argv(s, {"HF_HOME": "/scratch/hf", "CONTAINER_MOUNTS": "/a:/b"})
    assert defs.apptainer_problems(argv + ["vllm", "serve", "m"]) == []
    assert apptainer.ENV_PREFIXES == {p: defs.env_prefix(p) for p in ("apptainer", "singularity")}
    for flag in ("--nv", "--rocm"):
        argv = apptainer.run_argv(apptainer.Settings("apptainer", "/s/x.sif", flag), {})
        assert defs.apptainer_problems(argv + ["true"]) == []
