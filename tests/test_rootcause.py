"""The root-cause line of an engine's log (rootcause.py), on logs the real vLLM 0.32 CPU build printed
(tests/data/rootcause/) and on the shapes of the other engines' errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from envlayers.rootcause import MAX_CHARS, clean, root_cause

DATA = Path(__file__).parent / "data" / "rootcause"


def test_a_refused_kv_cache_size_is_the_workers_value_error_not_the_last_line():
    lines = (DATA / "vllm-0.32-cpu-kv-cache-space.log").read_text().splitlines()
    assert lines[-3].startswith("RuntimeError: Engine core initialization failed. See root cause above.")
    assert root_cause(lines) == (
        "ValueError: Available memory on node 0 (6.67/7.96 GiB) on kv cache allocation is less than requested "
        "memory for kv (100000.0 GiB). Decrease --kv-cache-memory-bytes, VLLM_CPU_KVCACHE_SPACE, or reduce CPU "
        "memory used by other processes.")


def test_a_pydantic_refusal_carries_the_reason_from_the_next_line():
    cause = root_cause((DATA / "vllm-0.32-cpu-max-model-len.log").read_text().splitlines())
    assert cause.startswith("pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig: "
                            "Value error, User-specified max_model_len (100000) is greater than the derived")
    assert len(cause) == MAX_CHARS and cause.endswith("...")


@pytest.mark.parametrize("lines, cause", [
    pytest.param(["INFO 12-03 10:00:00 [api_server.py:1] vLLM API server version 0.32.0",
                  "vllm serve: error: argument --tool-call-parser: invalid choice: 'qwen25' (choose from hermes)"],
                 "vllm serve: error: argument --tool-call-parser: invalid choice: 'qwen25' (choose from hermes)",
                 id="argparse"),
    pytest.param(["(EngineCore pid=9) ERROR 12-03 10:00:00 [core.py:1] Traceback (most recent call last):",
                  "(EngineCore pid=9) ERROR 12-03 10:00:00 [core.py:1]     assert self.intermediate_tensors is not None",
                  "(EngineCore pid=9) ERROR 12-03 10:00:00 [core.py:1] AssertionError",
                  "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"],
                 "AssertionError at: assert self.intermediate_tensors is not None", id="bare-assertion-under-a-wrapper"),
    pytest.param(["[2026-12-03 10:00:00 TP0] Scheduler hit an exception: Traceback (most recent call last):",
                  "[2026-12-03 10:00:00 TP0] torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 GiB"],
                 "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 GiB", id="sglang-prefix"),
    pytest.param(["\x1b[1;31mValueError: bad\x1b[0m"], "ValueError: bad", id="colour-codes"),
    pytest.param(["ERROR 12-03 10:00:00 [serving.py:1] ValueError: prompt too long",
                  "INFO:     Application startup complete.", "ENVLAYERS-STAGE: rank 0 exited with code 137"],
                 None, id="an-error-before-readiness-is-not-the-cause-of-a-later-death"),
    pytest.param(["Loading weights took 0.02 seconds", "Killed"], None, id="no-error-line"),
    pytest.param(["RuntimeError: Engine core initialization failed. See root cause above."], None,
                 id="only-the-wrapper"),
    pytest.param(["WARNING 12-03 10:00:00 [x.py:1] Found ulimit: errors like `OSError: [Errno 24] Too many`",
                  "KeyError: 'model_type'"], "KeyError: 'model_type'", id="an-error-named-inside-a-warning"),
])
def test_root_cause(lines, cause):
    assert root_cause(lines) == cause


def test_clean_removes_the_process_and_logging_prefixes():
    assert clean("(Worker_TP0 pid=5751) ERROR 12-03 16:38:20 [multiproc_executor.py:1063] ValueError: x") == \
        "ValueError: x"
