"""The tests' run-directory builder: a job's run directory with the record files a test names, the job's
Slurm output file that points the tools at it, a vLLM server log to put there, and the command line that
reads them (``invoke``)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from envlayers import readiness, rundir
from envlayers.cli import cli

VLLM_LOG = [  # a vLLM server's start-up, as server-0.log holds it
    "(EngineCore_DP0 pid=4242) INFO 12-02 10:00:01 [gpu_model_runner.py:2602] Starting to load model Qwen/Qwen3-8B...",
    "(EngineCore_DP0 pid=4242) INFO 12-02 10:00:09 [gpu_model_runner.py:2634] Model loading took 15.27 GiB and 7.9 s",
    "(EngineCore_DP0 pid=4242) INFO 12-02 10:00:12 [gpu_worker.py:298] Available KV cache memory: 24.0 GiB",
    "(EngineCore_DP0 pid=4242) INFO 12-02 10:00:12 [kv_cache_utils.py:1087] GPU KV cache size: 344,669 tokens",
    "(EngineCore_DP0 pid=4242) INFO 12-02 10:00:13 [gpu_model_runner.py:3480] Capturing CUDA graphs "
    "(mixed prefill-decode)",
    "(APIServer pid=4100) INFO:     Application startup complete.",
]


def write_run_dir(run_dir: Path, files: dict[str, str | dict | list]) -> Path:
    """``run_dir`` made (with its parents) holding ``files``: name -> text, or data written as JSON."""
    run_dir.mkdir(parents=True)
    _write(run_dir, files)
    return run_dir


def _write(run_dir: Path, files: dict[str, str | dict | list]) -> None:
    for name, body in files.items():
        (run_dir / name).write_text(body if isinstance(body, str) else json.dumps(body))


def make_job(tmp_path: Path, job_id: str, *, out_lines=(), log_lines=None, endpoint: dict | None = None,
             exits: dict | None = None, launch: dict | None = None) -> Path:
    """Job ``job_id`` as the launcher leaves it: its run directory under tmp_path/runs/inference-server (with
    server-0.log, endpoint.json, rank-N.exit and launch.json when given) and serve-only-<job>.out in tmp_path,
    whose first line names the run directory."""
    files: dict[str, str | dict] = {}
    if log_lines is not None:
        files["server-0.log"] = "\n".join(log_lines) + "\n"
    if endpoint is not None:
        files["endpoint.json"] = endpoint
    for rank, code in (exits or {}).items():
        files[f"rank-{rank}.exit"] = f"{code}\n"
    if launch is not None:
        files["launch.json"] = launch
    run_dir = tmp_path / "runs" / "inference-server" / job_id
    run_dir.mkdir(parents=True)
    (tmp_path / f"serve-only-{job_id}.out").write_text(
        "\n".join([f"ENVLAYERS-STAGE: run_dir={run_dir}", *out_lines]) + "\n")
    _write(run_dir, files)
    return run_dir


def endpoint_data(job_id: str, run_dir: Path, **extra) -> dict:
    """An endpoint.json of one vLLM server on n1, with usage, an address and a field from a later version."""
    ep = rundir.EndpointRecord(job_id=job_id, served_model_name="hpcagent-bench-vllm", model="Qwen/Qwen3-8B",
                               engine="vllm", shape="single", base_urls=["http://n1:8000/v1"],
                               api_key_required=False, run_dir=str(run_dir), startup_s=12.0, nodes=["n1"])
    data = readiness.add_usage(ep).to_dict()
    data.update(addresses=["127.0.0.1"], some_future_field={"x": 1}, **extra)
    return data


def invoke(*args):
    """``env_layers ARGS`` in process (click's runner), exceptions raised."""
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)
