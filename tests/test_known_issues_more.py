"""The RCCL pipeline crash, the container filesystem freeze and garbled output in the knowledge base.

The positive cases (a realistic log per signature) are in tests/test_diagnose.py's POSITIVE table with the
other rules; here: what must not fire, the rule no log shows (`seen_by:`), and how such a rule is validated
and documented.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from envlayers.diagnose import LogText, RuleError, diagnose, load_rules, parse_rules, render_markdown

LOGS = Path(__file__).parent / "data" / "logs"
RCCL_ERROR = ("torch.distributed.DistBackendError: NCCL error in: /app/pytorch/torch/csrc/distributed/c10d/"
              "ProcessGroupNCCL.cpp:3675, unhandled system error (run with NCCL_DEBUG=INFO for details), "
              "NCCL version 2.26.6")


@pytest.fixture(scope="module")
def rules():
    return load_rules()


def ids(logs, rules) -> list[str]:
    return [f.rule_id for f in diagnose(logs, rules)]


@pytest.mark.parametrize("lines, expected", [
    pytest.param(["server_args=ServerArgs(model_path='zai-org/GLM-5.3', tp_size=4, pp_size=4, nnodes=4)", RCCL_ERROR],
                 ["rccl-pipeline-crash"], id="pp4-server-args"),
    pytest.param(["ENVLAYERS-STAGE: rank 1 on nid002141: python3 -m sglang.launch_server --tp-size 4 --pp-size 4",
                  RCCL_ERROR], ["rccl-pipeline-crash"], id="pp4-command-line"),
    pytest.param(["server_args=ServerArgs(model_path='Qwen/Qwen3.8-27B-FP8', tp_size=4, pp_size=1, nnodes=1)",
                  RCCL_ERROR], [], id="one-node-is-not-a-pipeline"),
    pytest.param(["server_args=ServerArgs(model_path='zai-org/GLM-5.3', tp_size=4, pp_size=4, nnodes=4)",
                  "terminate called after throwing an instance of 'c10::DistBackendError'"], [],
                 id="watchdog-terminate-is-not-the-crash"),
])
def test_rccl_pipeline_crash_needs_the_rccl_error_on_a_pipeline(rules, lines, expected):
    assert [i for i in ids([LogText("server-1.log", lines)], rules) if i == "rccl-pipeline-crash"] == expected


def test_the_single_node_rccl_error_log_fires_nothing(rules):
    path = LOGS / "sglang-rccl-error-single-node.log"
    assert ids([LogText(path.name, path.read_text().splitlines())], rules) == []


@pytest.mark.parametrize("line", [
    pytest.param("slurmstepd: error: *** JOB 4311 ON nid002140 CANCELLED AT 2026-12-01T10:40:12 ***", id="cancel"),
    pytest.param("slurmstepd: error: *** JOB 4311 ON nid002140 CANCELLED AT 2026-12-01T10:40:12 DUE TO TIME LIMIT ***",
                 id="time-limit"),
    pytest.param("OSError: [Errno 28] No space left on device: '/root/.triton/cache'", id="other-errno"),
])
def test_an_ordinary_end_is_not_a_filesystem_freeze(rules, line):
    assert "container-fs-freeze" not in ids([LogText("job.out", [line])], rules)


def test_garbled_output_is_documented_but_never_fires(rules):
    (rule,) = [r for r in rules if r.id == "garbled-output"]
    assert rule.signature == () and rule.trend is None
    assert "env_layers verify" in rule.seen_by and rule.see == "docs/verify.md#accuracy"
    # even on every log of the corpus together
    logs = [LogText(str(p.relative_to(LOGS)), p.read_text(errors="replace").splitlines())
            for p in sorted(LOGS.rglob("*")) if p.is_file()]
    assert "garbled-output" not in ids(logs, rules)
    doc = render_markdown(rules)
    section = doc.split("## garbled-output\n", 1)[1].split("\n## ", 1)[0]
    assert "Signature: none; no log shows it. Seen by: `env_layers verify JOBID`" in section
    assert "See: [docs/verify.md#accuracy](verify.md#accuracy)." in section


def test_the_three_are_in_the_generated_doc(rules):
    doc = render_markdown(rules)
    for rid in ("rccl-pipeline-crash", "container-fs-freeze", "garbled-output"):
        assert f"| [`{rid}`](#{rid}) |" in doc and f"\n## {rid}\n" in doc


BASE = {"id": "x", "title": "t", "status": "open", "cause": "c", "fix": "f", "see": "docs/verify.md"}


@pytest.mark.parametrize("extra, message", [
    pytest.param({}, "rule 'x': signature: give exactly one of `signature` and `trend`", id="nothing"),
    pytest.param({"signature": "a", "seen_by": "verify"},
                 "rule 'x': seen_by: only for a rule without `signature` or `trend`", id="signature-and-seen-by"),
    pytest.param({"seen_by": "  "}, "rule 'x': seen_by: must be a non-empty string", id="blank"),
    pytest.param({"seen_by": ["verify"]}, "rule 'x': seen_by: must be a non-empty string", id="list"),
    pytest.param({"seen_by": "verify", "example": "a line"}, "rule 'x': example: a rule no log shows has no example",
                 id="example-without-signature"),
])
def test_seen_by_is_validated(extra, message):
    with pytest.raises(RuleError) as err:
        parse_rules([{**BASE, **extra}])
    assert str(err.value).startswith("<rules>: " + message), str(err.value)


def test_a_seen_by_rule_loads(tmp_path):
    (rule,) = parse_rules([{**BASE, "seen_by": " the accuracy check fails "}])
    assert rule.seen_by == "the accuracy check fails" and rule.signature == ()
