"""``env_layers wait JOBID && env_layers verify JOBID`` on the real local Slurm cluster, with the stand-in
engine serving the real rendered SGLang command: the catalog's launch line passes every gate; the same
model launched without its parsers, with metrics off and with a fabric that garbles answers fails them,
each for its reason."""

from __future__ import annotations

import json
import subprocess

import labruns
import pytest

pytestmark = pytest.mark.slurm


class Job(labruns.Job):
    """One serve-only submission from ``tmp_path`` with ``layer`` appended to the operator's env file, and the
    two steps every test here takes: wait, then verify; and the stop."""

    def cli(self, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
        return super().cli(*args, timeout_s=timeout_s)

    def wait_then_verify(self, *verify_args: str) -> tuple[str, subprocess.CompletedProcess]:
        waited = self.cli("wait", self.job_id, "--timeout", "90", "--progress", "none")
        assert waited.returncode == 0, waited.stdout + waited.stderr
        return waited.stdout, self.cli("verify", self.job_id, "--timeout-s", "30", *verify_args)

    def stop(self) -> None:
        res = self.cli("stop", self.job_id, "--json")
        assert res.returncode == 0, res.stdout + res.stderr


def statuses(report: dict) -> dict[str, str]:
    return {c["name"]: c["status"] for c in report["checks"]}


def test_catalog_launch_line_passes_every_gate_with_the_jobs_own_key(netns_lab, tmp_path):
    secret = "sk-lab-verify-5d2e"
    keyfile = tmp_path / "key"
    keyfile.write_text(secret + "\n")
    keyfile.chmod(0o600)
    job = Job(netns_lab, tmp_path, layer=f"SERVER_API_KEY_FILE={keyfile}\n")
    block, res = job.wait_then_verify("--json")
    assert "metrics: http://n1:8000/metrics\n" in block
    assert res.returncode == 0, res.stdout + res.stderr
    report = json.loads(res.stdout)
    assert statuses(report) == {"tools": "pass", "reasoning": "pass", "accuracy": "pass", "metrics": "pass"}
    assert report["target"]["catalog_model"] == "qwen38" and report["target"]["api_key"] == "set"
    assert report["target"]["base_urls"] == [f"http://{netns_lab.nodes['n1']}:8000/v1"]  # the node's address
    text = job.cli("verify", job.job_id, "--check", "metrics", "--check", "tools")
    assert text.returncode == 0 and secret not in res.stdout + res.stderr + text.stdout + text.stderr
    job.stop()
    gone = job.cli("verify", job.job_id)  # endpoint.json is still there, the endpoint is not
    assert gone.returncode == 2 and f"job {job.job_id} has ended" in gone.stderr, gone.stderr


def test_a_job_not_live_yet_cannot_be_verified_and_says_to_wait(netns_lab, tmp_path):
    job = Job(netns_lab, tmp_path, STANDIN_HANG_AT="weights")
    res = job.cli("verify", job.job_id, "--timeout-s", "5")
    assert res.returncode == 2, res.stdout + res.stderr
    assert "has no endpoint.json yet" in res.stderr and f"`env_layers wait {job.job_id}`" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    job.stop()


def test_missing_parsers_metrics_off_and_garbled_answers_fail_for_their_reasons(netns_lab, tmp_path):
    job = Job(netns_lab, tmp_path, layer="REASONING_PARSER=\nTOOL_CALL_PARSER=\nSGLANG_ENABLE_METRICS=false\n",
              STANDIN_WRONG_ANSWERS="1")
    _, res = job.wait_then_verify()
    assert res.returncode == 1, res.stdout + res.stderr
    out = res.stdout
    assert "FAIL  tools      the tool call came back as prose in content" in out
    assert "fix: start the server with --tool-call-parser qwen25" in out  # the catalog entry's parser
    assert "FAIL  reasoning  the reasoning is inline in content" in out
    assert "fix: start the server with --reasoning-parser qwen3" in out
    assert "FAIL  accuracy   0/12 correct" in out and "this job ran with NCCL_NET_GDR_LEVEL=LOC" in out
    assert "SKIP  metrics    turned off for this job (SGLANG_ENABLE_METRICS='false')" in out
    assert out.rstrip().splitlines()[-1] == "verdict: FAILED (0 passed, 3 failed, 1 skipped)"
    job.stop()


def test_replicas_are_verified_one_by_one(netns_lab, tmp_path):
    job = Job(netns_lab, tmp_path, EXPERIMENT="replicas")
    _, res = job.wait_then_verify("--check", "tools", "--check", "metrics", "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    report = json.loads(res.stdout)
    urls = [f"http://{netns_lab.nodes[n]}:8000/v1" for n in ("n1", "n2")]
    assert report["target"]["base_urls"] == urls
    assert [(c["name"], c["url"], c["status"]) for c in report["checks"]] == [
        ("tools", urls[0], "pass"), ("metrics", urls[0][:-3] + "/metrics", "pass"),
        ("tools", urls[1], "pass"), ("metrics", urls[1][:-3] + "/metrics", "pass")]
    job.stop()


def test_the_vllm_catalog_line_passes_every_gate(netns_lab, tmp_path):
    job = Job(netns_lab, tmp_path, model="oss120b")
    block, res = job.wait_then_verify("--json")
    assert "metrics: http://n1:8000/metrics\n" in block
    assert res.returncode == 0, res.stdout + res.stderr
    report = json.loads(res.stdout)
    assert statuses(report) == {"tools": "pass", "reasoning": "pass", "accuracy": "pass", "metrics": "pass"}
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["reasoning"]["summary"].startswith("reasoning separate in reasoning;")  # vLLM's field name
    assert report["target"]["engine"] == "vllm" and checks["accuracy"]["data"]["baseline"] == "oss120b"
    job.stop()
