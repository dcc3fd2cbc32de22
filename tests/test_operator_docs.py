"""docs/operating.md, docs/diagnose.md and the README show the operator output exactly as the code prints it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from envlayers.cli.ops_format import format_table
from envlayers.readiness import Endpoint

REPO = Path(__file__).resolve().parents[1]
RUN = "/capstor/scratch/cscs/alice/inference-server/"
SINGLE = Endpoint("1234", "hpcagent-bench-vllm", "Qwen/Qwen3.8-27B-FP8", "sglang", "single",
                  ["http://nid002140:8000/v1"], False, RUN + "1234", 212.0, ["nid002140"])
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
    pytest.param("docs/operating.md", SINGLE, id="operating-single"),
    pytest.param("docs/operating.md", REPLICAS, id="operating-replicas-keyed"),
    pytest.param("README.md", SINGLE, id="readme-single"),
    pytest.param("docs/access.md", Endpoint("1008", "hpcagent-bench-vllm", "Qwen/Qwen3.8-27B-FP8", "sglang", "single",
                                            ["http://n1:8000/v1"], True, "/tmp/h7d/scratch/inference-server/1008", 2.0,
                                            ["n1"], key_file="/tmp/h7d/api-key"), id="access-keyed"),
])
def test_the_endpoint_block_in_the_docs_is_as_printed(doc, endpoint):
    assert any(endpoint.block() in block for block in fenced(REPO / doc))


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


def test_the_catalog_listing_in_the_readme_is_as_printed():
    # a new catalog model shows in the README's tour as it shows on the terminal
    out = subprocess.run([sys.executable, "-m", "envlayers", "--root", str(REPO), "list"], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert f"$ env_layers list\n{out.stdout}" in fenced(REPO / "README.md")
