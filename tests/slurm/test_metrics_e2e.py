"""``curl <base>/metrics`` answers Prometheus text on every catalog model, end to end on the local Slurm lab.

One job per model of the catalog (``catalog.load``: setups.yaml and every layer file), each with its own
layers, node count and shape, submitted with ``cluster/serve-only.sbatch`` as an operator would; the
stand-in engine serves ``/metrics`` only when the real one would (vLLM always, SGLang with
``--enable-metrics``, which the launcher passes unless SGLANG_ENABLE_METRICS turns it off). The URL is
the one the endpoint block prints (the gateway answers it itself, with every replica's samples, each
labelled with its replica, once the gateway says every replica is ready: the endpoint goes live with
the first). A model whose shape the job cannot start yet is skipped with the dry run's own reason, so it is checked here as soon as the launcher starts it. Models that plan more
nodes than the session lab has run on the 4-node lab (fixture ``lab4``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envlayers import catalog
from envlayers.jobscript import prepare
from envlayers.layers import load_env
from labtools import gateway_ready
from labruns import BANNER, KEYLESS, STANDIN, Run

REPO = Path(__file__).resolve().parents[2]
MODELS = sorted(catalog.load(REPO).models)
RAY_SHAPES = ("ray", "gateway")  # a Ray cluster across the allocation (docs/topology.md)
# one sample of the Prometheus text exposition format: name{labels} value [timestamp]
SAMPLE_RE = re.compile(r'[a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*"'
                       r'(,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*")*,?\})? '
                       r'([-+]?[0-9.]+([eE][-+]?[0-9]+)?|[-+]?Inf|NaN)( -?[0-9]+)?\Z')

pytestmark = pytest.mark.slurm


def test_the_catalog_has_the_models_this_file_checks():
    assert {"qwen38", "glm53", "kimi27sglang", "oss120b", "oss20bdp", "qwen38mi200"} <= set(MODELS)


def prometheus_samples(text: str) -> list[str]:
    """The sample lines of a Prometheus text body; an AssertionError names a line that is neither a
    sample, a # comment nor blank."""
    samples = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        assert SAMPLE_RE.match(line), f"not a Prometheus sample line: {line!r}"
        samples.append(line)
    return samples


def settled(lab, timeout_s: float = 120) -> None:
    """Wait until the lab's queue is empty and no node still holds (or completes) a job, so the next job
    gets whole nodes in order."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        queued = lab.run(["squeue", "-h", "-o", "%i"], check=False).stdout.split()
        states = set(lab.run(["sinfo", "-h", "-N", "-o", "%T"], check=False).stdout.split())
        if not queued and not any(s.startswith(("alloc", "compl", "mix")) for s in states):
            return
        time.sleep(0.5)
    raise AssertionError(f"lab not idle after {timeout_s}s: queue {queued}, node states {states}")


@pytest.mark.parametrize("model", MODELS)
def test_every_catalog_model_answers_prometheus_text_on_its_metrics_url(request, tmp_path, model):
    planned = prepare(REPO, model, environ={"HOME": str(tmp_path), "PWD": str(tmp_path)})
    lab = request.getfixturevalue("netns_lab")
    if planned.plan.nodes > len(lab.nodes):  # glm53, kimi27sglang: the 4-node lab
        lab = request.getfixturevalue("lab4")
    assert planned.plan.nodes <= len(lab.nodes), f"{model} plans {planned.plan.nodes} nodes"
    layer, env = KEYLESS, {}  # keyless, acknowledged (lab_ack)
    if planned.plan.shape in RAY_SHAPES:  # real Ray across the lab's nodes, one CPU each; the stand-in checks
        layer += "RAY_NUM_CPUS=1\n"       # that the cluster it joins has every node
        env = {"STANDIN_RAY_NODES": str(planned.plan.nodes),
               "PATH": os.pathsep.join([str(STANDIN / "bin"), str(Path(sys.executable).parent),
                                        lab.env.get("PATH", os.environ["PATH"])])}
    run = Run(lab, tmp_path, model=model, layer=layer, SERVE_TIME="00:10:00", **env)
    run.submit()
    text = run.wait_for("^" + re.escape(BANNER), timeout_s=120)
    url = re.search(r"^metrics: (http://(n\d+):\d+/metrics)$", text, re.M)
    assert url, text
    reachable = url.group(1).replace(f"http://{url.group(2)}:", f"http://{lab.nodes[url.group(2)]}:")
    if planned.plan.shape == "gateway":
        # the endpoint is live with the first replica Serve runs; /metrics holds the replicas registered by then
        # (a replica registers before Serve routes to it). Every replica is once the gateway says they are ready.
        gateway_ready(run, planned.plan.replicas)
    got = subprocess.run(["curl", "-s", "-m", "10", "-D", "-", reachable], capture_output=True, text=True, timeout=20)
    head, _, body = got.stdout.replace("\r\n", "\n").partition("\n\n")
    assert head.startswith("HTTP/1.") and " 200 " in head.splitlines()[0], got.stdout
    assert re.search(r"^content-type: text/plain; version=0\.0\.4", head, re.M | re.I), head
    samples = prometheus_samples(body)
    engine = load_env(REPO, f"experiment:{model}").text()["INFERENCE_ENGINE"]  # the engine's own metric names
    names = {s.split("{")[0].split(" ")[0] for s in samples}
    assert any(n.startswith(f"{engine}:") for n in names), (engine, sorted(names))
    if planned.plan.shape == "gateway":  # the gateway answers itself, with every replica's samples labelled
        labels = {m.group(1) for s in samples for m in [re.match(r'[^{]*\{replica="(\d+)"', s)] if m}
        assert labels == {str(i) for i in range(planned.plan.replicas)}, (labels, body[:2000])
        assert "did not answer" not in body, body[:2000]  # the comment names the replica and why
        assert all(re.match(r'[^{ ]*\{replica="\d+"', s) for s in samples), body[:2000]
    lab.cancel(run.job_id)
    assert run.state() == "CANCELLED"
    settled(lab)
