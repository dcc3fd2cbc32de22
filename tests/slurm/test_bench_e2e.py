"""``env_layers bench JOBID`` on the real local Slurm cluster: a stand-in job with a key, streaming at a
configured pace, is found by its job id (base URL on the lab node's address, served model name, the
job's key file) and loaded at two concurrency levels; the numbers match the configured pace."""

from __future__ import annotations

import json
import os
from pathlib import Path
from urllib.parse import urlsplit

from labruns import Run, env_layers

REPO = Path(__file__).resolve().parents[2]
TTFT_S, TOKENS_PER_S, TOKENS = 0.2, 50.0, 16


def test_bench_a_job_by_its_id(slurm_lab, tmp_path):
    key = "k3y-" + os.urandom(6).hex()
    key_file = tmp_path / "api-key"
    key_file.write_text(key + "\n")
    key_file.chmod(0o600)
    run = Run(slurm_lab, tmp_path, layer=f"SERVER_API_KEY_FILE={key_file}\n", SERVE_TIME="00:10:00",
              STANDIN_TTFT_S=str(TTFT_S), STANDIN_TOKENS_PER_S=str(TOKENS_PER_S),
              PYTHONPATH=f"{REPO / 'tests' / 'standin' / 'pypath'}:{REPO / 'src'}")
    run.submit()
    live = env_layers(run, "wait", run.job_id, "--timeout", "60", "--progress", "none")
    assert live.returncode == 0, live.stdout + live.stderr
    try:
        done = env_layers(run, "bench", run.job_id, "--concurrency", "1,4", "--requests", "8",
                          "--output-tokens", str(TOKENS), "--duration-s", "30", "--timeout-s", "20", "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        data = json.loads(done.stdout)
        endpoint = run.endpoint()
        host = urlsplit(data["target"]["base_url"]).hostname
        assert host != "127.0.0.1" and host in json.dumps(endpoint)  # the lab node's recorded address
        assert data["target"]["model"] == endpoint["served_model_name"]
        assert data["target"]["what"] == f"job {run.job_id}"
        assert key not in done.stdout + done.stderr  # the job's key file was used, never shown
        e2e = TTFT_S + (TOKENS - 1) / TOKENS_PER_S
        for lv in data["levels"]:
            assert (lv["ok"], lv["errors"], lv["output_tokens"]) == (8, 0, 8 * TOKENS)
            assert TTFT_S * 0.9 <= lv["ttft_s"]["p50"] <= TTFT_S + 0.4
            assert 0.9 / TOKENS_PER_S <= lv["itl_s"]["p50"] <= 2.0 / TOKENS_PER_S + 0.01
            assert e2e * 0.9 <= lv["e2e_s"]["p50"] <= e2e * 1.5 + 0.4
        assert data["levels"][1]["output_tokens_per_s"] > 2 * data["levels"][0]["output_tokens_per_s"]
        table = env_layers(run, "bench", run.job_id, "--concurrency", "2", "--requests", "2",
                           "--output-tokens", "4")
        assert table.returncode == 0 and f"(model {endpoint['served_model_name']})" in table.stdout, table.stderr
    finally:
        env_layers(run, "stop", run.job_id, timeout_s=90)
