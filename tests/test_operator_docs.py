"""docs/operating.md, docs/diagnose.md and the README show the operator output exactly as the code prints it."""

from __future__ import annotations

import difflib
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from envlayers.cli.ops_format import format_table
from envlayers.readiness import block
from envlayers.rundir import EndpointRecord as Endpoint

REPO = Path(__file__).resolve().parents[1]
RUN = "/capstor/scratch/cscs/alice/inference-server/"
SINGLE = Endpoint("1234", "hpcagent-bench-vllm", "Qwen/Qwen3.8-27B-FP8", "sglang", "single",  # the default key
                  ["http://nid002140:8000/v1"], True, RUN + "1234", 212.0, ["nid002140"], key_file=RUN + "1234/api-key")
REPLICAS = Endpoint("1240", "hpcagent-bench-vllm", "Qwen/Qwen3.8-27B-FP8", "sglang", "replicas",
                    ["http://nid002140:8000/v1", "http://nid002141:8000/v1"], True, RUN + "1240", 190.0,
                    ["nid002140", "nid002141"], key_file="/users/alice/.config/serve-key")


def fenced(path: Path) -> list[str]:
    """The text of every fenced block, whatever its language tag."""
    blocks, current = [], None
    for line in path.read_text().splitlines(keepends=True):
        if line.startswith("```"):
            if current is None:
                current = []
            else:
                blocks.append("".join(current))
                current = None
        elif current is not None:
            current.append(line)
    return blocks


@pytest.mark.parametrize("doc, endpoint", [
    pytest.param("docs/operating.md", SINGLE, id="operating-single-per-job-key"),
    pytest.param("docs/operating.md", REPLICAS, id="operating-replicas-keyed"),
    pytest.param("README.md", SINGLE, id="readme-single-per-job-key"),
    pytest.param("docs/access.md", Endpoint("1008", "hpcagent-bench-vllm", "Qwen/Qwen3.8-27B-FP8", "sglang", "single",
                                            ["http://n1:8000/v1"], True, "/tmp/h7d/scratch/inference-server/1008", 2.0,
                                            ["n1"], key_file="/tmp/h7d/api-key"), id="access-keyed"),
])
def test_the_endpoint_block_in_the_docs_is_as_printed(doc, endpoint):
    assert any(block(endpoint) in fence for fence in fenced(REPO / doc))


def test_the_status_table_in_the_docs_is_as_printed():
    rows = [dict(job_id="1009", state="RUNNING", nodes=1, time_left_s=595, target="experiment:qwen38",
                 model_id="Qwen/Qwen3.8-27B-FP8", served_name="hpcagent-bench-vllm", phase="live",
                 urls=["http://n1:8000/v1"]),
            dict(job_id="1011", state="RUNNING", nodes=4, time_left_s=14290, target="experiment:glm53",
                 model_id="zai-org/GLM-5.3", served_name="hpcagent-bench-vllm", phase="loading weights 3/4 ranks",
                 urls=[]),
            dict(job_id="1012", state="PENDING (Resources)", nodes=2, time_left_s=14400, target=None, model_id=None,
                 served_name=None, phase=None, urls=[])]
    assert format_table(rows) in fenced(REPO / "docs" / "operating.md")


def test_the_possible_finding_in_the_docs_is_as_printed():
    out = subprocess.run([sys.executable, "-m", "envlayers", "diagnose", "sglang-lone-socket.log"],
                         cwd=REPO / "tests" / "data" / "logs", capture_output=True, text=True, timeout=30)
    assert out.returncode == 1
    assert f"$ env_layers diagnose sglang-lone-socket.log\n{out.stdout}" in fenced(REPO / "docs" / "diagnose.md")


# the commands the catalog alone answers: no job, no Slurm, no file of the reader's
CATALOG_COMMANDS = ("list", "render", "explain", "check", "plan")
DOCS = ("README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md")))


def console_examples(path: Path) -> list[tuple[str, str]]:
    """``(command, what it printed)`` for every ``$ `` line of a ```console block."""
    examples, command, printed, inside = [], None, [], False
    for line in path.read_text().splitlines(keepends=True):
        if line.startswith("```"):
            if inside and command is not None:
                examples.append((command, "".join(printed)))
            inside, command, printed = line.strip() == "```console", None, []
        elif inside and line.startswith("$ "):
            if command is not None:
                examples.append((command, "".join(printed)))
            command, printed = line[2:].rstrip("\n"), []
        elif inside and command is not None:
            printed.append(line)
    return examples


def catalog_examples() -> list:
    return [pytest.param(command, printed, id=f"{doc}: {command}")
            for doc in DOCS for command, printed in console_examples(REPO / doc)
            if command.split()[:1] == ["env_layers"] and command.split()[1:2][0] in CATALOG_COMMANDS
            and "/tmp/" not in command]


def test_the_readme_tour_is_among_the_examples_run():
    # every command of the tour is run below: a fence or a prompt changed by hand cannot drop one silently
    tour = {command.split()[1] for command, _ in console_examples(REPO / "README.md")
            if command.startswith("env_layers ")}
    assert set(CATALOG_COMMANDS) <= tour, tour


@pytest.mark.parametrize("command, printed", catalog_examples())
def test_a_console_example_the_catalog_answers_is_as_printed(tmp_path, command, printed):
    # run as the reader would, pipes and all, with this checkout's catalog; HOME empty: no EDF installed
    define = f"env_layers() {{ {shlex.quote(sys.executable)} -m envlayers --root {shlex.quote(str(REPO))} \"$@\"; }}"
    out = subprocess.run(["bash", "-c", f"{define}\n{command}"], cwd=REPO, capture_output=True, text=True,
                         timeout=60, env={**os.environ, "HOME": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    assert out.stdout == printed, "".join(difflib.unified_diff(printed.splitlines(True), out.stdout.splitlines(True),
                                                               "the docs", "printed now"))
