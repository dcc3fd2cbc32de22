"""Merge rules: precedence, last assignment wins, absent vs empty, references, provenance."""

from __future__ import annotations

from pathlib import Path

import pytest

from envlayers.envfile import parse_text
from envlayers.errors import CatalogError, StackError
from envlayers.layers import Source, load_env, merge, stack_sources
from envlayers.shell import render

REPO = Path(__file__).resolve().parents[1]


def stack(*texts: str):
    return merge([Source(f"l{i}.env", tuple(parse_text(t, f"l{i}.env"))) for i, t in enumerate(texts)], "t:t")


def test_last_assignment_wins():
    assert stack("A=1", "A=2").text() == {"A": "2"}


def test_later_layer_can_assign_empty_and_key_stays_present():
    env = stack("A=1", "A=")
    assert "A" in env and env.text()["A"] == ""


def test_key_no_layer_assigns_is_absent():
    assert "B" not in stack("A=1")


def test_reference_to_earlier_assignment_is_resolved():
    assert stack("A=x", "B=$A/y").text()["B"] == "x/y"


def test_reference_to_unassigned_name_is_deferred():
    assert stack("B=$SCRATCH/y").text()["B"] == "${SCRATCH}/y"


def test_dash_default_keeps_an_empty_value():
    assert stack("A=", "B=${A-d}").text()["B"] == ""


def test_colon_dash_default_replaces_an_empty_value():
    assert stack("A=", "B=${A:-d}").text()["B"] == "d"


def test_override_history_is_kept_oldest_first():
    env = stack("A=1", "A=2", "A=3")
    b = env.bindings["A"]
    assert [str(o) for _, o in b.overridden] == ["l0.env:1", "l1.env:1"] and str(b.origin) == "l2.env:1"


def test_keys_render_in_order_of_first_assignment():
    assert list(stack("B=1\nA=1", "C=1\nB=2").bindings) == ["B", "A", "C"]


def test_self_reference_extends_the_environment_value():
    assert stack("PATH=$PATH:/a", "PATH=$PATH:/b").text()["PATH"] == "${PATH}:/a:/b"


def test_reading_a_name_that_an_earlier_line_of_the_render_assigns_is_refused():
    with pytest.raises(StackError) as err:
        stack("M=$N", "N=2", "K=$M")
    assert str(err.value).startswith(
        "l0.env:1: K reads $N from the environment at l0.env:1, but N is assigned at l1.env:1, before K is first set"
    )


def test_reading_a_name_that_a_later_line_assigns_is_rendered():
    assert stack("A=$SCRATCH/x", "SCRATCH=/h").text() == {"A": "${SCRATCH}/x", "SCRATCH": "/h"}


def test_colon_dash_on_a_value_of_several_deferred_references_is_refused():
    with pytest.raises(StackError) as err:
        stack("A=$X$Y", "B=${A:-d}")
    assert "depends on the job's environment" in str(err.value) and str(err.value).startswith("l1.env:1: ")


def test_strict_refuses_deferred_references():
    with pytest.raises(StackError) as err:
        merge([Source("l.env", tuple(parse_text("B=$SCRATCH", "l.env")))], "t:t", strict=True)
    assert str(err.value).startswith("l.env:1: B reads $SCRATCH, which no layer assigns")


def test_sh_render_quotes_literals_and_keeps_deferred_expandable():
    env = stack("A=it\\'s", "B=$SCRATCH/x", "C=")
    body = render(env, "sh", with_header=False)
    assert body == "export A='it'\\''s'\nexport B=\"${SCRATCH}/x\"\nexport C=''\n"


def test_json_render_is_key_to_string():
    import json

    assert json.loads(render(stack("A=1", "B="), "json")) == {"A": "1", "B": ""}


def test_env_render_is_readable_by_python_dotenv():
    import io

    from dotenv import dotenv_values

    text = render(stack("A=plain", "B='two words'", "C=", "D=\"it's\""), "env")
    assert dotenv_values(stream=io.StringIO(text)) == {"A": "plain", "B": "two words", "C": "", "D": "it's"}


# -- the catalog stack --------------------------------------------------------------------------

def test_catalog_stack_order():
    labels = [s.label for s in stack_sources(REPO, "replicas:qwen38mi200")]
    assert labels == [
        "experiments/layers/common.env",
        "experiments/sites/mi300a.env",
        "experiments/layers/replicas.env",
        "experiments/layers/model-qwen38.env",
        "experiments/layers/hardware-mi200-qwen38.env",
    ]


def test_model_layer_overrides_experiment():
    env = load_env(REPO, "replicas:kimi27sglang").text()
    # the model's 7200 over replicas.env's 2400; the model names no node count, so the experiment's stands
    assert env["AGENT_READY_TIMEOUT_SECONDS"] == "7200" and env["INFERENCE_NODES"] == "2"


def test_experiment_layer_applies_when_the_model_is_silent():
    env = load_env(REPO, "replicas:qwen38").text()
    assert env["AGENT_READY_TIMEOUT_SECONDS"] == "2400" and env["VLLM_READY_TIMEOUT_SECONDS"] == "2400"


def test_glm53_assigns_attention_backend_empty():
    env = load_env(REPO, "experiment:glm53")
    assert env.text()["SGLANG_ATTENTION_BACKEND"] == ""


def test_appended_file_wins(tmp_path):
    extra = tmp_path / "mine.env"
    extra.write_text("SERVER_PORT=9000\n")
    assert load_env(REPO, "experiment:qwen38", (extra,)).text()["SERVER_PORT"] == "9000"


def test_inline_env_in_setups_yaml_is_a_layer(tmp_path):
    (tmp_path / "experiments" / "layers").mkdir(parents=True)
    (tmp_path / "experiments" / "layers" / "common.env").write_text("A=1\nB=1\n")
    (tmp_path / "experiments" / "layers" / "model-m.env").write_text("B=2\n")
    (tmp_path / "experiments" / "setups.yaml").write_text(
        "experiments:\n  e:\n    env:\n      A: '5'\n      B: '5'\nmodels:\n  m:\n    env:\n      C: ''\n"
    )
    env = load_env(tmp_path, "e:m")
    assert env.text() == {"A": "5", "B": "2", "C": ""}
    assert str(env.bindings["A"].origin) == "experiments/setups.yaml:4"


@pytest.mark.parametrize(
    "yaml_text, message",
    [
        pytest.param("experiments: {}\n", "experiments/setups.yaml:1: missing 'models:'", id="missing-models"),
        pytest.param("experiments:\n  e:\n    layer: [x]\nmodels: {}\n",
                     "experiments/setups.yaml:3: experiments.e.layer: unknown key", id="unknown-entry-key"),
        pytest.param("experiments:\n  e:\n    env:\n      A: true\nmodels: {}\n",
                     "experiments/setups.yaml:4: experiments.e.env.A: is a YAML bool ('true'), not a string",
                     id="bool-value"),
        pytest.param("experiments:\n  e:\n    env:\n      A:\nmodels: {}\n",
                     "experiments/setups.yaml:4: experiments.e.env.A: has no value", id="null-value"),
        pytest.param("experiments: [\n", "experiments/setups.yaml:2: invalid YAML", id="bad-yaml"),
        pytest.param("version: 2\nexperiments: {}\nmodels: {}\n", "experiments/setups.yaml:1: version: unsupported version '2'",
                     id="unknown-version"),
        pytest.param("experiments:\n  'e:x': {}\nmodels: {}\n",
                     "experiments/setups.yaml:2: experiments: name 'e:x' cannot be used in a target", id="colon-in-name"),
    ],
)
def test_malformed_setups_yaml_names_file_line_and_key_path(tmp_path, yaml_text, message):
    (tmp_path / "experiments" / "layers").mkdir(parents=True)
    (tmp_path / "experiments" / "setups.yaml").write_text(yaml_text)
    with pytest.raises(CatalogError) as err:
        load_env(tmp_path, "e:m")
    assert str(err.value).startswith(message) and "hint:" in str(err.value)


@pytest.mark.parametrize("written", ["010", "+5", "4"], ids=["leading-zero", "plus-sign", "plain"])
def test_inline_integers_are_kept_as_written(tmp_path, written):
    (tmp_path / "experiments" / "layers").mkdir(parents=True)
    (tmp_path / "experiments" / "layers" / "common.env").write_text("")
    (tmp_path / "experiments" / "layers" / "model-m.env").write_text("")
    (tmp_path / "experiments" / "setups.yaml").write_text(f"experiments:\n  e:\n    env: {{O: {written}}}\nmodels:\n  m:\n")
    assert load_env(tmp_path, "e:m").text() == {"O": written}


def test_missing_layer_file_names_the_setups_line(tmp_path):
    (tmp_path / "experiments" / "layers").mkdir(parents=True)
    (tmp_path / "experiments" / "layers" / "common.env").write_text("")
    (tmp_path / "experiments" / "setups.yaml").write_text("experiments:\n  e:\n    layers: [nope.env]\nmodels:\n  m:\n")
    with pytest.raises(StackError) as err:
        load_env(tmp_path, "e:m")
    assert str(err.value).startswith("experiments/setups.yaml:3: layer file experiments/layers/nope.env not found")


# -- the launcher's part of the order, written once -------------------------------------------------

def test_launch_order_is_catalog_then_layer_then_serve_env_then_env_file(tmp_path):
    from envlayers.layers import LaunchSources

    mine, extra = tmp_path / "mine.env", tmp_path / "extra.env"
    mine.write_text("SERVER_PORT=9001\n")
    extra.write_text("SERVER_PORT=9000\n")
    sources = stack_sources(REPO, "experiment:qwen38", (extra,), LaunchSources(env_file=mine))
    assert [s.label for s in sources][-3:] == [str(extra), "experiments/serve-only.env", str(mine)]
    assert sources[0].label == "experiments/layers/common.env"
    env = merge(sources, "experiment:qwen38")
    assert env.text()["SERVER_PORT"] == "9001" and str(env.bindings["SERVER_PORT"].origin) == f"{mine}:1"


def test_base_env_replaces_the_catalog_layers_only(tmp_path):
    from envlayers.layers import LaunchSources

    base = tmp_path / "base.env"
    base.write_text("INFERENCE_ENGINE=vllm\n")
    labels = [s.label for s in stack_sources(REPO, "experiment:qwen38", (), LaunchSources(base_env=base))]
    assert labels == [str(base), "experiments/serve-only.env"]


def test_base_env_still_needs_target_names(tmp_path):
    from envlayers.layers import LaunchSources

    base = tmp_path / "base.env"
    base.write_text("A=1\n")
    with pytest.raises(StackError, match="is not an experiment or model name"):
        stack_sources(REPO, "experiment:x\nrm -rf ~", (), LaunchSources(base_env=base))


def test_a_file_name_with_a_newline_is_refused(tmp_path):
    from envlayers.layers import LaunchSources

    bad = tmp_path / "mine\necho pwned.env"
    bad.write_text("A=1\n")
    with pytest.raises(StackError) as err:
        stack_sources(REPO, "experiment:qwen38", (), LaunchSources(env_file=bad))
    assert str(err.value).startswith("SERVE_ENV_FILE: the file name ") and "control character" in str(err.value)


# -- references the job must provide ----------------------------------------------------------------

def test_unbound_refs_are_the_bare_references_with_their_guards():
    from envlayers.layers import unbound_refs

    env = stack("A=$X/a\nB=${Y-d}\nC=${Z:-${W}/c}\nD=x\nE=$D/e")
    got = [(u.key, u.name, str(u.origin), u.guards) for u in unbound_refs(env)]
    assert got == [("A", "X", "l0.env:1", ()), ("C", "W", "l0.env:3", (("Z", ":-"),))]


@pytest.mark.parametrize("environ, want", [
    pytest.param({"X": "1", "W": "w"}, "1/a|d|w/c", id="all-set"),
    pytest.param({"X": "1", "Z": "z"}, "1/a|d|z", id="default-not-read"),
    pytest.param({"X": "1", "Z": "", "W": "w"}, "1/a|d|w/c", id="empty-takes-colon-default"),
    pytest.param({"W": "w"}, None, id="bare-unset"),
], )
def test_expand_follows_bash(environ, want):
    from envlayers.layers import expand

    env = stack("A=$X/a\nB=${Y-d}\nC=${Z:-${W}/c}")
    got = [expand(env.bindings[k].value, environ) for k in "ABC"]
    assert (None if None in got else "|".join(got)) == want


@pytest.mark.parametrize("key", ["SERVER_API_KEY"])
def test_render_refuses_a_secret_with_file_line(key):
    with pytest.raises(StackError) as err:
        render(stack("A=1", f"{key}=hunter22"), "sh")
    assert str(err.value).startswith(f"l1.env:1: {key} in a layer would be written into the render")
    assert "hunter22" not in str(err.value)


@pytest.mark.parametrize("key, way", [
    pytest.param("HF_TOKEN", "HF_TOKEN_PATH=FILE", id="hf-token"),
    pytest.param("HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH=FILE", id="hf-token-old-name"),
    pytest.param("OPENAI_API_KEY", "a file readable only by you", id="api-key"),
    pytest.param("VLLM_API_KEY", "a file readable only by you", id="vllms-own-key-variable"),
    pytest.param("AWS_SECRET_ACCESS_KEY", "a file readable only by you", id="secret-inside"),
    pytest.param("WANDB_PASSWORD", "a file readable only by you", id="password"),
])
def test_render_refuses_a_credential_with_file_line_and_the_way_to_pass_it(key, way):
    with pytest.raises(StackError) as err:
        render(stack("A=1", f"{key}=hunter22"), "sh")
    text = str(err.value)
    assert text.startswith(f"l1.env:1: {key} looks like a credential: a value written in a layer is copied into the "
                           "render, the job script, the run directory's serve.env and the job's log; hint: ")
    assert way in text and f"{key}=${{{key}}}" in text and "hunter22" not in text


@pytest.mark.parametrize("line", [
    pytest.param("HF_TOKEN=${HF_TOKEN:-hunter22}", id="in-a-default"),
    pytest.param("HF_TOKEN=${X-${Y:-hunter22}}", id="in-a-nested-default"),
])
def test_a_credential_written_in_a_default_is_refused(line):
    # the default is written into the render as it stands: the job script and serve.env would carry it
    with pytest.raises(StackError) as err:
        render(stack("A=1", line), "sh")
    assert str(err.value).startswith("l1.env:1: HF_TOKEN looks like a credential") and "hunter22" not in str(err.value)


@pytest.mark.parametrize("line", [
    pytest.param("HF_TOKEN=${HF_TOKEN}", id="a-reference-writes-no-secret"),
    pytest.param("HF_TOKEN=${HF_TOKEN:-}", id="an-empty-default"),
    pytest.param("HF_TOKEN=${HF_TOKEN:-$MY_TOKEN}", id="a-default-that-is-a-reference"),
    pytest.param("HF_TOKEN=", id="empty"),
    pytest.param("HF_TOKEN_PATH=/home/me/.hf-token", id="a-path-to-the-secret"),
    pytest.param("SERVER_API_KEY_FILE=/home/me/key", id="a-key-file"),
    pytest.param("SGLANG_MAX_TOKENS=4096", id="a-count-of-tokens"),
    pytest.param("HF_HUB_DISABLE_IMPLICIT_TOKEN=1", id="a-switch"),
    pytest.param("TOKENIZER_MODE=auto", id="tokenizer"),
])
def test_what_only_names_a_credential_renders(line):
    assert line.split("=")[0] in render(stack(line), "sh")


def test_an_empty_secret_key_renders():
    assert "SERVER_API_KEY=''" in render(stack("SERVER_API_KEY="), "sh")


def test_a_catalog_layer_name_with_a_newline_is_refused(tmp_path):
    import shutil

    shutil.copytree(REPO / "experiments", tmp_path / "experiments")
    (tmp_path / "experiments/layers/a\necho pwned.env").write_text("A=1\n")
    setups = tmp_path / "experiments/setups.yaml"
    setups.write_text(setups.read_text().replace("layers: [replicas.env]", 'layers: ["a\\necho pwned.env"]', 1))
    assert '"a\\necho pwned.env"' in setups.read_text()
    with pytest.raises(StackError, match="control character"):
        stack_sources(tmp_path, "replicas:qwen38")
