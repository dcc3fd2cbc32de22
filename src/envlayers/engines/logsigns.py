"""What an engine's own log says that the launcher acts on at once, before the server process exits.

vLLM's API server watches its engine core processes; when one dies (an OOM kill, a segfault in a
kernel, a SIGKILL) it logs ``[shutdown] MPClient: engine core exited unexpectedly; starting cleanup``
at once (``vllm/v1/engine/core_client.py``, its engine monitor thread) but the process itself exits
seconds later, after its cleanup. Reading that line ends the job (or drops the replica) without
waiting for the exit. SGLang kills its whole process tree as soon as a child fails, so its exit
already comes at once and it needs no line here.

Pure: a table and a matcher; the supervision loop (``launch.supervise``) reads the logs.
"""

from __future__ import annotations

CORE_DIED: dict[str, tuple[str, ...]] = {
    "vllm": ("MPClient: engine core exited unexpectedly",),
    "sglang": (),
}
"""Per engine, text whose appearance in a rank's log means its engine core is gone and it will not serve."""


def core_died(engine: str, line: str) -> bool:
    """Whether ``line`` of a rank's log says the engine core of ``engine`` died."""
    return any(text in line for text in CORE_DIED.get(engine, ()))
