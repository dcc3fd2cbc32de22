"""SGLang's own argument parser, the real one (SGLang 0.5.23's, loaded without a GPU from VENV/sglang-parser,
which scripts/real-vllm.sh installs beside the real vLLM), held against what the project believes about it:
the committed choices table (src/envlayers/data/sglang-choices.json) and every SGLang command line the
catalog renders. SGLang itself does not run here; its parser does."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import realvllm

pytestmark = pytest.mark.real_vllm

REPO = Path(__file__).resolve().parents[1]
GEN = REPO / "scripts" / "gen-sglang-choices.py"
PARSE = REPO / "tests" / "realengine" / "parse_sglang_argv.py"
LAUNCH = "python3 -m sglang.launch_server "
BASE = ["--model-path", "example/model"]
WRONG = [
    ("unknown-tool-call-parser", ["--tool-call-parser", "nope"]),
    ("unknown-reasoning-parser", ["--reasoning-parser", "nope"]),
    ("unknown-attention-backend", ["--attention-backend", "fast"]),
    ("unknown-flag", ["--no-such-flag"]),
    ("tp-not-a-number", ["--tp-size", "two"]),
]


def env() -> dict:
    return realvllm.engine_env({"PYTHONPATH": str(realvllm.venv() / "sglang-parser")})


def envlayers(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "envlayers", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120)


@pytest.fixture(scope="module")
def catalog() -> dict[str, list[list[str]]]:
    """``{"experiment:model": [the sglang.launch_server words of each rank]}`` for every SGLang catalog model in
    every experiment the launcher runs it in."""
    listed = envlayers("list", "--json")
    assert listed.returncode == 0, listed.stderr
    data = json.loads(listed.stdout)
    models = [m["name"] for m in data["models"] if m["engine"] == "sglang"]
    assert models, "the catalog has no SGLang model"
    out: dict[str, list[list[str]]] = {}
    for model in models:
        for experiment in (e["name"] for e in data["experiments"]):
            dry = envlayers("serve", "--model", model, "--experiment", experiment, "--dry-run", "--json")
            if dry.returncode != 0:
                continue  # a target the launcher refuses (replicas of a model that spans nodes)
            ranks = json.loads(dry.stdout)["ranks"]
            out[f"{experiment}:{model}"] = [shlex.split(r[r.index(LAUNCH) + len(LAUNCH):]) for r in ranks if LAUNCH in r]
    assert {t.split(":")[1] for t in out} == set(models)
    return out


@pytest.fixture(scope="module")
def real(catalog) -> dict[str, dict]:
    argvs = [a for argvs in catalog.values() for a in argvs] + [BASE + extra for _, extra in WRONG]
    done = subprocess.run([str(realvllm.python()), str(PARSE)], input=json.dumps(argvs), cwd=REPO, env=env(),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    verdicts = json.loads(done.stdout.strip().splitlines()[-1])
    return {json.dumps(a): v for a, v in zip(argvs, verdicts)}


def test_the_committed_sglang_table_is_what_the_real_parser_gives():
    done = subprocess.run([str(realvllm.python()), str(GEN), "--check"], cwd=REPO, env=env(), capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, f"{done.stdout[-6000:]}\n{done.stderr[-2000:]}"


def test_the_real_sglang_parser_takes_every_sglang_command_line_of_the_catalog(catalog, real):
    refused = [f"{target}: {real[json.dumps(a)]['error']}" for target, argvs in catalog.items() for a in argvs
               if not real[json.dumps(a)]["accepted"]]
    assert not refused, "the real SGLang parser refuses:\n" + "\n".join(refused)


@pytest.mark.parametrize("extra", [pytest.param(extra, id=name) for name, extra in WRONG])
def test_the_real_sglang_parser_refuses_a_wrong_command_line(real, extra):
    verdict = real[json.dumps(BASE + extra)]
    assert not verdict["accepted"] and ": error: " in verdict["error"], verdict


@pytest.mark.parametrize("extra", [pytest.param(extra, id=name) for name, extra in WRONG[:3]])
def test_the_login_node_refuses_what_the_real_sglang_parser_refuses(real, extra):
    from envlayers.engines.choices import DATA, check, table

    refused, _ = check(BASE + extra, table(DATA / "sglang-choices.json"))
    assert refused and not real[json.dumps(BASE + extra)]["accepted"]
