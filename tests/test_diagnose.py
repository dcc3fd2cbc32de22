"""The diagnosis knowledge base: every rule fires on its symptom, none fires on a healthy log."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from envlayers.cli import cli
from envlayers.diagnose import (
    LogText, RuleError, diagnose, evaluate, input_order, load_rules, parse_rules, read_log, render_markdown,
)
from rundirtools import write_run_dir

LOGS = Path(__file__).parent / "data" / "logs"
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def rules():
    return load_rules()


def logs_of(name: str) -> list[LogText]:
    """A fixture file, or every file of a fixture run directory, named relative to tests/data/logs."""
    path = LOGS / name
    files = sorted(path.iterdir(), key=input_order) if path.is_dir() else [path]
    return [read_log(p, name=str(p.relative_to(LOGS))) for p in files]


# fixture -> (rule that must fire, evidence file:line, every rule id expected to fire on that fixture)
POSITIVE = [
    pytest.param("sglang-host-oom", "host-oom-weight-load", "sglang-host-oom/server-0.log:6",
                 {"host-oom-weight-load", "rank-exited"}, id="host-oom-weight-load"),
    pytest.param("vllm-host-oom", "host-oom-weight-load", "vllm-host-oom/server-0.log:5",
                 {"host-oom-weight-load", "rank-exited"}, id="host-oom-weight-load-vllm"),
    pytest.param("sglang-minimum-viable.log", "weights-exceed-mem-fraction", "sglang-minimum-viable.log:9",
                 {"weights-exceed-mem-fraction"}, id="weights-exceed-mem-fraction"),
    pytest.param("sglang-cpu-trap", "cpu-starved-jit-hang", "sglang-cpu-trap/server-0.log:10",
                 {"cpu-starved-jit-hang", "readiness-budget-spent"}, id="cpu-starved-jit-hang"),
    pytest.param("sglang-one-parser.log", "one-parser-only", "sglang-one-parser.log:1",
                 {"one-parser-only"}, id="one-parser-only"),
    pytest.param("vllm-tool-choice-400.log", "one-parser-only", "vllm-tool-choice-400.log:3",
                 {"one-parser-only"}, id="one-parser-only-vllm-400"),
    pytest.param("sglang-rccl-watchdog.log", "rccl-watchdog-timeout", "sglang-rccl-watchdog.log:8",
                 {"rccl-watchdog-timeout"}, id="rccl-watchdog-timeout"),
    pytest.param("sglang-gdr-rc22.log", "gdr-rdma-register-einval", "sglang-gdr-rc22.log:9",
                 {"gdr-rdma-register-einval"}, id="gdr-rdma-register-einval"),
    pytest.param("sglang-tcp-fallback.log", "rccl-tcp-fallback", "sglang-tcp-fallback.log:5",
                 {"rccl-tcp-fallback"}, id="rccl-tcp-fallback"),
    pytest.param("sglang-net-plugin.log", "net-plugin-init-failed", "sglang-net-plugin.log:4",
                 {"net-plugin-init-failed"}, id="net-plugin-init-failed"),
    pytest.param("sglang-empty-key", "empty-key-flag-still-passed", "sglang-empty-key/serve-only-5003.out:4",
                 {"empty-key-flag-still-passed"}, id="empty-key-flag-still-passed"),
    pytest.param("sglang-empty-value.log", "empty-value-passed-as-flag", "sglang-empty-value.log:3",
                 {"empty-value-passed-as-flag"}, id="empty-value-passed-as-flag"),
    pytest.param("sglang-kv-thrash.log", "prefix-cache-thrashing", "sglang-kv-thrash.log:17",
                 {"prefix-cache-thrashing"}, id="prefix-cache-thrashing"),
    pytest.param("launcher-ranks-not-placed.out", "ranks-not-placed", "launcher-ranks-not-placed.out:3",
                 {"ranks-not-placed"}, id="ranks-not-placed"),
    pytest.param("launcher-step-exited.out", "step-exited-early", "launcher-step-exited.out:5",
                 {"step-exited-early"}, id="step-exited-early"),
    pytest.param("launcher-allocation-mismatch.out", "allocation-node-mismatch",
                 "launcher-allocation-mismatch.out:3", {"allocation-node-mismatch"}, id="allocation-node-mismatch"),
    pytest.param("launcher-step-not-spanning.out", "step-not-spanning", "launcher-step-not-spanning.out:6",
                 {"step-not-spanning"}, id="step-not-spanning"),
    pytest.param("launcher-ray-join.out", "ray-nodes-missing", "launcher-ray-join.out:4",
                 {"ray-nodes-missing", "rank-exited"}, id="ray-nodes-missing"),
    pytest.param("launcher-no-fabric.out", "no-fabric-address", "launcher-no-fabric.out:2",
                 {"no-fabric-address"}, id="no-fabric-address"),
    pytest.param("launcher-budget-clamped.out", "readiness-budget-clamped", "launcher-budget-clamped.out:3",
                 {"readiness-budget-clamped"}, id="readiness-budget-clamped"),
    pytest.param("sglang-cpu-trap", "readiness-budget-spent", "sglang-cpu-trap/serve-only-5002.out:7",
                 {"cpu-starved-jit-hang", "readiness-budget-spent"}, id="readiness-budget-spent"),
    pytest.param("sglang-host-oom", "rank-exited", "sglang-host-oom/serve-only-5001.out:10",
                 {"host-oom-weight-load", "rank-exited"}, id="rank-exited"),
    pytest.param("slurm-oom-kill.out", "step-oom-killed", "slurm-oom-kill.out:3",
                 {"step-oom-killed"}, id="step-oom-killed"),
    pytest.param("vllm-cache-symlink.log", "cache-path-dangles", "vllm-cache-symlink.log:5",
                 {"cache-path-dangles"}, id="cache-path-dangles"),
    pytest.param("sglang-pp2-host-oom", "host-oom-weight-load", "sglang-pp2-host-oom/server-1.log:4",
                 {"host-oom-weight-load", "rank-exited"}, id="host-oom-weight-load-pipeline-rank-1"),
    pytest.param("vllm-pp2-tcp-fallback", "rccl-tcp-fallback", "vllm-pp2-tcp-fallback/server-0.log:4",
                 {"rccl-tcp-fallback"}, id="rccl-tcp-fallback-vllm-pipeline"),
    pytest.param("launcher-core-left.out", "core-dump-left", "launcher-core-left.out:2",
                 {"core-dump-left"}, id="core-dump-left"),
    pytest.param("sglang-rccl-pp-crash.log", "rccl-pipeline-crash", "sglang-rccl-pp-crash.log:17",
                 {"rccl-pipeline-crash"}, id="rccl-pipeline-crash"),
    pytest.param("launcher-fs-freeze.out", "container-fs-freeze", "launcher-fs-freeze.out:9",
                 {"container-fs-freeze"}, id="container-fs-freeze-unkillable-step"),
    pytest.param("vllm-fs-enotconn.log", "container-fs-freeze", "vllm-fs-enotconn.log:8",
                 {"container-fs-freeze"}, id="container-fs-freeze-mount-gone"),
    pytest.param("launcher-run-dir-full.out", "run-dir-unwritable", "launcher-run-dir-full.out:2",
                 {"run-dir-unwritable"}, id="run-dir-unwritable"),
    pytest.param("launcher-env-too-long.out", "env-string-too-long", "launcher-env-too-long.out:2",
                 {"env-string-too-long"}, id="env-string-too-long"),    pytest.param("launcher-engine-core-lost.out", "engine-core-lost", "launcher-engine-core-lost.out:4",
                 {"engine-core-lost"}, id="engine-core-lost"),
    pytest.param("sglang-hip-oom.log", "gpu-out-of-memory", "sglang-hip-oom.log:10",
                 {"gpu-out-of-memory"}, id="gpu-out-of-memory-hip"),
    pytest.param("vllm-0.32-cpu-unknown-flag.log", "engine-flag-unknown", "vllm-0.32-cpu-unknown-flag.log:5",
                 {"engine-flag-unknown"}, id="engine-flag-unknown-real-vllm"),
    pytest.param("vllm-gated-model.log", "hub-gated-model", "vllm-gated-model.log:6",
                 {"hub-gated-model"}, id="hub-gated-model"),
    pytest.param("vllm-disk-full.log", "disk-full", "vllm-disk-full.log:6",
                 {"disk-full"}, id="disk-full-hub-cache"),
    pytest.param("vllm-0.32-cpu-port-in-use.log", "port-in-use", "vllm-0.32-cpu-port-in-use.log:38",
                 {"port-in-use"}, id="port-in-use-real-vllm"),
    pytest.param("sglang-port-in-use.log", "port-in-use", "sglang-port-in-use.log:5",
                 {"port-in-use"}, id="port-in-use-uvicorn"),
]


@pytest.mark.parametrize("line, rule_id", [
    pytest.param("ENVLAYERS-ERROR: rank 1 exited with code 137 before the endpoint was live", "rank-exited",
                 id="rank-exited-without-node"),
    pytest.param("ENVLAYERS-ERROR: rank 0 on nid002140 exited with code 1 after the endpoint was live", "rank-exited",
                 id="rank-exited-after-live"),
    pytest.param("ENVLAYERS-ERROR: srun step exited before all ranks started", "step-exited-early",
                 id="step-exited-without-code"),
    pytest.param("ENVLAYERS-ERROR: no routable fabric IPv4 on the head node", "no-fabric-address",
                 id="no-fabric-ipv4-wording"),
    pytest.param("ENVLAYERS-ERROR: endpoint not live after 7200s", "readiness-budget-spent",
                 id="budget-spent-short-wording"),
    pytest.param("ENVLAYERS-ERROR: cannot write the run directory /s/inference-server/7: Read-only file system "
                 "(creating it); the job ends before any rank starts: free space there, or point SCRATCH (or "
                 "RUN_ROOT) at a writable file system", "run-dir-unwritable", id="run-dir-read-only-before-start"),
    pytest.param("ENVLAYERS-ERROR: the launcher ended with code 143 but could not record it in "
                 "/s/inference-server/7/launch-end.json (No space left on device): live then signal 15",
                 "run-dir-unwritable", id="run-dir-full-at-the-end"),
    pytest.param("ENVLAYERS-WARN: cannot write /s/inference-server/7/accounting.json: No space left on device; the "
                 "job goes on without this record (free space there, or point SCRATCH or RUN_ROOT at a writable "
                 "file system next time)", "run-dir-unwritable", id="run-dir-full-while-live"),
])
def test_launcher_wording_variants(rules, line, rule_id):
    assert [f.rule_id for f in diagnose([LogText("job.out", [line])], rules)] == [rule_id]


@pytest.mark.parametrize("line, rule_id", [
    pytest.param("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. GPU 3 has a total "
                 "capacity of 79.19 GiB of which 1.02 GiB is free.", "gpu-out-of-memory", id="cuda-oom-torch-2.4"),
    pytest.param("RuntimeError: HIP error: out of memory", "gpu-out-of-memory", id="hip-error-string"),
    pytest.param("launch_server.py: error: argument --attention-backend: invalid choice: 'flash' (choose from "
                 "'aiter', 'triton', 'torch_native')", "engine-flag-unknown", id="sglang-invalid-choice"),
    pytest.param("OSError: You are trying to access a gated repo.", "hub-gated-model", id="transformers-gated"),
    pytest.param("requests.exceptions.HTTPError: 403 Client Error: Forbidden for url: "
                 "https://huggingface.co/api/models/meta-llama/Llama-3.1-405B-Instruct-FP8", "hub-gated-model",
                 id="hub-403-token-without-access"),
    pytest.param("OSError: [Errno 122] Disk quota exceeded: '/users/alice/.triton/cache/x.json'", "disk-full",
                 id="quota"),
    pytest.param("torch.distributed.DistNetworkError: The server socket has failed to listen on any local network "
                 "address. port: 29500, useIPv6: 0, code: -98, name: EADDRINUSE, message: address already in use",
                 "port-in-use", id="rendezvous-port-taken"),
])
def test_engine_wording_variants(rules, line, rule_id):
    assert [f.rule_id for f in diagnose([LogText("server-0.log", [line])], rules)] == [rule_id]


@pytest.mark.parametrize("fixture, rule_id, where, expected", POSITIVE)
def test_rule_fires_on_its_symptom(rules, fixture, rule_id, where, expected):
    findings = {f.rule_id: f for f in diagnose(logs_of(fixture), rules)}
    assert set(findings) == expected
    assert findings[rule_id].evidence[0].where == where


def test_every_rule_has_a_positive_test(rules):
    tested = {param.values[1] for param in POSITIVE}
    # a rule with `seen_by:` documents a problem no log shows: it has no signature to test
    assert tested == {rule.id for rule in rules if rule.seen_by is None}


# healthy-vllm-0.32-cpu: a real vLLM 0.32 CPU startup on the lab (tests/slurm/test_real_vllm_e2e.py), which
# prints no "Model loading took"
HEALTHY = ["healthy-sglang-pp4", "healthy-vllm", "healthy-sglang-single", "healthy-vllm-pp2", "healthy-vllm-0.32-cpu"]


@pytest.mark.parametrize("fixture", HEALTHY)
def test_no_rule_fires_on_a_healthy_startup(rules, fixture):
    assert diagnose(logs_of(fixture), rules) == []  # not even a possible finding


@pytest.mark.parametrize("fixture", HEALTHY)
def test_no_rule_fires_on_any_lone_healthy_log(rules, fixture):
    """Each healthy file alone (the context of the others missing) still gives no finding, possible or not."""
    for log in logs_of(fixture):
        assert diagnose([log], rules) == [], log.name


def real_032_cut(after: str) -> list[LogText]:
    """The real vLLM 0.32 CPU log cut after its first line containing ``after``, the rank then killed."""
    lines = (LOGS / "healthy-vllm-0.32-cpu" / "server-0.log").read_text().splitlines()
    cut = next(i for i, line in enumerate(lines) if after in line) + 1
    return [LogText("server-0.log", lines[:cut] + ["ENVLAYERS-STAGE: rank 0 exited with code 137"]),
            LogText("serve-only-9.out", ["ENVLAYERS-STAGE: run_dir=/scratch/9",
                                         "ENVLAYERS-ERROR: rank 0 on n1 exited with code 137 before the endpoint was "
                                         "live"])]


def test_host_oom_fires_on_a_real_032_cpu_log_killed_before_its_weights_were_in(rules):
    findings = {f.rule_id: f for f in diagnose(real_032_cut("Loading safetensors checkpoint shards:   0%"), rules)}
    assert set(findings) == {"host-oom-weight-load", "rank-exited"}
    assert findings["host-oom-weight-load"].evidence[0].text.endswith("Starting to load model /tmp/rv/tiny...")


def test_a_real_032_cpu_log_killed_after_its_loader_said_the_weights_are_in_is_no_weight_load_oom(rules):
    # 0.32 on CPUs ends its weight load with the loader's "Loading weights took", never "Model loading took"
    assert {f.rule_id for f in diagnose(real_032_cut("Loading weights took"), rules)} == {"rank-exited"}


# a lone log: the signature matches, only the context that would confirm it is missing
POSSIBLE = [
    pytest.param("sglang-lone-load-stop.log", "host-oom-weight-load", "sglang-lone-load-stop.log:3",
                 "if this rank was killed", id="sglang-stops-after-load-weight-begin"),
    pytest.param("vllm-lone-load-stop.log", "host-oom-weight-load", "vllm-lone-load-stop.log:2",
                 "if this rank was killed", id="vllm-stops-after-starting-to-load"),
    pytest.param("sglang-lone-socket.log", "rccl-tcp-fallback", "sglang-lone-socket.log:4",
                 "if the job spans more than one node", id="socket-without-the-net-plugin-node-count-unknown"),
]


@pytest.mark.parametrize("fixture, rule_id, where, confirm", POSSIBLE)
def test_partial_evidence_is_a_possible_finding(rules, fixture, rule_id, where, confirm):
    [finding] = diagnose(logs_of(fixture), rules)
    assert (finding.rule_id, finding.certainty, finding.evidence[0].where) == (rule_id, "possible", where)
    assert finding.confirm_if.startswith(confirm)
    assert finding.to_dict()["certainty"] == "possible" and finding.to_dict()["confirm_if"] == finding.confirm_if


@pytest.mark.parametrize("fixture, context", [
    pytest.param("sglang-lone-load-stop.log", "DUE TO TIME LIMIT",
                 id="oom-context-says-the-job-hit-its-time-limit"),
    pytest.param("sglang-lone-load-stop.log", "ENVLAYERS-STAGE: run_dir=/scratch/9",
                 id="oom-context-job-output-without-a-kill"),
    pytest.param("sglang-lone-socket.log", "ENVLAYERS-TOPOLOGY: shape=single nodes=1 tp=4",
                 id="socket-context-one-node"),
])
def test_known_context_that_says_no_leaves_no_finding(rules, fixture, context):
    logs = logs_of(fixture) + [LogText("serve-only-9.out", [f"slurmstepd: error: *** JOB 9 CANCELLED *** {context}"
                                                           if "TIME" in context else context])]
    assert diagnose(logs, rules) == []


def test_cli_marks_a_possible_finding_in_text_and_json():
    result = run("diagnose", str(LOGS / "sglang-lone-socket.log"))
    assert result.exit_code == 1
    lines = result.output.splitlines()
    assert lines[0] == "rccl-tcp-fallback (error, POSSIBLE): Multi-node RCCL running over TCP sockets, not the fabric plugin"
    assert any(line.startswith("  confirm:  holds only if the job spans more than one node") for line in lines)
    assert any(line.startswith(f"  with:     {LOGS / 'sglang-lone-socket.log'}:3: ") for line in lines)
    assert lines[-1] == "1 known issue(s) matched in 1 file(s) (1 of them POSSIBLE: confirm before acting)."
    data = json.loads(run("diagnose", "--json", str(LOGS / "sglang-lone-socket.log")).output)
    assert data["possible"] == 1 and data["findings"][0]["certainty"] == "possible"


def test_libfabric_unable_to_warnings_are_not_failures(rules):
    lines = [
        "libfabric:81424:1764511205::cxi:core:cxip_gen_auth_key_ss_env_get_vni():612<warn> nid002140: "
        "Unable to find SLINGSHOT_VNIS, using default",
        "libfabric:81424:1764511205::cxi:core:cxip_env_init():711<warn> nid002140: Unable to parse "
        "FI_CXI_DEFAULT_TX_SIZE, using 1024",
        "libfabric:81424:1764511206::cxi:ep_ctrl:cxip_ep_enable():402<warn> nid002140: Unable to allocate "
        "EQ buffer",
        "nid002140:81424:81424 [0] NCCL INFO NET/OFI Selected provider is cxi, fabric is cxi (found 4 nics)",
        "nid002140:81424:81424 [0] NCCL INFO Using network AWS Libfabric",
    ]
    assert diagnose([LogText("server-0.log", lines)], rules) == []


def test_weight_load_in_a_lone_log_is_only_a_possible_oom(rules):
    # the same log, but nothing says the rank died: the model may simply still be loading, so the finding
    # is a possible one that names what would confirm it, never a confirmed one
    server_log = [log for log in logs_of("sglang-host-oom") if log.name.endswith("server-0.log")]
    [finding] = diagnose(server_log, rules)
    assert (finding.rule_id, finding.certainty) == ("host-oom-weight-load", "possible")
    assert finding.confirm_if.startswith("if this rank was killed")


def test_cpu_trap_does_not_fire_when_cpus_were_bound(rules):
    logs = logs_of("sglang-cpu-trap") + [LogText("serve.env", ["SLURM_CPUS_PER_TASK=192"])]
    assert "cpu-starved-jit-hang" not in {f.rule_id for f in diagnose(logs, rules)}


def test_tcp_network_on_a_single_node_is_not_a_fallback(rules):
    logs = [LogText("server-0.log", [
        "nid002150:40412:40412 [0] NCCL INFO Using network Socket",
        "nid002150:40412:40530 [0] NCCL INFO comm 0x5610 rank 0 nRanks 4 nNodes 1 localRanks 4 localRank 0",
    ])]
    assert diagnose(logs, rules) == []


def test_empty_key_with_flag_omitted_is_fine(rules):
    # healthy-sglang-pp4 assigns SGLANG_ATTENTION_BACKEND empty and its command has no --attention-backend
    assert "empty-key-flag-still-passed" not in {f.rule_id for f in diagnose(logs_of("healthy-sglang-pp4"), rules)}


def test_cache_hit_rate_is_computed_from_token_counts_when_not_printed(rules):
    rule = next(r for r in rules if r.id == "prefix-cache-thrashing")
    rates = [70, 72, 71, 73, 70, 60, 45, 30, 20, 12, 8, 6]
    lines = [f"[2026-11-30 16:00:{i:02d} TP0] Prefill batch, #new-seq: 2, #new-token: {100 - r}, "
             f"#cached-token: {r}, full token usage: 0.9, #running-req: 16, #queue-req: 0"
             for i, r in enumerate(rates)]
    finding = evaluate(rule, [LogText("server-0.log", lines)])
    assert finding is not None
    assert [e.role for e in finding.evidence] == ["peak", "latest"]
    assert finding.evidence[-1].line == len(lines)


def test_rising_cache_hit_rate_is_healthy(rules):
    rule = next(r for r in rules if r.id == "prefix-cache-thrashing")
    lines = [f"[TP0] Prefill batch. #new-seq: 1, #new-token: 10, #cached-token: {i}, cache hit rate: {5 * i}.00%"
             for i in range(20)]
    assert evaluate(rule, [LogText("server-0.log", lines)]) is None


def test_ansi_colour_codes_do_not_hide_a_signature(rules):
    line = "\x1b[31mENVLAYERS-ERROR: no routable fabric address on the head node\x1b[0m"
    findings = diagnose([LogText("job.out", [line])], rules)
    assert [f.rule_id for f in findings] == ["no-fabric-address"]
    assert findings[0].evidence[0].text == "ENVLAYERS-ERROR: no routable fabric address on the head node"


def test_requires_evidence_is_reported_with_the_signature(rules):
    finding = next(f for f in diagnose(logs_of("sglang-host-oom"), rules) if f.rule_id == "host-oom-weight-load")
    # the server log first, then the copy of its tail that the launcher repeats in the job output
    assert [(e.role, e.where) for e in finding.evidence] == [
        ("signature", "sglang-host-oom/server-0.log:6"),
        ("signature", "sglang-host-oom/serve-only-5001.out:12"),
        ("requires", "sglang-host-oom/serve-only-5001.out:8"),
    ]


# --- validation ------------------------------------------------------------------------------------

GOOD = {"id": "x-rule", "title": "t", "cause": "c", "fix": "f", "status": "open",
        "see": "docs/diagnose.md", "signature": ["boom"]}


@pytest.mark.parametrize("change, message", [
    pytest.param({"signature": ["(unclosed"]}, "rule 'x-rule': signature[0]: invalid regular expression",
                 id="bad-regex"),
    pytest.param({"unles": ["x"]}, "rule 'x-rule': unles: unknown key", id="unknown-key"),
    pytest.param({"cause": None}, "rule 'x-rule': cause: missing", id="missing-cause"),
    pytest.param({"id": "Not_Kebab"}, "id: must be kebab-case", id="id-not-kebab"),
    pytest.param({"status": "done"}, "rule 'x-rule': status: must be one of", id="bad-status"),
    pytest.param({"see": "the design notes"}, "rule 'x-rule': see: must be a page of the project's docs",
                 id="see-not-a-page"),
    pytest.param({"see": {"seed": "004", "section": "s"}}, "rule 'x-rule': see: must be a page", id="see-mapping"),
    pytest.param({"example": "nothing here"}, "rule 'x-rule': example: does not match", id="bad-example"),
    pytest.param({"scope": "first-line"}, "rule 'x-rule': scope: must be one of", id="bad-scope"),
    pytest.param({"requires": [{"pattern": "x", "file": "serve.env"}]},
                 "rule 'x-rule': requires[0].file: unknown key", id="pattern-typo"),
    pytest.param({"trend": {"pattern": "rate: (\\d+)", "drop_points": 5}},
                 "rule 'x-rule': signature: give exactly one", id="signature-and-trend"),
])
def test_invalid_rule_is_rejected_naming_rule_and_key(change, message):
    raw = {**GOOD, **change}
    with pytest.raises(RuleError) as err:
        parse_rules({"version": 1, "rules": [raw]}, origin="kb.yaml")
    assert message in str(err.value)
    assert str(err.value).startswith("kb.yaml: ")


def test_trend_needs_a_value_group():
    raw = {k: v for k, v in GOOD.items() if k != "signature"}
    raw["trend"] = {"pattern": "rate: (\\d+)", "drop_points": 5}
    with pytest.raises(RuleError, match="trend.pattern: needs a named group"):
        parse_rules([raw])


def test_duplicate_rule_id_is_rejected():
    with pytest.raises(RuleError, match="rule 'x-rule': id: duplicate id"):
        parse_rules([GOOD, GOOD])


def test_broken_yaml_names_the_line(tmp_path):
    kb = tmp_path / "kb.yaml"
    kb.write_text("rules:\n  - id: a\n    title: [unclosed\n")
    with pytest.raises(RuleError, match=r"kb\.yaml:\d+: invalid YAML"):
        load_rules(kb)


# --- generated documentation -------------------------------------------------------------------


def test_known_issues_doc_is_up_to_date(rules):
    doc = REPO / "docs" / "known-issues.md"
    assert doc.read_text() == render_markdown(rules), (
        "docs/known-issues.md is stale: run `env_layers diagnose --markdown > docs/known-issues.md`")


# --- CLI ---------------------------------------------------------------------------------------------


def run(*args: str, env: dict | None = None):
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)


def test_cli_exit_0_when_nothing_matched():
    result = run("diagnose", str(LOGS / "healthy-vllm"))
    assert result.exit_code == 0, result.output
    assert "No known issue matched in 3 file(s)" in result.output


def test_input_order_puts_server_logs_first_by_rank():
    names = ["serve.env", "serve-only-9.out", "server-10.log", "server-2.log", "server-0.log", "extra.log"]
    assert sorted(names, key=input_order) == [
        "server-0.log", "server-2.log", "server-10.log", "extra.log", "serve-only-9.out", "serve.env"]


def test_cli_exit_1_with_rule_evidence_cause_and_fix():
    result = run("diagnose", str(LOGS / "sglang-gdr-rc22.log"))
    assert result.exit_code == 1
    assert result.output.startswith("gdr-rdma-register-einval (error): ")
    assert f"evidence: {LOGS / 'sglang-gdr-rc22.log'}:9: " in result.output
    assert "cause:" in result.output and "NCCL_NET_GDR_LEVEL=LOC" in result.output


def test_cli_exit_2_on_a_missing_file():
    result = run("diagnose", "no/such/file.log")
    assert result.exit_code == 2
    assert result.stderr.strip() == "env_layers: error: no such file, directory or job id: no/such/file.log"


def test_cli_job_id_reads_job_output_and_scratch_run_dir(tmp_path):
    submit, scratch = tmp_path / "submit", tmp_path / "scratch"
    run_dir = scratch / "inference-server" / "5001"
    run_dir.mkdir(parents=True)
    submit.mkdir()
    src = LOGS / "sglang-host-oom"
    (submit / "serve-only-5001.out").write_text((src / "serve-only-5001.out").read_text())
    (run_dir / "server-0.log").write_text((src / "server-0.log").read_text())
    result = run("diagnose", "--json", "--root", str(submit), "5001", env={"SCRATCH": str(scratch)})
    assert result.exit_code == 1, result.output
    data = json.loads(result.output)
    assert data["inputs"] == [str(run_dir / "server-0.log"), str(submit / "serve-only-5001.out")]
    assert [f["id"] for f in data["findings"]] == ["host-oom-weight-load", "rank-exited"]


def test_cli_job_id_without_scratch_uses_runs_under_the_submit_dir(tmp_path):
    run_dir = tmp_path / "runs" / "inference-server" / "77"
    run_dir.mkdir(parents=True)
    (run_dir / "server-0.log").write_text("ENVLAYERS-ERROR: no routable fabric address on the head node\n")
    result = run("diagnose", "--root", str(tmp_path), "77", env={"SCRATCH": ""})
    assert result.exit_code == 1
    assert "no-fabric-address" in result.output


def test_cli_unknown_job_id_is_bad_input(tmp_path):
    result = run("diagnose", "--root", str(tmp_path), "424242", env={"SCRATCH": ""})
    assert result.exit_code == 2
    assert "no job 424242: Slurm does not know it" in result.stderr  # what every command says
    # its hint names the form diagnose takes (a run directory as an argument: it has no --run-dir), and it works
    assert "give its run directory (`env_layers diagnose RUN_DIR`)" in result.stderr
    assert "--run-dir" not in result.stderr
    run_dir = tmp_path / "424242"
    run_dir.mkdir()
    (run_dir / "server-0.log").write_text("ENVLAYERS-ERROR: no routable fabric address on the head node\n")
    as_hinted = run("diagnose", str(run_dir))
    assert as_hinted.exit_code == 1 and "no-fabric-address" in as_hinted.output


def test_cli_json_shape():
    result = run("diagnose", "--json", str(LOGS / "launcher-ranks-not-placed.out"))
    assert result.exit_code == 1
    data = json.loads(result.output)
    assert set(data) == {"inputs", "earlier_runs", "matched", "possible", "findings"}
    assert data["matched"] == 1 and data["earlier_runs"] == {}
    finding = data["findings"][0]
    assert set(finding) == {"id", "title", "severity", "status", "evidence", "detail", "cause", "fix", "see",
                            "certainty", "confirm_if"}
    assert (finding["certainty"], finding["confirm_if"]) == ("confirmed", None)
    assert finding["id"] == "ranks-not-placed"
    assert finding["evidence"] == [{
        "file": str(LOGS / "launcher-ranks-not-placed.out"), "line": 3,
        "where": f"{LOGS / 'launcher-ranks-not-placed.out'}:3",
        "text": "ENVLAYERS-ERROR: only 1 of 2 ranks started within 300s (missing: 1): Slurm did not place them, "
                "or the run directory is not shared between nodes", "role": "signature",
    }]
    assert finding["see"] == "docs/operating.md#the-lifecycle"


def test_cli_json_when_nothing_matched():
    result = run("diagnose", "--json", str(LOGS / "healthy-sglang-pp4"))
    assert result.exit_code == 0
    assert json.loads(result.output)["findings"] == []


def test_a_pattern_never_matches_across_lines():
    # found with one search over the whole file, but each candidate is checked on its own line
    raw = {**GOOD, "signature": ["alpha[^']*omega"]}
    rule = parse_rules([raw])[0]
    assert evaluate(rule, [LogText("a.log", ["alpha", "omega"])]) is None
    finding = evaluate(rule, [LogText("a.log", ["alpha", "omega", "alpha and omega"])])
    assert finding.evidence[0].where == "a.log:3"


def test_not_followed_by_only_looks_later_in_the_same_file():
    raw = {**GOOD, "signature": ["begin"], "not_followed_by": ["end"]}
    rule = parse_rules([raw])[0]
    assert evaluate(rule, [LogText("a.log", ["begin", "end"])]) is None
    assert evaluate(rule, [LogText("a.log", ["end", "begin"])]).evidence[0].where == "a.log:2"
    assert evaluate(rule, [LogText("a.log", ["begin"]), LogText("b.log", ["end"])]).evidence[0].where == "a.log:1"


def test_files_glob_limits_a_pattern_to_matching_inputs():
    raw = {**GOOD, "signature": [{"pattern": "boom", "files": "server-*.log"}]}
    rule = parse_rules([raw])[0]
    assert evaluate(rule, [LogText("job.out", ["boom"])]) is None
    assert evaluate(rule, [LogText("run/server-1.log", ["boom"])]) is not None


def test_cli_directory_without_logs_is_bad_input(tmp_path):
    result = run("diagnose", str(tmp_path))
    assert result.exit_code == 2
    assert "no *.log, *.out or serve.env in" in result.stderr


def test_cli_job_id_follows_the_run_dir_named_in_the_job_output(tmp_path):
    run_dir = tmp_path / "elsewhere" / "88"
    run_dir.mkdir(parents=True)
    (run_dir / "server-0.log").write_text("nid1:1:1 [0] NCCL WARN Failed to initialize any NET plugin\n")
    (tmp_path / "serve-only-88.out").write_text(f"ENVLAYERS-STAGE: run_dir={run_dir}\n")
    result = run("diagnose", "--json", "--root", str(tmp_path), "88", env={"SCRATCH": str(tmp_path / "nope")})
    assert result.exit_code == 1, result.output
    data = json.loads(result.output)
    assert data["inputs"] == [str(run_dir / "server-0.log"), str(tmp_path / "serve-only-88.out")]
    assert [f["id"] for f in data["findings"]] == ["net-plugin-init-failed"]


def test_knowledge_base_covers_the_startup_symptoms_and_the_launcher_failures(rules):
    required = {
        # SGLang startup symptoms, absent-vs-empty, prefix-cache hit rate under load
        "host-oom-weight-load", "weights-exceed-mem-fraction", "cpu-starved-jit-hang", "one-parser-only",
        "rccl-watchdog-timeout", "gdr-rdma-register-einval", "rccl-tcp-fallback", "empty-key-flag-still-passed",
        "prefix-cache-thrashing",
        # the launcher's bounded startup waits
        "ranks-not-placed", "step-exited-early", "no-fabric-address", "readiness-budget-clamped",
    }
    assert required <= {rule.id for rule in rules}


def test_cli_markdown_prints_the_known_issues_doc(rules):
    result = run("diagnose", "--markdown")
    assert result.exit_code == 0, result.output
    assert result.output == render_markdown(rules)


def test_there_is_one_command_line_for_diagnose():
    """The click command is the only CLI: the package has no argparse parser and no __main__."""
    import envlayers.diagnose as pkg

    folder = Path(pkg.__file__).parent
    assert not (folder / "__main__.py").exists()
    assert not hasattr(pkg, "main")
    assert all("argparse" not in p.read_text() for p in folder.glob("*.py"))


def test_cli_labels_trend_evidence_as_peak_and_latest():
    result = run("diagnose", str(LOGS / "sglang-kv-thrash.log"))
    assert result.exit_code == 1
    lines = result.output.splitlines()
    assert lines[1].startswith(f"  peak:     {LOGS / 'sglang-kv-thrash.log'}:17: ")
    assert lines[2].startswith(f"  latest:   {LOGS / 'sglang-kv-thrash.log'}:35: ")
    assert lines[3].startswith("  detail:   fell from 71.5 ")


def test_a_trend_from_token_counts_alone_when_the_engine_prints_no_hit_rate(tmp_path):
    # SGLang versions that print only #new-token and #cached-token: the hit rate is cached / (cached + new)
    lines = re.sub(r", cache hit rate: [\d.]+%", "", (LOGS / "sglang-kv-thrash.log").read_text()).splitlines()
    assert len(lines) == 35 and "cache hit rate" not in "\n".join(lines)
    stamp = "[2026-11-30 16:16:54 TP0] Prefill batch. #new-seq: 1, "
    lines.append(stamp + "#new-token: 0, #cached-token: 0, token usage: 0.99, #running-req: 32, #queue-req: 8")  # no rate
    lines.append(stamp + "#new-token: 1000, #cached-token: 1000, token usage: 0.99, #running-req: 32, #queue-req: 8")
    log = tmp_path / "sglang-counts.log"
    log.write_text("\n".join(lines) + "\n")
    result = run("diagnose", str(log))
    assert result.exit_code == 1, result.output
    out = result.output.splitlines()
    assert out[1].startswith(f"  peak:     {log}:17: ")
    assert out[2].startswith(f"  latest:   {log}:37: ")  # the 50% line; the 0/0 line before it carries no rate
    # the last four rates: 810/9002, 712/8904, 616/8808 and 1000/2000, in percent
    latest = (100 * 810 / 9002 + 100 * 712 / 8904 + 100 * 616 / 8808 + 50.0) / 4
    assert out[3].startswith(f"  detail:   fell from 71.5 (peak mean of 4 consecutive lines) to {latest:.1f} "), out[3]


@pytest.mark.parametrize("code, fires", [("137", True), ("1", True), ("0", False), ("143", False), ("130", False)],
                         ids=["sigkill", "error", "clean-stop", "sigterm", "sigint"])
def test_rank_exit_line_in_a_server_log_alone_is_diagnosed(tmp_path, code, fires):
    log = tmp_path / "server-1.log"
    log.write_text(f"ENVLAYERS-STAGE: rank 1 up on n2\n[2026-12-02 10:00:00] Load weight begin.\n"
                   f"ENVLAYERS-STAGE: rank 1 exited with code {code}\n")
    result = run("diagnose", "--json", str(log))
    ids = [f["id"] for f in json.loads(result.output)["findings"]]
    assert ("rank-exited" in ids) is fires


def test_host_oom_evidence_names_the_killed_rank_not_the_one_srun_stopped(tmp_path):
    stopped, killed = tmp_path / "server-0.log", tmp_path / "server-1.log"
    stopped.write_text("ENVLAYERS-STAGE: rank 0 up on n1\n[2026-12-02 10:00:00 PP0 TP0] Load weight begin. "
                       "avail mem=116.20 GB\nENVLAYERS-STAGE: rank 0 exited with code 0\n")
    killed.write_text("ENVLAYERS-STAGE: rank 1 up on n2\n[2026-12-02 10:00:00 PP1 TP0] Load weight begin. "
                      "avail mem=116.20 GB\nENVLAYERS-STAGE: rank 1 exited with code 137\n")
    result = run("diagnose", "--json", str(stopped), str(killed))
    (finding,) = [f for f in json.loads(result.output)["findings"] if f["id"] == "host-oom-weight-load"]
    assert [e["file"] for e in finding["evidence"]][:1] == [str(killed)]
    assert finding["evidence"][-1]["text"] == "ENVLAYERS-STAGE: rank 1 exited with code 137"


# --- the trend rule's boundary ------------------------------------------------------------------------

TREND_RULE = {"id": "falling-value", "title": "t", "cause": "c", "fix": "f", "status": "open", "see": "docs/diagnose.md",
              "trend": {"pattern": r"value: (?P<value>\d+)", "min_points": 10, "drop_points": 20}}


@pytest.mark.parametrize("latest, fires", [
    pytest.param(30, True, id="drop-equal-to-drop_points-fires"),
    pytest.param(31, False, id="drop-one-below-does-not"),
])
def test_trend_fires_when_the_drop_equals_drop_points(latest, fires):
    # 10 points -> windows of 3: the peak mean is 50, the last window's mean is `latest`
    values = [50, 50, 50, 40, 40, 40, 40, latest, latest, latest]
    rule = parse_rules([TREND_RULE])[0]
    finding = evaluate(rule, [LogText("server-0.log", [f"value: {v}" for v in values])])
    assert (finding is not None) == fires
    if fires:
        assert finding.detail.startswith("fell from 50.0 (peak mean of 3 consecutive lines) to 30.0")


# --- references a user can follow ----------------------------------------------------------------------


def _slug(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading."""
    import re

    return re.sub(r"[^a-z0-9 _-]", "", heading.strip().lower()).replace(" ", "-")


def test_every_rule_points_to_a_page_and_section_that_exist(rules):
    for rule in rules:
        if rule.see.startswith("https://"):
            continue
        page, _, anchor = rule.see.partition("#")
        path = REPO / page
        assert path.is_file(), f"{rule.id}: see: {rule.see}: no such page"
        if anchor:
            slugs = {_slug(line.lstrip("#")) for line in path.read_text().splitlines() if line.startswith("#")}
            assert anchor in slugs, f"{rule.id}: see: {rule.see}: no such section (have {sorted(slugs)})"


def test_cli_prints_where_to_read_more():
    result = run("diagnose", str(LOGS / "launcher-ranks-not-placed.out"))
    assert "  see:      docs/operating.md#the-lifecycle\n" in result.output
    assert "seed" not in result.output and "source:" not in result.output


# --- the launcher's end, and requeued jobs -----------------------------------------------------------------


def _fake_slurm(tmp_path: Path, job_id: str, state: str, exit_code: str, stdout: Path) -> dict:
    """A `scontrol` on PATH that reports one job, as Slurm prints it (`scontrol show job -o`)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = (f"JobId={job_id} JobName=serve-only UserId=u(1000) JobState={state} Reason=None "
              f"ExitCode={exit_code} RunTime=00:03:10 TimeLimit=04:00:00 NumNodes=1 NodeList=n1 "
              f"StdOut={stdout} WorkDir={stdout.parent}")
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f"#!/bin/sh\necho '{record}'\n")
    scontrol.chmod(0o755)
    import os

    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


def _job_run_dir(tmp_path: Path, job_id: str) -> Path:
    return write_run_dir(tmp_path / "scratch" / "inference-server" / job_id,
                         {"server-0.log": (LOGS / "healthy-vllm" / "server-0.log").read_text()})


@pytest.mark.parametrize("state, exit_code, end_record, expected", [
    pytest.param("FAILED", "0:9", False, "Slurm: State=FAILED, ExitCode=0:9 (killed by signal 9)", id="sigkill"),
    pytest.param("OUT_OF_MEMORY", "0:125", False, "Slurm: State=OUT_OF_MEMORY, ExitCode=0:125 (killed by signal 125)",
                 id="oom-killer"),
    pytest.param("FAILED", "1:0", True, None, id="orderly-end-reported"),
    pytest.param("RUNNING", "0:0", False, None, id="still-running"),
])
def test_cli_says_the_launcher_died_when_an_ended_job_left_no_end_record(tmp_path, state, exit_code, end_record,
                                                                        expected):
    run_dir = _job_run_dir(tmp_path, "9001")
    if end_record:
        (run_dir / "launch-end.json").write_text(json.dumps(
            {"restart": 0, "code": 1, "reason": "rank 0 exited", "ended_at": "2026-12-02T10:00:00Z"}))
    env = _fake_slurm(tmp_path, "9001", state, exit_code, tmp_path / "serve-only-9001.out")
    env["SCRATCH"] = str(tmp_path / "scratch")
    result = run("diagnose", "--json", "--root", str(tmp_path), "9001", env=env)
    data = json.loads(result.output)
    died = [f for f in data["findings"] if f["id"] == "launcher-died"]
    if expected is None:
        assert died == [] and result.exit_code == 0, result.output
        return
    assert result.exit_code == 1, result.output
    assert died[0]["detail"] == f"no launch-end.json in {run_dir}; {expected}"
    assert died[0]["title"] == "The launcher died without reporting"
    text = run("diagnose", "--root", str(tmp_path), "9001", env=env).output
    assert text.startswith("launcher-died (error): The launcher died without reporting\n")
    assert expected in " ".join(text.split())  # wrapped at 100 columns


def test_a_requeued_job_is_diagnosed_from_its_current_run_only(tmp_path):
    run_dir = _job_run_dir(tmp_path, "9002")
    earlier = run_dir / "run-0"
    earlier.mkdir()
    (earlier / "server-0.log").write_text("ENVLAYERS-ERROR: no routable fabric address on the head node\n")
    (earlier / "launch-end.json").write_text("{}")
    (run_dir / "run-1").mkdir()
    result = run("diagnose", "--json", str(run_dir))
    data = json.loads(result.output)
    assert result.exit_code == 0, result.output
    assert data["inputs"] == [str(run_dir / "server-0.log")]
    assert data["earlier_runs"] == {str(run_dir): ["run-0", "run-1"]}
    text = run("diagnose", str(run_dir)).output
    assert text.splitlines()[0] == (f"{run_dir}: the job was requeued; earlier runs in run-0/, run-1/ are not read "
                                    "(pass one as RUNDIR to diagnose it)")
    assert run("diagnose", str(earlier)).exit_code == 1  # an earlier run can still be diagnosed on its own


@pytest.mark.parametrize("args, needle", [
    pytest.param((), "give a JOBID, a log file or a run directory", id="nothing-to-read"),
    pytest.param(("--markdown", "x.log"), "--markdown takes no JOBID", id="markdown-with-targets"),
])
def test_cli_usage_errors(args, needle):
    result = run("diagnose", *args)
    assert result.exit_code == 2 and needle in result.stderr


def test_a_launcher_that_said_its_end_in_the_job_output_did_not_die(tmp_path):
    # launch-end.json could not be written (a full file system): the job output holds the end, so diagnose
    # names the full run directory, not a killed launcher
    run_dir = _job_run_dir(tmp_path, "9003")
    out = tmp_path / "serve-only-9003.out"
    out.write_text(f"ENVLAYERS-STAGE: run_dir={run_dir}\nENVLAYERS-ERROR: the launcher ended with code 143 but "
                   f"could not record it in {run_dir}/launch-end.json (No space left on device): live then signal 15\n")
    env = _fake_slurm(tmp_path, "9003", "CANCELLED", "0:15", out)
    env["SCRATCH"] = str(tmp_path / "scratch")
    data = json.loads(run("diagnose", "--json", "--root", str(tmp_path), "9003", env=env).output)
    assert [f["id"] for f in data["findings"]] == ["run-dir-unwritable"], data
