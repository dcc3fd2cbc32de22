"""Bad job ids for every command that takes one, and malformed `possible:` blocks in the knowledge base:
one line, exit 2, no traceback (run through the real CLI, ``python -m envlayers``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from malformed_tools import assert_clean_error, run_cli

ID_COMMANDS = ["wait", "status", "logs", "stop", "verify", "connect", "release"]
BAD_IDS = [
    pytest.param("12a", "is not a Slurm job id", id="word"),
    pytest.param("1234.", "is not a Slurm job id", id="dangling-dot"),
    pytest.param("1234.x", "is not a Slurm job id", id="unknown-step"),
    pytest.param("1234_5", "is an array task id", id="array-task"),
    pytest.param("1234_[1-3]", "is an array task id", id="array-range"),
    pytest.param("9" * 400, "is not a Slurm job id: more than 4294967295", id="huge-number"),
]


@pytest.mark.parametrize("command", ID_COMMANDS)
@pytest.mark.parametrize("job_id, needle", BAD_IDS)
def test_a_bad_job_id_is_one_line(tmp_path: Path, command: str, job_id: str, needle: str):
    proc = run_cli(command, job_id, cwd=tmp_path, env={"PATH": "/nonexistent", "SCRATCH": ""})
    if needle == "is not a Slurm job id" and command == "verify":
        needle = "is neither a job id nor a URL"  # verify takes a URL too
    assert_clean_error(proc, needle)
    assert len(proc.stderr.strip().splitlines()) == 1


RULE = """rules:
  - id: x
    title: X
    cause: c
    fix: f
    see: docs/diagnose.md
    status: open
    signature: ['boom']
    requires: ['ctx']
{extra}"""


@pytest.mark.parametrize("extra, needle", [
    pytest.param("    possible: yes\n", "possible: must be a mapping", id="not-a-mapping"),
    pytest.param("    possible: {context: ['a'], confirm: 'when x'}\n", "must be a sentence starting with 'if'",
                 id="confirm-not-if"),
    pytest.param("    possible: {confirm: 'if x'}\n", "possible.context: missing", id="no-context"),
    pytest.param("    possible: {context: ['('], confirm: 'if x'}\n", "invalid regular expression", id="bad-regex"),
    pytest.param("    possible: {context: ['a'], confirm: 'if x', when: 1}\n", "possible.when: unknown key",
                 id="unknown-key"),
])
def test_a_malformed_possible_block_is_one_line(tmp_path: Path, extra: str, needle: str):
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULE.format(extra=extra))
    log = tmp_path / "a.log"
    log.write_text("boom\n")
    proc = run_cli("diagnose", "--rules", str(rules), str(log), cwd=tmp_path)
    assert_clean_error(proc, needle, f"{rules}:")


def test_possible_without_requires_is_refused(tmp_path: Path):
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULE.format(extra="    possible: {context: ['a'], confirm: 'if x'}\n").replace(
        "    requires: ['ctx']\n", ""))
    log = tmp_path / "a.log"
    log.write_text("boom\n")
    assert_clean_error(run_cli("diagnose", "--rules", str(rules), str(log), cwd=tmp_path),
                       "only applies to a rule with `requires`")
