"""A model from its layer file alone: experiments/layers/model-<MODEL>.env is a model without a setups.yaml entry.

Every test works on a copy of the catalog with a new file model-foo.env and no entry for it, through the
commands an operator runs: render, plan, serve --dry-run (through cluster/serve-only.sbatch), list, check.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from envlayers import catalog
from envlayers.cli import cli

REPO = Path(__file__).resolve().parents[1]
FOO = """\
# foo: a small test model on one MI300A node, vLLM.

# vLLM, from the host's PATH in these tests.
INFERENCE_ENGINE=vllm
CONTAINER_ROLE=vllm-mi300
INFERENCE_MODEL=example/foo-7b
TENSOR_PARALLEL_SIZE=4
"""


@pytest.fixture
def root(tmp_path):
    dst = tmp_path / "cat"
    shutil.copytree(REPO / "experiments", dst / "experiments")
    shutil.copytree(REPO / "containers", dst / "containers")
    (dst / "experiments/layers/model-foo.env").write_text(FOO)
    return dst


def run(root, *args):
    return CliRunner().invoke(cli, ["--root", str(root), *args])


def test_a_layer_file_alone_renders_with_the_stack_of_a_setups_model(root):
    result = run(root, "render", "experiment:foo", "--format", "json")
    assert result.exit_code == 0, result.output
    env = json.loads(result.output)
    assert (env["INFERENCE_MODEL"], env["INFERENCE_ENGINE"], env["TENSOR_PARALLEL_SIZE"]) == \
        ("example/foo-7b", "vllm", "4")
    assert env["VLLM_SERVED_MODEL"] == "hpcagent-bench-vllm"  # common.env, below it
    # the experiment's layers still come first: replicas.env is under the model
    replicas = json.loads(run(root, "render", "replicas:foo", "--format", "json").output)
    assert replicas["INFERENCE_MODE"] == "replicas"
    explained = run(root, "explain", "experiment:foo", "INFERENCE_MODEL").output
    assert explained == "INFERENCE_MODEL='example/foo-7b'  experiments/layers/model-foo.env:6\n"


def test_a_layer_file_alone_plans(root):
    result = run(root, "plan", "--model", "foo")
    assert result.exit_code == 0, result.output
    assert "\nENVLAYERS-TOPOLOGY: shape=single nodes=1 gpus_per_node=4 tp=4 pp=1" in "\n" + result.output
    assert "vllm serve example/foo-7b" in result.output


def test_a_layer_file_alone_dry_runs_through_the_wrapper(root, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("MODEL", "EXPERIMENT", "SERVE_ENV_FILE")}
    env.update(ENVLAYERS_ROOT=str(root), MODEL="foo", SUBMIT="0", EDF_PATH=str(tmp_path / "edf"),
               PYTHONPATH=str(REPO / "src"))
    proc = subprocess.run([str(REPO / "cluster/serve-only.sbatch")], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "# target experiment:foo on site mi300a: shape=single nodes=1" in proc.stdout
    assert "#   experiments/layers/model-foo.env\n" in proc.stdout  # the job script lists its sources
    assert "vllm serve example/foo-7b" in proc.stdout


@pytest.mark.parametrize("text, description", [
    pytest.param(FOO, "foo: a small test model on one MI300A node, vLLM.", id="first-line"),
    pytest.param("\n\n#   spaced   out  \n# second\nA=1\n", "spaced out", id="after-blank-lines"),
    pytest.param("A=1\n# too late\n", "", id="assignment-first"),
    pytest.param("", "", id="empty-file"),
    pytest.param("#" + "x" * 500 + "\n", "x" * 197 + "...", id="long-comment-cut"),
    pytest.param(b"# caf\xe9 model\n", "caf\ufffd model", id="not-utf8-replaced"),
])
def test_the_description_is_the_first_comment_line(root, text, description):
    path = root / "experiments/layers/model-foo.env"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    entry = catalog.load(root).model("foo")
    assert (entry.description, entry.source, str(entry.origin)) == \
        (description, "layer-file", "experiments/layers/model-foo.env:1")


def test_list_shows_both_kinds_and_json_marks_them(root):
    result = run(root, "list")
    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line.split()[1:3] for line in result.output.splitlines()[4:]}
    assert rows["foo"] == ["layer-file", "vllm"] and rows["qwen38mi200"] == ["setups.yaml", "vllm"]
    models = {m["name"]: m for m in json.loads(run(root, "list", "--json").output)["models"]}
    assert list(models) == sorted(models)
    assert {k: models["foo"][k] for k in ("from", "defined_in", "description", "engine", "nodes", "model")} == {
        "from": "layer-file", "defined_in": "experiments/layers/model-foo.env:1",
        "description": "foo: a small test model on one MI300A node, vLLM.", "engine": "vllm", "nodes": "1",
        "model": "example/foo-7b"}
    assert models["qwen38mi200"]["from"] == "setups.yaml"
    assert models["qwen38mi200"]["defined_in"].startswith("experiments/setups.yaml:")


def test_a_setups_entry_of_the_same_name_is_the_model(root):
    setups = root / "experiments/setups.yaml"
    setups.write_text(setups.read_text() + "  foo:\n    description: from setups\n    env: {MAX_MODEL_LEN: '8192'}\n")
    entry = catalog.load(root).model("foo")
    assert (entry.source, entry.description) == ("setups.yaml", "from setups")
    env = json.loads(run(root, "render", "experiment:foo", "--format", "json").output)
    assert (env["INFERENCE_MODEL"], env["MAX_MODEL_LEN"]) == ("example/foo-7b", "8192")


def test_check_covers_a_layer_file_model_and_update_writes_its_renders(root):
    result = run(root, "check")
    assert result.exit_code == 1
    assert "experiments/renders/.env.experiment.foo: missing (run `env_layers check --update`)" in result.output
    assert "experiments/renders/.env.replicas.foo: missing" in result.output
    assert run(root, "check", "--update").exit_code == 0
    result = run(root, "check")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[-1] == (
        "ok: 18 render(s) up to date (2 experiment(s) x 9 model(s): 4 in setups.yaml, 5 from a layer file alone); 36 site x target stack(s) checked")
    render = (root / "experiments/renders/.env.experiment.foo").read_text()
    assert "#   experiments/layers/model-foo.env\n" in render and "export INFERENCE_MODEL='example/foo-7b'\n" in render


def test_removing_the_layer_file_orphans_its_render(root):
    assert run(root, "check", "--update").exit_code == 0
    (root / "experiments/layers/model-foo.env").unlink()
    result = run(root, "check")
    assert result.exit_code == 1
    assert "experiments/renders/.env.experiment.foo: orphan render: its target is not in the catalog" in result.output


@pytest.mark.parametrize("filename", [
    pytest.param("model-a b.env", id="space"),
    pytest.param("model-x:y.env", id="colon"),
])
def test_a_file_name_that_cannot_be_a_model_is_a_note_not_a_model(root, filename):
    (root / "experiments/layers" / filename).write_text("# not a model\nA=1\n")
    cat = catalog.load(root)
    name = filename[len("model-"):-len(".env")]
    assert name not in cat.models and "foo" in cat.models
    note = f"note: experiments/layers/{filename} is not a model: '{name}' cannot be a model name"
    assert note in run(root, "list").output
    assert note in run(root, "check", "--update").output


def test_unknown_model_lists_layer_file_models_too(root):
    result = run(root, "render", "experiment:fooo")
    assert result.exit_code == 2
    assert result.output == (
        "env_layers: error: experiments/layers/model-fooo.env: unknown model 'fooo' (valid: foo, glm53, "
        "kimi27sglang, llama405bgateway, llama405bray, oss120b, oss20bdp, qwen38, qwen38mi200); hint: did you mean 'foo'?\n")


def test_a_model_file_that_is_a_directory_is_not_a_model(root):
    (root / "experiments/layers/model-dir.env").mkdir()
    assert "dir" not in catalog.load(root).models
    proc = subprocess.run([sys.executable, "-m", "envlayers", "--root", str(root), "render", "experiment:dir"],
                          capture_output=True, text=True, timeout=30, env=dict(os.environ, PYTHONPATH=str(REPO / "src")))
    assert proc.returncode == 2 and proc.stderr.startswith("env_layers: error: experiments/layers/model-dir.env: "
                                                           "unknown model 'dir'")
