"""Parallelism derived across layers: a higher layer's INFERENCE_NODES over a lower layer's
PIPELINE_PARALLEL_SIZE gets the model across the nodes; the same or a higher layer's PP is checked as
always; and no refusal's hint asks for what a layer cannot do (unset a key a lower layer sets)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from click.testing import CliRunner

from envlayers.cli import cli
from envlayers.envfile import parse_file
from envlayers.errors import KeyValueError, TopologyError
from envlayers.layers import Source, merge
from envlayers.topology import Stacking, plan, stacking

REPO = Path(__file__).resolve().parents[1]
ABOVE = Stacking("mine.env:1", "experiments/layers/common.env:9", True)
SAME = Stacking("mine.env:1", "mine.env:2", False)


def keys(nodes=None, gpn=4, tp=None, pp=None, **extra) -> dict[str, str]:
    env = {"INFERENCE_NODES": nodes, "GPUS_PER_NODE": gpn, "TENSOR_PARALLEL_SIZE": tp,
           "PIPELINE_PARALLEL_SIZE": pp, **extra}
    return {k: str(v) for k, v in env.items() if v is not None}


# --------------------------------------------------------------------------- which PP the plan uses


@pytest.mark.parametrize("env, layered, shape, tp, pp, derived_pp", [
    pytest.param(keys(2, tp=4, pp=1), ABOVE, "pipeline", 4, 2, True, id="nodes-above-pp-derives-a-pipeline"),
    pytest.param(keys(4, tp=4, pp=4), ABOVE, "pipeline", 4, 4, False, id="pp-already-covers-the-nodes"),
    pytest.param(keys(4, tp=4, pp=2), ABOVE, "pipeline", 4, 4, True, id="more-nodes-more-stages"),
    pytest.param(keys(4, tp=8, pp=1), ABOVE, "ray", 8, 2, True, id="tp-across-nodes-keeps-tp"),
    pytest.param(keys(2, tp=8, pp=1), ABOVE, "ray", 8, 1, False, id="tp-spanning-the-nodes-needs-no-pp"),
    pytest.param(keys(1, tp=4, pp=4), ABOVE, "single", 4, 1, True, id="one-node-drops-the-stages"),
    pytest.param(keys(1, tp=2, pp=1), ABOVE, "single", 2, 1, False, id="one-node-may-use-fewer-gpus"),
    pytest.param(keys(2, tp=4, pp=1, INFERENCE_MODE="pipeline"), ABOVE, "pipeline", 4, 2, True,
                 id="pipeline-mode-derives-too"),
    pytest.param(keys(2, tp=4, pp=1, INFERENCE_MODE="replicas"), ABOVE, "replicas", 4, 1, False,
                 id="replicas-nodes-are-instances"),
    pytest.param(keys(2, tp=1, pp=1, NUMBER_OF_INSTANCES=8), ABOVE, "data-parallel", 1, 1, False,
                 id="data-parallel-nodes-are-instances"),
    pytest.param(keys(4, tp=8, pp=1, NUMBER_OF_INSTANCES=2), ABOVE, "gateway", 8, 1, False,
                 id="gateway-keeps-its-instances"),
    pytest.param(keys(4, tp=4, pp=4), SAME, "pipeline", 4, 4, False, id="same-layer-is-taken-as-set"),
    pytest.param(keys(2, tp=4), ABOVE._replace(pp_origin=""), "pipeline", 4, 2, False,
                 id="absent-pp-is-derived-as-always"),
])
def test_pp_below_the_node_count_is_derived_for_one_instance(env, layered, shape, tp, pp, derived_pp):
    p = plan(env, layered)
    assert (p.shape, p.tp, p.pp, p.world * p.replicas <= p.nodes * p.gpus_per_node) == (shape, tp, pp, True)
    layered_lines = [d for d in p.derived if "stands above" in d]
    assert bool(layered_lines) is derived_pp
    if derived_pp:
        (line,) = layered_lines
        assert line == (f"pp={pp} (INFERENCE_NODES={env['INFERENCE_NODES']} at mine.env:1 stands above "
                        f"PIPELINE_PARALLEL_SIZE={env['PIPELINE_PARALLEL_SIZE']} at experiments/layers/common.env:9: "
                        "INFERENCE_NODES x GPUS_PER_NODE / TENSOR_PARALLEL_SIZE = "
                        f"{env['INFERENCE_NODES']} x 4 / {tp})")


@pytest.mark.parametrize("env, layered, message", [
    pytest.param(keys(2, tp=4, pp=1), SAME,
                 "TENSOR_PARALLEL_SIZE, PIPELINE_PARALLEL_SIZE: TENSOR_PARALLEL_SIZE x PIPELINE_PARALLEL_SIZE = 4 x 1 "
                 "uses 4 GPU(s), but INFERENCE_NODES x GPUS_PER_NODE = 2 x 4 = 8 GPU(s) are allocated; 4 GPU(s) would "
                 "sit idle and be billed for the whole walltime; hint: set PIPELINE_PARALLEL_SIZE=2, or "
                 "INFERENCE_MODE=replicas for independent servers", id="same-layer-refused-as-today"),
    pytest.param(keys(2, tp=4, pp=1), None,
                 "TENSOR_PARALLEL_SIZE, PIPELINE_PARALLEL_SIZE: TENSOR_PARALLEL_SIZE x PIPELINE_PARALLEL_SIZE = 4 x 1 "
                 "uses 4 GPU(s), but INFERENCE_NODES x GPUS_PER_NODE = 2 x 4 = 8 GPU(s) are allocated; 4 GPU(s) would "
                 "sit idle and be billed for the whole walltime; hint: set PIPELINE_PARALLEL_SIZE=2, or "
                 "INFERENCE_MODE=replicas for independent servers", id="no-provenance-refused-as-today"),
    pytest.param(keys(2, tp=3, pp=1), ABOVE,
                 "TENSOR_PARALLEL_SIZE, PIPELINE_PARALLEL_SIZE: TENSOR_PARALLEL_SIZE x PIPELINE_PARALLEL_SIZE = 3 x 1 "
                 "uses 3 GPU(s), but INFERENCE_NODES x GPUS_PER_NODE = 2 x 4 = 8 GPU(s) are allocated; 5 GPU(s) would "
                 "sit idle and be billed for the whole walltime; hint: set TENSOR_PARALLEL_SIZE=4 and "
                 "PIPELINE_PARALLEL_SIZE=2, or INFERENCE_MODE=replicas for independent servers",
                 id="tp-that-does-not-divide-is-not-derived"),
    pytest.param(keys(1, tp=8, pp=1), ABOVE,
                 "TENSOR_PARALLEL_SIZE, PIPELINE_PARALLEL_SIZE: TENSOR_PARALLEL_SIZE x PIPELINE_PARALLEL_SIZE = 8 x 1 "
                 "needs 8 GPU(s), but INFERENCE_NODES x GPUS_PER_NODE = 1 x 4 = 4 GPU(s) are allocated; 4 GPU(s) are "
                 "missing, so the server would fail at start after the job waited in the queue; hint: set "
                 "INFERENCE_NODES=2, or TENSOR_PARALLEL_SIZE=4", id="tp-larger-than-the-allocation"),
])
def test_what_cannot_be_derived_is_refused_with_a_fix_a_layer_can_make(env, layered, message):
    with pytest.raises(TopologyError) as err:
        plan(env, layered)
    assert str(err.value) == message


# --------------------------------------------------------------------------- precedence from the stack


def _stack(tmp_path, *layers: str) -> list[Source]:
    out = []
    for i, text in enumerate(layers):
        path = tmp_path / f"layer{i}.env"
        path.write_text(text)
        out.append(Source(path.name, tuple(parse_file(path, path.name))))
    return out


@pytest.mark.parametrize("layers, want", [
    pytest.param(("INFERENCE_NODES=1\nPIPELINE_PARALLEL_SIZE=1\n", "INFERENCE_NODES=2\n"),
                 Stacking("layer1.env:1", "layer0.env:2", True), id="nodes-in-a-higher-layer"),
    pytest.param(("INFERENCE_NODES=1\n", "PIPELINE_PARALLEL_SIZE=1\nINFERENCE_NODES=2\n"),
                 Stacking("layer1.env:2", "layer1.env:1", False), id="both-in-one-layer"),
    pytest.param(("INFERENCE_NODES=2\n", "PIPELINE_PARALLEL_SIZE=1\n"),
                 Stacking("layer0.env:1", "layer1.env:1", False), id="pp-in-a-higher-layer"),
    pytest.param(("PIPELINE_PARALLEL_SIZE=1\nINFERENCE_NODES=1\n", "INFERENCE_NODES=2\n",
                  "PIPELINE_PARALLEL_SIZE=3\n"),
                 Stacking("layer1.env:1", "layer2.env:1", False), id="the-last-assignment-counts"),
    pytest.param(("INFERENCE_NODES=2\n",), None, id="pp-absent"),
])
def test_stacking_compares_the_layers_that_set_the_values(tmp_path, layers, want):
    sources = _stack(tmp_path, *layers)
    assert stacking(sources, merge(sources)) == want


def test_setups_yaml_inline_keys_are_placed_by_their_own_entry(tmp_path):
    # experiments.<e>.env stands below the model layer, models.<m>.env above it: both are setups.yaml lines
    root = tmp_path / "repo"
    layers = root / "experiments" / "layers"
    layers.mkdir(parents=True)
    (layers / "common.env").write_text("GPUS_PER_NODE=4\nTENSOR_PARALLEL_SIZE=4\n")
    (layers / "model-m.env").write_text("# m\nPIPELINE_PARALLEL_SIZE=1\n")
    (root / "experiments" / "setups.yaml").write_text(
        "version: 1\nexperiments:\n  e:\n    description: e\n    env:\n      INFERENCE_NODES: '2'\n"
        "models:\n  m:\n    description: m\n    env:\n      INFERENCE_NODES: '4'\n")
    from envlayers.layers import stack_sources

    sources = stack_sources(root, "e:m")
    env = merge(sources, "e:m")
    layered = stacking(sources, env)
    assert layered.nodes_above and layered.nodes_origin == "experiments/setups.yaml:11"
    assert plan(env.text(), layered).pp == 4
    (root / "experiments" / "setups.yaml").write_text(
        "version: 1\nexperiments:\n  e:\n    description: e\n    env:\n      INFERENCE_NODES: '2'\n"
        "models:\n  m:\n    description: m\n")
    sources = stack_sources(root, "e:m")
    assert not stacking(sources, merge(sources, "e:m")).nodes_above  # the experiment's entry is below model-m.env


# --------------------------------------------------------------------------- hints a layer can follow


def _refusals():
    values = {
        "INFERENCE_NODES": (None, "", "1", "2", "4"), "GPUS_PER_NODE": (None, "4", "8"),
        "TENSOR_PARALLEL_SIZE": (None, "", "1", "3", "4", "8", "16"),
        "PIPELINE_PARALLEL_SIZE": (None, "", "1", "2", "4"),
        "NUMBER_OF_INSTANCES": (None, "", "1", "2", "3", "8"),
        "INFERENCE_MODE": (None, "single", "pipeline", "replicas", "x"),
    }
    for combo in itertools.product(*values.values()):
        yield {k: v for k, v in zip(values, combo) if v is not None}
    for extra in ({"DISTRIBUTED_BACKEND": "ray"}, {"DISTRIBUTED_BACKEND": "native"}, {"DISTRIBUTED_BACKEND": "mpi"},
                  {"DISTRIBUTED_BACKEND": ""}, {"USE_RAY_SERVE": "true"}, {"USE_RAY_SERVE": "maybe"},
                  {"SERVER_PORT": "29500"}, {"RDZV_PORT": "8000"}, {"SERVER_PORT": ""}, {"RDZV_PORT": ""},
                  {"DATA_PARALLEL_RPC_PORT": "8000"}, {"DATA_PARALLEL_RPC_PORT": ""},
                  {"INFERENCE_ENGINE": "sglang"}):
        for nodes, tp, inst, mode in itertools.product(("1", "2", "4"), ("4", "8", "16"), (None, "2", "8"),
                                                       (None, "replicas", "single")):
            env = {"INFERENCE_NODES": nodes, "GPUS_PER_NODE": "8", "TENSOR_PARALLEL_SIZE": tp, **extra}
            if inst:
                env["NUMBER_OF_INSTANCES"] = inst
            if mode:
                env["INFERENCE_MODE"] = mode
            yield env


def test_no_refusal_hint_asks_to_delete_or_unset_a_key():
    """A layer can set a key (empty too) but never unset one a lower layer sets, so no hint may ask for that."""
    hints, refused = set(), 0
    for env in _refusals():
        for layered in (None, ABOVE):
            try:
                plan(env, layered)
            except (TopologyError, KeyValueError) as err:  # a refused shape, or a value of the wrong type
                refused += 1
                if err.hint:
                    hints.add(err.hint)
    assert refused > 1000 and len(hints) > 30  # the sweep reaches many different refusals
    bad = sorted(h for h in hints if any(word in h.lower() for word in ("delete", "unset", "remove")))
    assert bad == []


# --------------------------------------------------------------------------- through the CLI


@pytest.fixture
def serve_env_file(tmp_path, monkeypatch):
    (tmp_path / "edf").mkdir()
    monkeypatch.setenv("EDF_PATH", str(tmp_path / "edf"))
    monkeypatch.setenv("HOME", str(tmp_path))
    mine = tmp_path / "serve.env"
    mine.write_text("# two nodes for the 120B model\nINFERENCE_NODES=2\n")
    monkeypatch.setenv("SERVE_ENV_FILE", str(mine))
    return mine


def test_nodes_from_serve_env_file_give_oss120b_a_two_node_pipeline(serve_env_file):
    runner = CliRunner()
    derived = (f"derived: pp=2 (INFERENCE_NODES=2 at {serve_env_file}:2 stands above PIPELINE_PARALLEL_SIZE=1 at "
               "experiments/layers/common.env:9: INFERENCE_NODES x GPUS_PER_NODE / TENSOR_PARALLEL_SIZE = 2 x 4 / 4)")

    planned = runner.invoke(cli, ["--root", str(REPO), "plan", "--model", "oss120b"])
    assert planned.exit_code == 0, planned.output
    lines = planned.output.splitlines()
    assert lines[1] == derived
    assert lines[2] == ("ENVLAYERS-TOPOLOGY: shape=pipeline nodes=2 gpus_per_node=4 tp=4 pp=2 world=8 api_rank=0 "
                        "port=8000")
    assert sum("derived" in line and "stands above" in line for line in lines) == 1
    ranks = [line for line in lines if line.startswith("rank ")]
    assert len(ranks) == 2 and all("--tensor-parallel-size 4 --pipeline-parallel-size 2 --nnodes 2" in r for r in ranks)

    dry = runner.invoke(cli, ["--root", str(REPO), "serve", "--model", "oss120b", "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert f"# {derived}" in dry.output.splitlines()
    assert "--nodes=2 " in dry.output
    # the job plans again from its own environment: it must read the derived PP there
    assert "export PIPELINE_PARALLEL_SIZE='2'\n" in dry.output and "export INFERENCE_NODES='2'\n" in dry.output
    assert "export PIPELINE_PARALLEL_SIZE='1'" not in dry.output

    explained = runner.invoke(cli, ["--root", str(REPO), "explain", "--serve", "experiment:oss120b",
                                    "PIPELINE_PARALLEL_SIZE"])
    assert explained.exit_code == 0, explained.output
    assert explained.output.splitlines() == [
        "PIPELINE_PARALLEL_SIZE='1'  experiments/layers/common.env:9",
        "    " + derived.replace("derived: ", "derived for the plan: "),
    ]


def test_the_job_plans_the_same_from_the_script_it_is_given(serve_env_file, tmp_path):
    """The launcher plans from the job's environment alone (no layers): bash sources the job's merged
    environment as the job script does, and the plan made from it is the plan the dry run showed."""
    import re
    import subprocess

    from envlayers.jobscript import prepare
    from envlayers.launch.prepare import launch_keys

    job = prepare(REPO, "oss120b", env_file=serve_env_file, python="/usr/bin/python3",
                  environ={"HOME": str(tmp_path), "PWD": str(tmp_path)})
    body = job.script.split("<<'ENVLAYERS_ENV' || true\n", 1)[1].split("\nENVLAYERS_ENV\n", 1)[0]
    (tmp_path / "serve.sh").write_text(body + "\n")
    names = re.search(r"^export ENVLAYERS_KEYS='(.*)'$", job.script, re.M).group(1)
    out = subprocess.run(["bash", "-c", 'set -a; . "$1"; for k in $2; do printf "%s=%s\\0" "$k" "${!k}"; done',
                          "_", str(tmp_path / "serve.sh"), names], capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin", "PWD": str(tmp_path)}).stdout
    environ = dict(item.split("=", 1) for item in out.split("\0") if item)
    environ["ENVLAYERS_KEYS"] = names
    assert environ["PIPELINE_PARALLEL_SIZE"] == "2"
    assert plan(launch_keys(environ)) == job.plan
