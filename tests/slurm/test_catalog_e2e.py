"""A model that is only its layer file launches end to end on the local Slurm cluster.

A copy of the catalog gains ``experiments/layers/model-foo.env`` and nothing in setups.yaml; the operator
runs ``MODEL=foo cluster/serve-only.sbatch`` and ``env_layers wait``, exactly as for a catalog model. The
engine is the stand-in (tests/standin), which serves the real rendered vLLM command line.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SBATCH = REPO / "cluster" / "serve-only.sbatch"
STANDIN = REPO / "tests" / "standin"
FOO = """\
# foo: a layer-file-only model, vLLM on one node.

INFERENCE_ENGINE=vllm
CONTAINER_ROLE=vllm-mi300
INFERENCE_MODEL=example/foo-7b
TENSOR_PARALLEL_SIZE=4
"""

pytestmark = pytest.mark.slurm


def test_a_layer_file_only_model_launches_and_answers(netns_lab, tmp_path):
    root = tmp_path / "cat"
    shutil.copytree(REPO / "experiments", root / "experiments")
    shutil.copytree(REPO / "containers", root / "containers")
    (root / "experiments/layers/model-foo.env").write_text(FOO)
    assert "foo:" not in (root / "experiments/setups.yaml").read_text()
    (tmp_path / "mine.env").write_text("CONTAINER_RUNTIME=none\nSERVER_API_KEY_FILE=\nALLOW_PUBLIC_UNAUTHENTICATED=1\n")  # the lab serves keyless: acknowledged (docs/keys.md)
    env = {**os.environ, **netns_lab.env, "SCRATCH": str(tmp_path / "scratch"), "MODEL": "foo",
           "ENVLAYERS_ROOT": str(root), "SERVE_ENV_FILE": str(tmp_path / "mine.env"), "SERVE_TIME": "00:10:00",
           "STANDIN_LOAD_SECONDS": "1", "STANDIN_RECORD": str(tmp_path / "engines.jsonl"),
           "PATH": f"{STANDIN / 'bin'}:{netns_lab.env.get('PATH', os.environ['PATH'])}",
           "PYTHONPATH": os.pathsep.join([str(STANDIN / "pypath"), str(REPO / "src")])}
    for key in ("RUN_ROOT", "ENVLAYERS_RUN_ROOT", "EXPERIMENT", "SERVE_BASE_ENV"):
        env.pop(key, None)
    proc = subprocess.run([str(SBATCH), "--json"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    job_id = json.loads(proc.stdout)["job_id"]
    netns_lab._submitted.append(job_id)  # cancelled at teardown if the test fails midway

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "envlayers", *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)

    waited = cli("wait", job_id, "--timeout", "90", "--progress", "none")
    assert waited.returncode == 0, waited.stdout + waited.stderr
    assert "base URL: http://n1:8000/v1\n" in waited.stdout
    run_dir = tmp_path / "scratch" / "inference-server" / job_id
    assert json.loads((run_dir / "launch.json").read_text())["target"] == "experiment:foo"
    assert "export INFERENCE_MODEL='example/foo-7b'\n" in (run_dir / "serve.env").read_text()
    assert "#   experiments/layers/model-foo.env\n" in (run_dir / "job.sh").read_text()
    # the stand-in ran the rendered vLLM command for the layer file's model
    (engine,) = [json.loads(line) for line in (tmp_path / "engines.jsonl").read_text().splitlines()]
    assert "example/foo-7b" in engine["argv"] and "4" == engine["argv"][engine["argv"].index("--tensor-parallel-size") + 1]
    addr = netns_lab.nodes["n1"]
    models = subprocess.run(["curl", "-s", "-m", "5", f"http://{addr}:8000/v1/models"], capture_output=True,
                            text=True, timeout=10)
    assert json.loads(models.stdout)["data"][0]["id"] == "hpcagent-bench-vllm"
    stopped = cli("stop", job_id, "--json")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
