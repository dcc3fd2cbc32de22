"""Terminal text of ``bench``: the load report (``bench.report.report``'s data) as a table of numbers
with the failures under it. Latencies in ms, p50/p90/p99 (docs/operating.md, "Load report")."""

from __future__ import annotations

from ..bench.report import METRICS, PERCENTILES
from .textfmt import table


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.0f}" if x >= 0.1 else f"{x * 1000:.1f}"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}" if x < 1000 else f"{x:.0f}"


def format_bench(data: dict) -> str:
    t, st = data["target"], data["settings"]
    lines = [f"bench {t['base_url']} (model {t['model']}): {st['input_tokens']} prompt words, "
             f"{st['output_tokens']} output tokens, up to {st['requests_per_level']} requests and "
             f"{st['duration_s_per_level']:g} s per level",
             _prompt_line(data.get("prompt")),
             "latencies in ms, p50/p90/p99; gen CPU: the load generator's own CPU ms per request"]
    head = ("conc", "ok", "err", "req/s", "out tok/s", "TTFT", "ITL", "e2e", "gen CPU")
    rows = [head]
    for lv in data["levels"]:
        rows.append((str(lv["concurrency"]), str(lv["ok"]), str(lv["errors"]), _num(lv["requests_per_s"]),
                     _num(lv["output_tokens_per_s"]),
                     *("/".join(_ms(lv[m][f"p{p}"]) for p in PERCENTILES) for m, _ in METRICS),
                     _ms(lv.get("generator_cpu_s_per_request"))))
    lines += table(rows, right=True)
    for lv in data["levels"]:
        if lv["cut_short"]:
            lines.append(f"concurrency {lv['concurrency']}: the {st['duration_s_per_level']:g} s per level ran out "
                         f"after {lv['requests']} of {st['requests_per_level']} requests")
        for e in lv["error_kinds"]:
            lines.append(f"concurrency {lv['concurrency']}: {e['count']} failed: {e['error']}")
    return "\n".join(lines) + "\n"


def _prompt_line(prompt: dict | None) -> str:
    if not prompt:
        return "prompt: -"
    words = f"prompt: {prompt['words_asked']} words asked (--input-tokens is a length in words)"
    if not prompt["tokens_counted_reported"]:
        return f"{words}; the engine reported no prompt token count (no usage in the stream)"
    lo, hi = prompt["tokens_counted_min"], prompt["tokens_counted_max"]
    spread = f", {lo}..{hi}" if lo != hi else ""
    return f"{words}, {prompt['tokens_counted_p50']:g} tokens counted by the engine (median per request{spread})"
