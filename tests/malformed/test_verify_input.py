"""Bad input to ``env_layers verify``: a clean one-line error (exit 2) naming the file and key path or the
argument, before any request is sent (nothing listens on the URL these cases give)."""

from __future__ import annotations

import pytest

from nettools import free_port
from malformed_tools import assert_clean_error, run_cli

GOOD = """version: 1
default: {min_correct: 11, how: "floor"}
models:
  qwen38: {model: Qwen/Qwen3.8-27B-FP8, min_correct: 11, how: "floor"}
"""


def nobody() -> str:
    return f"http://127.0.0.1:{free_port()}/v1"


@pytest.mark.parametrize("text, needles", [
    pytest.param("version: 1\ndefault: [\n", ["invalid YAML"], id="not-yaml"),
    pytest.param("- a\n- b\n", ["(top): expected a mapping"], id="top-is-a-list"),
    pytest.param(GOOD.replace("version: 1", "version: 2"), ["version: must be 1"], id="version-2"),
    pytest.param(GOOD + "extra: 1\n", ["extra: unknown key"], id="unknown-top-key"),
    pytest.param(GOOD.replace('default: {min_correct: 11, how: "floor"}\n', ""), ["default: missing"],
                 id="no-default"),
    pytest.param(GOOD.replace("model: Qwen/Qwen3.8-27B-FP8, min_correct: 11", "model: Qwen/Qwen3.8-27B-FP8, "
                              "min_correct: eleven"), ["models.qwen38.min_correct: must be a whole number"],
                 id="floor-not-a-number"),
    pytest.param(GOOD.replace("model: Qwen/Qwen3.8-27B-FP8, min_correct: 11", "model: Qwen/Qwen3.8-27B-FP8, "
                              "min_correct: 13"), ["models.qwen38.min_correct: 13 is more than the 12 prompts"],
                 id="floor-above-the-prompt-count"),
    pytest.param(GOOD.replace("{min_correct: 11, how", "{min_correct: -1, how"), ["default.min_correct"],
                 id="negative-floor"),
    pytest.param(GOOD.replace("model: Qwen/Qwen3.8-27B-FP8, ", ""), ["models.qwen38.model: missing"],
                 id="entry-without-model"),
    pytest.param(GOOD.replace('how: "floor"}\nmodels', 'how: ""}\nmodels'), ["default.how: must be a non-empty"],
                 id="empty-how"),
    pytest.param(GOOD.replace('FP8, min_correct: 11, how: "floor"}', 'FP8, min_correct: 11, how: "floor", score: 3}'),
                 ["models.qwen38.score: unknown key"], id="unknown-entry-key"),
    pytest.param(GOOD.replace('FP8, min_correct: 11, how: "floor"}',
                              'FP8, min_correct: 11, how: "floor", measured: 12}'),
                 ["models.qwen38.measured: must be a mapping with score, of and date"], id="measured-not-a-mapping"),
    pytest.param('version: 1\ndefault: {min_correct: 11, how: "floor"}\nmodels: 3\n', ["models: must be a mapping"],
                 id="models-not-a-mapping"),
])
def test_bad_baselines_file(tmp_path, text, needles):
    bad = tmp_path / "baselines.yaml"
    bad.write_text(text)
    proc = run_cli("verify", nobody(), "--baselines", str(bad))
    assert_clean_error(proc, str(bad), *needles)
    assert proc.stdout == ""


@pytest.mark.parametrize("args, needles", [
    pytest.param(["no-such-thing"], ["'no-such-thing' is neither a job id nor a URL"], id="spec-neither"),
    pytest.param(["http://"], ["is not a URL with a host"], id="url-without-host"),
    pytest.param(["{url}", "--timeout-s", "0"], ["--timeout-s"], id="timeout-zero"),
    pytest.param(["{url}", "--check", "speed"], ["--check"], id="unknown-check"),
    pytest.param(["{url}", "--baselines", "/nonexistent/b.yaml"], ["/nonexistent/b.yaml: file not found"],
                 id="baselines-missing"),
    pytest.param(["{url}", "--api-key-file", "{empty}"], ["is empty"], id="empty-key-file"),
    pytest.param(["{url}"], ["no answer from"], id="nothing-listens"),
])
def test_bad_arguments(tmp_path, args, needles):
    empty = tmp_path / "key"
    empty.write_text("\n")
    url = nobody()
    proc = run_cli("verify", *[a.format(url=url, empty=empty) for a in args])
    assert_clean_error(proc, *needles)


@pytest.mark.parametrize("make, needle", [
    pytest.param(lambda p: p.write_text("version: 1\ndefault: " + "[" * 50_000 + "]" * 50_000 + "\n"),
                 ":2: nested more than 64 levels deep", id="deep-nesting"),
    pytest.param(lambda p: p.write_text('version: 1\ndefault: &d {min_correct: 1, how: "x"}\nmodels: {q: *d}\n'),
                 ":2: anchor &d is not allowed", id="anchor"),
    pytest.param(lambda p: __import__("os").mkfifo(p), ": is a FIFO, not a regular file", id="fifo"),
])
def test_a_hostile_baselines_file_is_one_line(tmp_path, make, needle):
    bad = tmp_path / "baselines.yaml"
    make(bad)
    proc = run_cli("verify", nobody(), "--baselines", str(bad), timeout_s=60)
    assert_clean_error(proc, f"{bad}{needle}")
    assert proc.stdout == ""


def test_a_device_as_baselines_is_one_line():
    proc = run_cli("verify", nobody(), "--baselines", "/dev/zero", timeout_s=60)
    assert_clean_error(proc, "/dev/zero: is a character device, not a regular file")
