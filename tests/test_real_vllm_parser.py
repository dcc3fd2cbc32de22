"""vLLM's own argument parser, the real one (its 0.32 CPU build, tests/realvllm.py), held against what the project
believes about it: the committed choices table (src/envlayers/data/vllm-choices.json), every ``vllm serve``
command line the catalog renders, and the stand-in engine's verdicts (tests/standin/engine.py).

No model is loaded: the real engine parses and checks each command line the way ``vllm serve`` does before it
reads a model (tests/realengine/parse_argv.py, all of them in one process, since importing vLLM takes seconds).
"""

from __future__ import annotations

import importlib.util
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import realvllm

pytestmark = pytest.mark.real_vllm

REPO = Path(__file__).resolve().parents[1]
GEN = REPO / "scripts" / "gen-vllm-choices.py"
PARSE_ARGV = REPO / "tests" / "realengine" / "parse_argv.py"
BASE = ["vllm", "serve", "example/model-7b"]

# refused by the real engine before it reads the model: (id, arguments after BASE)
WRONG = [
    ("sglangs-tool-parser-name", ["--enable-auto-tool-choice", "--tool-call-parser", "qwen25"]),
    ("unknown-reasoning-parser", ["--reasoning-parser", "nope"]),
    ("unknown-executor-backend", ["--distributed-executor-backend", "nope"]),
    ("unknown-flag", ["--no-such-flag"]),
    ("tp-not-a-number", ["--tensor-parallel-size", "two"]),
    ("auto-tool-choice-without-parser", ["--enable-auto-tool-choice"]),
]
# taken by the real engine, though they look wrong or unusual
EDGES = [
    # the tool call parser's name is checked only with --enable-auto-tool-choice
    ("tool-parser-name-without-auto-tool-choice", ["--tool-call-parser", "qwen25"]),
    # a headless rank serves no API: the tool call parser is not checked there
    ("headless-tool-parser-name", ["--headless", "--enable-auto-tool-choice", "--tool-call-parser", "qwen25"]),
    ("snake-case-spelling", ["--tensor_parallel_size", "2"]),
    ("short-flags", ["-tp", "2", "-pp", "1", "-dp", "2"]),
    ("equals-form", ["--reasoning-parser=qwen3", "--distributed-executor-backend=mp"]),
    ("executor-as-a-dotted-class", ["--distributed-executor-backend",
                                    "vllm.v1.executor.uniproc_executor.UniProcExecutor"]),
]


def envlayers(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "envlayers", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120)


def vllm_argv(rank_line: str) -> list[str] | None:
    """The ``vllm serve ...`` words of one rank's command as the dry run prints it (after its environment
    assignments, or after the Ray head's description), or None for a rank that runs no vLLM."""
    at = rank_line.rfind("vllm serve ")
    return shlex.split(rank_line[at:]) if at >= 0 else None


@pytest.fixture(scope="module")
def catalog() -> dict[str, list[list[str]]]:
    """``{"experiment:model": [argv of each vLLM rank]}`` for every vLLM model of the catalog in every experiment
    the launcher would run it in (a target the launcher refuses, like replicas of a model that spans nodes, has no
    command line to check)."""
    listed = envlayers("list", "--json")
    assert listed.returncode == 0, listed.stderr
    data = json.loads(listed.stdout)
    models = [m["name"] for m in data["models"] if m["engine"] == "vllm"]
    assert models, "the catalog has no vLLM model"
    out: dict[str, list[list[str]]] = {}
    for model in models:
        for experiment in (e["name"] for e in data["experiments"]):
            dry = envlayers("serve", "--model", model, "--experiment", experiment, "--dry-run", "--json")
            if dry.returncode != 0:
                assert "error:" in dry.stderr, dry.stderr
                continue
            argvs = [a for a in map(vllm_argv, json.loads(dry.stdout)["ranks"]) if a]
            assert argvs, f"{experiment}:{model}: no rank runs vllm serve"
            out[f"{experiment}:{model}"] = argvs
    assert {t.split(":")[1] for t in out} == set(models), "every vLLM model launches in some experiment"
    return out


def all_argvs(catalog) -> list[list[str]]:
    seen: dict[str, list[str]] = {}
    for argv in [*(a for argvs in catalog.values() for a in argvs), *(BASE + extra for _, extra in WRONG + EDGES)]:
        seen.setdefault(json.dumps(argv), argv)
    return list(seen.values())


@pytest.fixture(scope="module")
def real(catalog) -> dict[str, dict]:
    """The real engine's verdict on each command line, keyed by the argv's JSON."""
    argvs = all_argvs(catalog)
    done = subprocess.run([str(realvllm.python()), str(PARSE_ARGV)], input=json.dumps(argvs), cwd=REPO,
                          env=realvllm.engine_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"parse_argv.py exited {done.returncode}:\n{done.stderr[-3000:]}"
    verdicts = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(verdicts) == len(argvs)
    return {json.dumps(argv): v for argv, v in zip(argvs, verdicts)}


@pytest.fixture(scope="module")
def standin():
    spec = importlib.util.spec_from_file_location("standin_engine_for_parser_test",
                                                  REPO / "tests" / "standin" / "engine.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_choices_table_is_what_the_real_parser_gives():
    done = subprocess.run([str(realvllm.python()), str(GEN), "--check"], cwd=REPO, env=realvllm.engine_env(),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{done.stdout[-6000:]}\n{done.stderr[-2000:]}"
    table = json.loads((REPO / "src" / "envlayers" / "data" / "vllm-choices.json").read_text())
    assert table["engine"] == "vllm" and table["generated_by"] == "scripts/gen-vllm-choices.py"
    assert set(table["choices"]) == {"--tool-call-parser", "--reasoning-parser", "--distributed-executor-backend"}
    assert {"--tensor-parallel-size", "-tp", "--enable-auto-tool-choice"} <= set(table["options"])


def test_the_real_parser_takes_every_vllm_command_line_of_the_catalog(catalog, real):
    refused = [f"{target}: {real[json.dumps(argv)]['error']}\n    {shlex.join(argv)}"
               for target, argvs in catalog.items() for argv in argvs if not real[json.dumps(argv)]["accepted"]]
    assert not refused, "the real vLLM refuses:\n" + "\n".join(refused)


@pytest.mark.parametrize("extra", [pytest.param(extra, id=name) for name, extra in WRONG])
def test_the_real_parser_refuses_a_wrong_command_line(real, extra):
    verdict = real[json.dumps(BASE + extra)]
    assert not verdict["accepted"] and verdict["error"], verdict


@pytest.mark.parametrize("extra", [pytest.param(extra, id=name) for name, extra in EDGES])
def test_the_real_parser_takes_an_unusual_but_valid_command_line(real, extra):
    verdict = real[json.dumps(BASE + extra)]
    assert verdict["accepted"], verdict


def test_the_standin_gives_the_real_parsers_verdict_on_each_command_line(catalog, real, standin):
    differ = []
    for argv in all_argvs(catalog):
        truth = real[json.dumps(argv)]
        mine = standin.vllm_verdict(argv[1:])
        if (mine is None) != truth["accepted"]:
            differ.append(f"{shlex.join(argv)}\n    real: {truth['error'] or 'accepted'}\n    "
                          f"stand-in: {mine or 'accepted'}")
    assert not differ, "the stand-in and the real vLLM disagree:\n" + "\n".join(differ)


def test_the_standin_refuses_in_the_real_engines_words(real, standin):
    """What follows ``error:`` of an argparse refusal, and the exception's message of a later one (which the real
    engine raises inside pydantic's ValidationError for the executor backend, as the stand-in prints it)."""
    for _, extra in WRONG:
        truth, mine = real[json.dumps(BASE + extra)], standin.vllm_verdict(BASE[1:] + extra)
        if truth["stage"] == "argparse":
            assert mine.split(": error: ", 1)[1] == truth["error"].split(": error: ", 1)[1], (extra, mine, truth)
        else:
            assert truth["error"].split(": ", 1)[1] in mine, (extra, mine, truth)
