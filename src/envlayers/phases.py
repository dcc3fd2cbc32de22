"""Startup phase of an inference server, read from its log.

Pure: text in, phases out. Used by ``wait`` (live progress) and ``status`` (last phase reached).

SGLang, in order: ``Load weight begin`` -> ``Load weight end`` -> ``KV Cache is allocated`` /
``max_total_num_tokens=`` -> ``Capture cuda graph`` -> ``The server is fired up``.
vLLM, in order: ``Starting to load model`` / ``Loading safetensors checkpoint shards`` -> ``Loading weights took``
/ ``Model loading took`` -> ``Available KV cache memory`` / ``GPU KV cache size`` (0.32 on CPUs: ``Explicitly
set (1.0/7.96) GiB for KV cache``, ``CPU KV cache size``) -> ``Capturing CUDA graphs`` ->
``Application startup complete``. 0.32's CPU build prints no ``Model loading took`` (its model runner has no
such line): ``Loading weights took`` is its last line of the weight load. The vLLM lines a CPU build never
prints are in :data:`VLLM_NOT_ON_CPU` with who prints them (tests/test_standin_vs_real.py holds every vLLM
rule to a real 0.32 CPU log, or to that entry).

Both map onto the same five phase names, in this order::

    loading, weights-loaded, kv-cache, graph-capture, ready

One-shot use::

    report = parse_phases(path.read_text().splitlines())
    report.last.name, report.last.details

Incremental use, as a log grows (read by ``envlayers.tail.Tail``)::

    tracker, log = PhaseTracker(), Tail(path)
    while job_running:
        for phase in tracker.feed_lines(log.lines()):   # the whole lines appended since the last read
            print(phase.summary())
    tracker.feed_lines([log.rest()])     # end of file: a last line without newline counts too
    tracker.last
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable

PHASE_ORDER: tuple[str, ...] = ("loading", "weights-loaded", "kv-cache", "graph-capture", "ready")

LABELS: dict[str, str] = {
    "loading": "loading weights",
    "weights-loaded": "weights loaded",
    "kv-cache": "KV cache allocated",
    "graph-capture": "capturing graphs",
    "ready": "ready",
}

ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


def strip_ansi(text: str) -> str:
    """Drop terminal colour and cursor codes (SGLang and vLLM colour their logs on a tty)."""
    return ANSI_RE.sub("", text) if "\x1b" in text else text


@dataclass
class Phase:
    """One startup phase reached: where it was first seen and the numbers the log gave for it.

    ``details`` keys carry units in their names (``elapsed_s``, ``mem_usage_gb``, ``tokens``); later
    lines of the same phase add keys (``Load weight end`` fills in ``weights-loaded``) but never
    overwrite one already set, so per-rank repeats do not flap.
    """

    name: str
    line: int
    engine: str | None
    details: dict[str, float | int | str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return LABELS[self.name]

    def summary(self) -> str:
        """Human one-liner, e.g. ``KV cache allocated (tokens=2243474)``."""
        if not self.details:
            return self.label
        parts = ", ".join(f"{key}={_fmt(value)}" for key, value in self.details.items())
        return f"{self.label} ({parts})"

    def to_dict(self) -> dict:
        return {"name": self.name, "label": self.label, "line": self.line, "engine": self.engine,
                "details": dict(self.details)}


@dataclass
class PhaseReport:
    """Phases reached, in the order first reached, and the last one (``None`` before the first)."""

    engine: str | None
    phases: list[Phase]

    @property
    def last(self) -> Phase | None:
        return self.phases[-1] if self.phases else None

    @property
    def ready(self) -> bool:
        return any(p.name == "ready" for p in self.phases)

    def get(self, name: str) -> Phase | None:
        return next((p for p in self.phases if p.name == name), None)

    def to_dict(self) -> dict:
        last = self.last
        return {"engine": self.engine, "phases": [p.to_dict() for p in self.phases],
                "last": last.name if last else None, "ready": self.ready}


def _fmt(value: float | int | str) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


_INT_KEYS = frozenset({"tokens", "mamba_cache_size", "gpu_blocks", "tokens_per_request"})


def _num(text: str, key: str) -> float | int:
    """Counts are ints; sizes, durations and ratios are floats (``12 secs`` -> ``12.0``)."""
    text = text.replace(",", "")
    return int(float(text)) if key in _INT_KEYS else float(text)


# --- line rules ------------------------------------------------------------------------------
# (engine or None for both, phase, regex, {group: detail key}); the first rule that matches a line wins.
# Groups are optional in the regex so a line cut short by a partial write still marks the phase.

_Rule = tuple[str | None, str, re.Pattern, dict[str, str]]


def _r(engine: str | None, phase: str, pattern: str, groups: dict[str, str] | None = None) -> _Rule:
    return (engine, phase, re.compile(pattern), groups or {})


RULES: tuple[_Rule, ...] = (
    # SGLang
    _r("sglang", "loading", r"Load weight begin\.?(?:.*?avail mem=(?P<a>[\d.]+)\s*GB)?",
       {"a": "avail_mem_gb"}),
    _r("sglang", "weights-loaded",
       r"Load weight end\.?(?=(?:.*?elapsed=(?P<e>[\d.]+)\s*s)?)(?=(?:.*?avail mem=(?P<a>[\d.]+)\s*GB)?)"
       r"(?=(?:.*?mem usage=(?P<m>[\d.]+)\s*GB)?)",
       {"e": "elapsed_s", "m": "mem_usage_gb", "a": "avail_mem_gb"}),
    _r("sglang", "kv-cache", r"Mamba Cache is allocated\.?(?:.*?max_mamba_cache_size:\s*(?P<m>\d+))?",
       {"m": "mamba_cache_size"}),
    _r("sglang", "kv-cache", r"KV Cache is allocated\.?(?:.*?#tokens:\s*(?P<t>[\d,]+))?", {"t": "tokens"}),
    _r("sglang", "kv-cache", r"max_total_num_tokens=(?P<t>\d+)", {"t": "tokens"}),
    _r("sglang", "graph-capture",
       r"(?i)capture (?:\w+ )?(?:cuda|hip) ?graph end\.?(?=(?:.*?elapsed:\s*(?P<e>[\d.]+)\s*s)?)"
       r"(?=(?:.*?mem usage=(?P<m>[\d.]+)\s*GB)?)",
       {"e": "elapsed_s", "m": "mem_usage_gb"}),
    _r("sglang", "graph-capture", r"(?i)\bcapture (?:\w+ )?(?:cuda|hip) ?graph\b"),
    _r("sglang", "ready", r"The server is fired up"),
    # vLLM
    _r("vllm", "weights-loaded",
       r"Model loading took (?P<m>[\d.]+)\s*GiB(?: memory)?(?: and (?P<e>[\d.]+)\s*s)?",
       {"m": "mem_usage_gib", "e": "elapsed_s"}),
    _r("vllm", "weights-loaded", r"Loading model weights took (?P<m>[\d.]+)\s*GB", {"m": "mem_usage_gb"}),
    # the loader's own line, before the model runner's "Model loading took" (which 0.32 on CPUs never prints)
    _r("vllm", "weights-loaded", r"Loading weights took (?P<e>[\d.]+)\s*s", {"e": "weights_elapsed_s"}),
    _r("vllm", "loading", r"Starting to load model (?P<model>\S+?)(?:\.\.\.)?\s*$", {"model": "model"}),
    _r("vllm", "loading", r"Loading (?:safetensors|fastsafetensors|pt) checkpoint shards"),
    _r("vllm", "loading", r"Loading model from scratch"),
    _r("vllm", "kv-cache", r"Available KV cache memory:\s*(?P<g>[\d.]+)\s*GiB", {"g": "kv_cache_gib"}),
    # the CPU worker's line (VLLM_CPU_KVCACHE_SPACE given: "Explicitly", else "Auto")
    _r("vllm", "kv-cache", r"(?:Explicitly|Auto) set \((?P<g>[\d.]+)/[\d.]+\) GiB for KV cache",
       {"g": "kv_cache_gib"}),
    # 0.28: "GPU KV cache size: N tokens" alone; 0.32: "<device> KV cache size: N tokens, Maximum concurrency ..."
    _r("vllm", "kv-cache",
       r"(?:GPU|CPU|XPU|TPU) KV cache size:\s*(?P<t>[\d,]+) tokens"
       r"(?:, Maximum concurrency for (?P<c>[\d,]+) tokens per request:\s*(?P<x>[\d.]+)x)?",
       {"t": "tokens", "c": "tokens_per_request", "x": "max_concurrency"}),
    _r("vllm", "kv-cache", r"Maximum concurrency for (?P<c>[\d,]+) tokens per request:\s*(?P<x>[\d.]+)x",
       {"c": "tokens_per_request", "x": "max_concurrency"}),
    _r("vllm", "kv-cache", r"# (?:GPU|cuda|CUDA) blocks:\s*(?P<b>\d+)", {"b": "gpu_blocks"}),
    _r("vllm", "graph-capture", r"Graph capturing finished in (?P<e>[\d.]+) secs?(?:, took (?P<m>[\d.]+)\s*GiB)?",
       {"e": "elapsed_s", "m": "mem_usage_gib"}),
    _r("vllm", "graph-capture", r"(?i)Capturing (?:CUDA ?graphs|cudagraphs)"),
    # SGLang's uvicorn also says this before its own warm-up; only vLLM counts it as ready (see _match)
    _r("vllm", "ready", r"Application startup complete"),
)

# The vLLM rules whose line a CPU build of vLLM never prints, with who prints it and where that is to be read
# (a path under the engine's package, or a real log in tests/data/logs). Every other vLLM rule matches a line
# of the real 0.32 CPU log (tests/test_standin_vs_real.py checks both, against the installed engine).
VLLM_NOT_ON_CPU: dict[str, str] = {
    r"Model loading took (?P<m>[\d.]+)\s*GiB(?: memory)?(?: and (?P<e>[\d.]+)\s*s)?":
        "vLLM 0.28 and 0.32 on GPUs (CUDA, ROCm): vllm/v1/worker/gpu_model_runner.py; "
        "tests/data/logs/healthy-vllm/server-0.log",
    r"Loading model weights took (?P<m>[\d.]+)\s*GB":
        "vLLM's V0 engine on GPUs (before 0.11): vllm/worker/model_runner.py, gone with V0",
    r"Loading model from scratch":
        "vLLM 0.32 on GPUs, model runner V2: vllm/v1/worker/gpu/model_runner.py",
    r"Available KV cache memory:\s*(?P<g>[\d.]+)\s*GiB":
        "vLLM 0.28 and 0.32 on GPUs: vllm/v1/worker/gpu_worker.py; tests/data/logs/healthy-vllm/server-0.log",
    r"# (?:GPU|cuda|CUDA) blocks:\s*(?P<b>\d+)":
        "vLLM's V0 engine (before 0.11): vllm/executor/gpu_executor.py, gone with V0",
    r"Graph capturing finished in (?P<e>[\d.]+) secs?(?:, took (?P<m>[\d.]+)\s*GiB)?":
        "vLLM 0.28 and 0.32 on GPUs without --enforce-eager: vllm/v1/worker/gpu_model_runner.py; "
        "tests/data/logs/healthy-vllm/server-0.log",
    r"(?i)Capturing (?:CUDA ?graphs|cudagraphs)":
        "vLLM 0.28 and 0.32 on GPUs without --enforce-eager: vllm/v1/worker/gpu_model_runner.py; "
        "tests/data/logs/healthy-vllm/server-0.log",
}

# Every RULES regex needs one of these words; a line without any is skipped with one search.
_KEYWORDS = re.compile(r"Load weight|Loading|loading|to load|Cache is allocated|max_total_num_tokens|KV cache"
                       r"|aptur|fired up|concurrency|blocks:|startup complete")

_SGLANG_HINTS = re.compile(
    r"sglang|Load weight begin|ServerArgs\(|\bTP\d+(?: [A-Z]+\d+)*\]|KV Cache is allocated|max_total_num_tokens|fired up")
_VLLM_HINTS = re.compile(
    r"vllm|EngineCore|\((?:APIServer|Worker\w*) pid=|gpu_model_runner\.py|non-default args|Model loading took"
    r"|Available KV cache memory|GPU KV cache size")


def detect_engine(line: str) -> str | None:
    """``"sglang"``, ``"vllm"`` or ``None`` when one line says nothing about the engine."""
    if _SGLANG_HINTS.search(line):
        return "sglang"
    if _VLLM_HINTS.search(line):
        return "vllm"
    return None


class PhaseTracker:
    """Startup phases from a log read incrementally.

    ``feed(text)`` takes any chunk of the file (it keeps an unfinished last line until its newline
    arrives) and returns the phases newly reached. ``feed_lines(lines)`` takes whole lines.
    ``engine`` may be given (``"sglang"``/``"vllm"``); otherwise it is detected from the log.
    """

    def __init__(self, engine: str | None = None):
        if engine not in (None, "sglang", "vllm"):
            raise ValueError(f"unknown engine {engine!r}; expected 'sglang' or 'vllm'")
        self.engine = engine
        self._fixed_engine = engine is not None
        self.phases: list[Phase] = []
        self._by_name: dict[str, Phase] = {}
        self._partial = ""
        self.lines_seen = 0

    @property
    def last(self) -> Phase | None:
        return self.phases[-1] if self.phases else None

    @property
    def report(self) -> PhaseReport:
        return PhaseReport(engine=self.engine, phases=list(self.phases))

    def feed(self, text: str) -> list[Phase]:
        data = self._partial + text
        lines = data.split("\n")
        self._partial = lines.pop()  # "" when the chunk ended with a newline
        return self.feed_lines(lines)

    def flush(self) -> list[Phase]:
        """Treat a pending partial last line as complete (end of file)."""
        rest, self._partial = self._partial, ""
        return self.feed_lines([rest]) if rest else []

    def feed_lines(self, lines: Iterable[str]) -> list[Phase]:
        new: list[Phase] = []
        for raw in lines:
            self.lines_seen += 1
            # a tqdm bar rewrites itself with \r: each piece is its own state
            for piece in strip_ansi(raw).split("\r"):
                phase = self._match(piece, self.lines_seen)
                if phase is not None:
                    new.append(phase)
        return new

    def _match(self, line: str, line_no: int) -> Phase | None:
        if not line.strip():
            return None
        if not self._fixed_engine and self.engine is None:
            self.engine = detect_engine(line)
        if not _KEYWORDS.search(line):
            return None
        for engine, name, regex, groups in RULES:
            if engine is not None and self.engine is not None and engine != self.engine:
                continue
            m = regex.search(line)
            if not m:
                continue
            if name == "ready" and engine == "vllm" and self.engine == "sglang":
                continue  # uvicorn's line: SGLang is ready only once "fired up"
            details = {}
            for group, key in groups.items():
                value = m.groupdict().get(group)
                if value:
                    details[key] = value if key == "model" else _num(value, key)
            return self._reach(name, line_no, details, engine)
        return None

    def _reach(self, name: str, line_no: int, details: dict, engine: str | None) -> Phase | None:
        phase = self._by_name.get(name)
        if phase is not None:
            for key, value in details.items():
                phase.details.setdefault(key, value)
            return None
        phase = Phase(name=name, line=line_no, engine=self.engine, details=dict(details))
        self._by_name[name] = phase
        self.phases.append(phase)
        return phase


def parse_phases(lines: Iterable[str], engine: str | None = None) -> PhaseReport:
    """Phases reached in a whole log (a list of lines; the last one may be partial)."""
    tracker = PhaseTracker(engine)
    tracker.feed_lines(lines)
    return tracker.report


def parse_phases_text(text: str, engine: str | None = None) -> PhaseReport:
    tracker = PhaseTracker(engine)
    tracker.feed(text)
    tracker.flush()
    return tracker.report


__all__ = [
    "PHASE_ORDER", "Phase", "PhaseReport", "PhaseTracker", "detect_engine", "parse_phases",
    "parse_phases_text", "strip_ansi",
]
