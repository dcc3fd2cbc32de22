"""A per-job API key (SERVER_API_KEY_FILE=generate, the default of experiments/serve-only.env) on the real
local Slurm cluster, with the vLLM stand-in: made in the job, 0600 in the run directory, enforced, named by `env_layers connect`, and
never in the job output, a log, a world-readable file or the engine's command line."""

from __future__ import annotations

import json
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from labruns import BANNER, REPO, Run, curl

pytestmark = pytest.mark.slurm


def env_layers(run: Run, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "envlayers", *args], cwd=run.dir,
                          env=dict(run.env, PYTHONPATH=str(REPO / "src")), capture_output=True, text=True,
                          timeout=timeout_s)


def test_a_generated_key_is_enforced_named_and_never_shown(netns_lab, tmp_path):
    run = Run(netns_lab, tmp_path, model="oss120b", SERVE_TIME="00:10:00")  # no key setting: the default
    dry = run.sbatch(submit=False).stdout
    assert not [ln for ln in dry.splitlines() if "would refuse" in ln], dry
    assert "\nexport SERVER_API_KEY_FILE='generate'\n" in dry
    assert "VLLM_API_KEY='***'" in dry
    run.submit()
    text = run.wait_for("^" + re.escape(BANNER), timeout_s=60)
    key_file = run.run_dir / "api-key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    key = key_file.read_text().strip()
    assert len(key) >= 40
    assert f"generated a per-job API key in {key_file} (mode 0600" in text
    assert f"API key: required (the key in {key_file};" in text
    assert run.endpoint()["api_key_file"] == str(key_file)

    # enforced: no key 401, the printed curl (which reads the file) answers
    url = f"http://{netns_lab.nodes['n1']}:8000/v1/models"
    assert curl(url).stdout.endswith("\n401")
    printed = text.split("try (curl):\n", 1)[1].splitlines()[0].strip().replace("http://n1:", f"http://{netns_lab.nodes['n1']}:")
    answer = subprocess.run(["bash", "-c", printed], capture_output=True, text=True, timeout=20)
    assert json.loads(answer.stdout)["choices"][0]["message"]["content"], answer.stdout

    # connect names the file, not the key; ping uses it
    connect = env_layers(run, "connect", run.job_id)
    assert connect.returncode == 0, connect.stderr
    assert f"it is in {key_file}" in connect.stdout and key not in connect.stdout + connect.stderr
    as_json = json.loads(env_layers(run, "connect", run.job_id, "--json").stdout)
    assert as_json["api_key_file"] == str(key_file) and key not in json.dumps(as_json)
    ping = env_layers(run, "ping", run.job_id, "--json")
    assert ping.returncode == 0 and json.loads(ping.stdout)["ok"], ping.stdout + ping.stderr

    # vLLM reads it from VLLM_API_KEY: not on any command line of this machine while it runs
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            assert key not in cmdline.read_bytes().decode(errors="replace"), cmdline
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            pass

    netns_lab.cancel(run.job_id)
    run.state()
    # engines.jsonl is the stand-in's record of what it received (VLLM_* of its environment): the test's
    # instrument, not something the job wrote; it proves the key arrived by environment, not argv
    record = json.loads((tmp_path / "engines.jsonl").read_text().splitlines()[0])
    assert record["env"].get("VLLM_API_KEY") == key and key not in " ".join(record["orig_argv"])
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p not in (key_file, tmp_path / "engines.jsonl")]
    holding = [str(p) for p in written if key in p.read_text(errors="replace")]
    # the job output, logs, serve.env, endpoint.json, ranks.sh...: only the 0600 key file holds the key,
    # so no world-readable file does
    assert not holding, holding
    assert key not in dry
