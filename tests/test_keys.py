"""envlayers.keys: the table of launch keys, its typed readers and docs/keys.md generated from it."""

from __future__ import annotations

import difflib
import re
from pathlib import Path

import pytest

from envlayers import keys
from envlayers.errors import EnvLayersError, KeyValueError
from envlayers.keys import Located, value

REPO = Path(__file__).resolve().parent.parent
LINE = "experiments/layers/mine.env:7"


def at_line(name: str, text: str) -> Located:
    """``name=text`` as the merged Env would give it on the login node: assigned at LINE."""
    return Located({name: text}, {name: LINE})


# --- absent and empty ----------------------------------------------------------------------------


@pytest.mark.parametrize("name, want", [
    pytest.param("INFERENCE_NODES", 1, id="count"),
    pytest.param("SERVER_PORT", 8000, id="port"),
    pytest.param("HEALTH_FAIL_AFTER_S", 600, id="seconds"),
    pytest.param("SUCCESSORS", 0, id="whole"),
    pytest.param("IDLE_STOP_AFTER_S", None, id="fractional-seconds-never"),
    pytest.param("GPU_MEM_GB", None, id="gib-no-check"),
    pytest.param("USE_RAY_SERVE", False, id="bool-off"),
    pytest.param("SGLANG_ENABLE_METRICS", True, id="bool-on"),
    pytest.param("RAY_PORT_BASE", 28000, id="ray-port"),
    pytest.param("ENVLAYERS_READY_TIMEOUT_S", 7200, id="job-script-key"),
])
def test_an_absent_key_reads_as_its_default(name, want):
    assert value({}, name) == want


@pytest.mark.parametrize("name, want", [
    pytest.param("HEALTH_FAIL_AFTER_S", 600, id="as-absent"),
    pytest.param("MIN_REPLICAS", 1, id="as-absent-count"),
    pytest.param("CHECK_WEIGHTS", True, id="bool-as-absent"),
    pytest.param("SGLANG_ENABLE_METRICS", False, id="bool-empty-is-off"),
    pytest.param("RAY_PORT_BASE", None, id="empty-is-rays-own-ports"),
    pytest.param("IDLE_WARN_AFTER_S", None, id="empty-is-never"),
])
def test_an_empty_key_reads_as_the_table_says(name, want):
    assert value({name: "  "}, name) == want


@pytest.mark.parametrize("name", ["INFERENCE_NODES", "SERVER_PORT", "RAY_JOIN_TIMEOUT_S", "NUMBER_OF_INSTANCES"])
def test_an_empty_key_that_has_no_empty_meaning_is_an_error_with_the_default_as_hint(name):
    with pytest.raises(KeyValueError) as err:
        value(at_line(name, ""), name)
    default = keys.BY_NAME[name].default
    assert str(err.value).startswith(f"{LINE}: {name}: is empty; it must be ")
    assert f"; hint: set {name}={default} (its value when no layer assigns it)" in str(err.value)


def test_a_derived_default_is_the_hint_of_an_empty_value():
    with pytest.raises(KeyValueError, match=r"hint: set TENSOR_PARALLEL_SIZE=8 \(its value"):
        value({"TENSOR_PARALLEL_SIZE": ""}, "TENSOR_PARALLEL_SIZE", shown="8")


def test_a_default_the_reader_derives_replaces_the_tables():
    assert value({}, "GATEWAY_REPLACE_TIMEOUT_S", 1234) == 1234


# --- values of each type ---------------------------------------------------------------------------


@pytest.mark.parametrize("name, text, want", [
    pytest.param("GPUS_PER_NODE", " 8 ", 8, id="count-stripped"),
    pytest.param("SERVER_PORT", "65535", 65535, id="port-top"),
    pytest.param("STARTUP_STALL_S", "0", 0, id="seconds-zero-turns-off"),
    pytest.param("IDLE_STOP_AFTER_S", "2.5", 2.5, id="fractional-seconds"),
    pytest.param("GPU_MEM_GB", "79.5", 79.5, id="gib-decimal"),
    pytest.param("RAY_NUM_CPUS", "16", 16, id="cpus"),
    pytest.param("SUCCESSORS", "0", 0, id="whole-zero"),
])
def test_a_value_of_the_type_is_read(name, text, want):
    assert value({name: text}, name) == want


@pytest.mark.parametrize("text", ["true", "TRUE", "1", "yes", "On", " on "])
@pytest.mark.parametrize("name", ["USE_RAY_SERVE", "SGLANG_ENABLE_METRICS", "CHECK_WEIGHTS"])
def test_every_boolean_key_takes_the_same_true_spellings(name, text):
    assert value({name: text}, name) is True


@pytest.mark.parametrize("text", ["false", "False", "0", "no", "OFF"])
@pytest.mark.parametrize("name", ["USE_RAY_SERVE", "SGLANG_ENABLE_METRICS", "CHECK_WEIGHTS"])
def test_every_boolean_key_takes_the_same_false_spellings(name, text):
    assert value({name: text}, name) is False


@pytest.mark.parametrize("name, text, what", [
    pytest.param("INFERENCE_NODES", "0", "a positive integer", id="count-zero"),
    pytest.param("INFERENCE_NODES", "2.5", "a positive integer", id="count-fraction"),
    pytest.param("INFERENCE_NODES", "\u0663", "a positive integer", id="count-non-ascii-digit"),
    pytest.param("SERVER_PORT", "65536", "a TCP port (1-65535)", id="port-too-big"),
    pytest.param("HEALTH_FAIL_AFTER_S", "5m", "a whole number of seconds", id="seconds-unit"),
    pytest.param("ENVLAYERS_RANK_START_TIMEOUT", "0", "a positive number of seconds", id="seconds-zero"),
    pytest.param("IDLE_STOP_AFTER_S", "nan", "a positive number of seconds", id="fractional-nan"),
    pytest.param("GPU_MEM_GB", "inf", "a positive number of GiB", id="gib-inf"),
    pytest.param("USE_RAY_SERVE", "maybe", "true or false (true/1/yes/on or false/0/no/off, any case)", id="bool"),
    pytest.param("RAY_PORT_BASE", "80", "a port from 1024 to 64536", id="ray-port-low"),
    pytest.param("SUCCESSORS", "-1", "a whole number", id="whole-negative"),
])
def test_a_bad_value_names_its_line_the_key_and_a_hint(name, text, what):
    with pytest.raises(KeyValueError) as err:
        value(at_line(name, text), name)
    shown = str(err.value)
    assert shown.startswith(f"{LINE}: {name}: must be {what}")
    assert f"got {text!r}; hint: " in shown
    assert err.value.where == LINE and err.value.key == name and err.value.hint


def test_in_the_job_a_bad_value_names_the_key_without_a_line():
    with pytest.raises(KeyValueError) as err:
        value({"SUCCESSORS": "two"}, "SUCCESSORS")
    assert err.value.where is None
    assert str(err.value) == ("SUCCESSORS: must be a whole number, got 'two'; hint: SUCCESSORS=2 keeps the endpoint "
                              "up for three time limits")


def test_the_error_belongs_to_the_projects_family():
    assert issubclass(KeyValueError, EnvLayersError)


def test_free_text_keys_are_returned_as_they_are():
    assert value({"SERVER_EXTRA_ARGS": " --foo 1 "}, "SERVER_EXTRA_ARGS") == " --foo 1 "


def test_an_unknown_key_is_a_programming_error():
    with pytest.raises(KeyError):
        value({}, "NO_SUCH_KEY")


# --- the login node's check -------------------------------------------------------------------------


def test_check_refuses_a_bad_value_of_a_key_only_the_job_reads():
    with pytest.raises(KeyValueError, match=rf"^{LINE}: ENVLAYERS_RANK_START_TIMEOUT: must be"):
        keys.check(at_line("ENVLAYERS_RANK_START_TIMEOUT", "5 minutes"))


def test_check_leaves_a_value_the_jobs_shell_expands_to_the_job():
    with pytest.raises(KeyValueError, match="^HEALTH_FAIL_AFTER_S: "):  # the same key, a literal: checked here
        keys.check(Located({"HEALTH_FAIL_AFTER_S": "MY_HEALTH", "SERVER_PORT": "8001"}, {}))
    assert keys.check(Located({"HEALTH_FAIL_AFTER_S": "${MY_HEALTH}", "SERVER_PORT": "8001"}, {})) is None


def test_check_takes_an_empty_value_where_it_means_derive():
    with pytest.raises(KeyValueError, match="^MIN_REPLICAS: "):  # a value that is no number is checked
        keys.check(Located({"GATEWAY_REPLACE_TIMEOUT_S": "1", "RAY_PORT_BASE": "", "MIN_REPLICAS": "x"}, {}))
    assert keys.check(Located({"GATEWAY_REPLACE_TIMEOUT_S": "1", "RAY_PORT_BASE": "", "MIN_REPLICAS": ""}, {})) is None


def test_located_carries_the_merged_envs_lines(tmp_path):
    from envlayers.layers import Source, merge
    from envlayers.envfile import parse_file

    layer = tmp_path / "mine.env"
    layer.write_text("A=1\nUSE_RAY_SERVE=perhaps\n")
    env = merge([Source("mine.env", tuple(parse_file(layer, "mine.env")))])
    located = keys.located(env)
    assert located == {"A": "1", "USE_RAY_SERVE": "perhaps"} and located.origins["USE_RAY_SERVE"] == "mine.env:2"
    with pytest.raises(KeyValueError, match=r"^mine\.env:2: USE_RAY_SERVE: must be true or false"):
        value(located, "USE_RAY_SERVE")


# --- the table ----------------------------------------------------------------------------------------


def test_every_key_is_named_once():
    names = [k.name for k in keys.KEYS]
    assert len(names) == len(set(names))


def test_every_typed_default_is_of_its_type():
    for k in keys.KEYS:
        if k.type.checked and k.default is not None:
            assert k.type.parse(keys._word(k.default)) == k.default, k.name


def test_every_key_says_what_it_does_and_what_absent_and_empty_mean():
    for k in keys.KEYS:
        assert k.doc and k.section, k.name
        if k.name != "SERVER_API_KEY":  # refused in every layer: neither absent nor empty means anything
            assert k.absent and k.empty, k.name


# --- docs/keys.md ---------------------------------------------------------------------------------------


def test_keys_doc_is_generated_from_the_table():
    doc = (REPO / "docs" / "keys.md").read_text()
    want = keys.render_markdown()
    diff = "".join(difflib.unified_diff(doc.splitlines(True), want.splitlines(True), "docs/keys.md", "generated"))
    assert doc == want, ("docs/keys.md differs from envlayers.keys: run "
                         "`python3 -m envlayers.keys --markdown > docs/keys.md`\n" + diff)


def test_every_key_of_the_table_has_one_row_in_the_doc():
    rows = re.findall(r"^\| `([A-Z0-9_]+)` \|", keys.render_markdown(), re.M)
    table = [k.name for k in keys.KEYS]
    assert sorted(r for r in rows if r in keys.BY_NAME) == sorted(table)


def test_a_template_without_a_sections_table_is_refused():
    with pytest.raises(ValueError, match="no @@keys line"):
        keys.render_markdown("# Launch keys\n\n@@keys main@@\n")


def test_the_generator_prints_the_doc(capsys):
    assert keys.main(["--markdown"]) == 0
    assert capsys.readouterr().out == keys.render_markdown()
    assert keys.main([]) == 2


# --- behaviour the readers changed ----------------------------------------------------------------------


def job(tmp_path, layer: str):
    """``env_layers serve`` of qwen38 with ``layer`` as the SERVE_ENV_FILE (the login node's checks)."""
    from envlayers.jobscript import prepare

    mine = tmp_path / "mine.env"
    mine.write_text("CONTAINER_RUNTIME=none\nALLOW_PUBLIC_UNAUTHENTICATED=1\n" + layer)
    return prepare(REPO, "qwen38", env_file=mine, python="/usr/bin/python3",
                   environ={"HOME": str(tmp_path), "PWD": str(tmp_path)})


@pytest.mark.parametrize("layer", [
    pytest.param("HEALTH_FAIL_AFTER_S=5m\n", id="health"),
    pytest.param("IDLE_STOP_AFTER_S=30m\n", id="idle"),
    pytest.param("STARTUP_STALL_S=1.5\n", id="stall"),
    pytest.param("SUCCESSORS=two\n", id="successors"),
    pytest.param("ENVLAYERS_RANK_START_TIMEOUT=5min\n", id="rank-start-was-silently-300"),
    pytest.param("MIN_REPLICAS=0\n", id="min-replicas"),
])
def test_a_bad_value_of_a_key_the_job_reads_is_refused_before_submission_naming_its_line(tmp_path, layer):
    with pytest.raises(KeyValueError) as err:
        job(tmp_path, layer)
    assert str(err.value).startswith(f"{tmp_path / 'mine.env'}:3: {layer.split('=')[0]}: must be ")


def test_a_bad_planner_value_names_its_layer_line(tmp_path):
    with pytest.raises(KeyValueError) as err:
        job(tmp_path, "NUMBER_OF_INSTANCES=1e3\n")
    assert str(err.value).startswith(f"{tmp_path / 'mine.env'}:3: NUMBER_OF_INSTANCES: must be a positive integer")


def test_a_value_the_jobs_shell_expands_is_not_refused_on_the_login_node(tmp_path):
    made = job(tmp_path, "HEALTH_FAIL_AFTER_S=${MY_HEALTH_S:-600}\n")
    assert 'export HEALTH_FAIL_AFTER_S="${MY_HEALTH_S:-600}"' in made.script  # left for the job's shell to expand


@pytest.mark.parametrize("word", ["yes", "1", "ON"])
def test_use_ray_serve_takes_every_boolean_spelling(word):
    from envlayers.topology import plan

    assert plan({"USE_RAY_SERVE": word, "INFERENCE_ENGINE": "vllm"}).shape == "gateway"


@pytest.mark.parametrize("name", ["ENVLAYERS_READY_TIMEOUT_S", "ENVLAYERS_RANK_START_TIMEOUT"])
def test_in_the_job_a_bad_budget_ends_the_launch_instead_of_the_default(tmp_path, name):
    from envlayers.launch.prepare import Allocation, Node, prepare

    launch = {"INFERENCE_ENGINE": "vllm", "INFERENCE_MODEL": "m", "VLLM_SERVED_MODEL": "s", name: "soon"}
    with pytest.raises(KeyValueError, match=rf"^{name}: must be a positive number of seconds, got 'soon'"):
        prepare(launch, Allocation("1", tmp_path, (Node("n1", "10.0.0.1", True),)))


@pytest.mark.parametrize("env, want", [
    pytest.param({}, None, id="absent"), pytest.param({"INFERENCE_ENGINE": " "}, None, id="empty"),
    pytest.param({"INFERENCE_ENGINE": " vllm "}, "vllm", id="stripped"),
])
def test_a_text_key_reads_as_its_stripped_text_or_none(env, want):
    assert keys.text(env, "INFERENCE_ENGINE") == want


def test_no_hint_asks_to_delete_a_key():
    """A layer can set a key (empty too) but never unset one a lower layer sets."""
    hints = [k.hint for k in keys.KEYS if k.hint] + [keys._hint(k, None) for k in keys.KEYS]
    assert [h for h in hints if any(w in h.lower() for w in ("delete", "unset", "remove"))] == []


# --- allowed values: declared in the table, accepted by the key's reader, shown in the docs --------------

def _readers():
    from envlayers.engines import engine_name
    from envlayers.engines.router import router_choice, router_policy
    from envlayers.runtimes import runtime_name
    from envlayers.topology_checks import backend, mode

    return {
        "CONTAINER_RUNTIME": runtime_name,
        "INFERENCE_ENGINE": engine_name,
        "INFERENCE_MODE": mode,
        "DISTRIBUTED_BACKEND": backend,
        "ROUTER": lambda env: router_choice(env) or "none",  # none: no router
        "ROUTER_POLICY": router_policy,
    }


def test_every_key_with_allowed_values_has_its_reader_checked_here():
    assert {k.name for k in keys.KEYS if k.allowed} == set(_readers())


@pytest.mark.parametrize("name", sorted(_readers()))
def test_a_keys_reader_accepts_exactly_its_allowed_values(name):
    read = _readers()[name]
    for word in keys.allowed(name):
        assert read({name: word}) == word
    for word in ("nope", keys.allowed(name)[0].upper() + "x"):
        with pytest.raises(EnvLayersError):
            read(at_line(name, word))


@pytest.mark.parametrize("name", sorted(_readers()))
def test_the_docs_show_a_keys_allowed_values(name):
    row = next(r for r in (REPO / "docs" / "keys.md").read_text().splitlines() if r.startswith(f"| `{name}` |"))
    assert row.split(" | ")[1] == "one of " + ", ".join(f"`{w}`" for w in keys.allowed(name))


def test_an_empty_container_runtime_is_an_error_naming_its_line_as_the_table_says():
    from envlayers.runtimes import runtime_name

    assert keys.BY_NAME["CONTAINER_RUNTIME"].empty == "error" and runtime_name({}) == "ce"
    with pytest.raises(KeyValueError) as err:
        runtime_name(at_line("CONTAINER_RUNTIME", " "))
    assert str(err.value).startswith(f"{LINE}: CONTAINER_RUNTIME: is empty; it must be one of ce, none, podman, ")
    assert "hint: set CONTAINER_RUNTIME=ce" in str(err.value) and "\n" not in str(err.value)
