"""From timed requests to a load report: throughput, latency percentiles, errors; as data (JSON) and a plot
(cli.bench_format makes the table for a terminal).

Definitions (docs/operating.md, "Load report"), per concurrency level:
- requests/s and output tokens/s: completed requests and their output tokens over the level's wall time;
- TTFT: from sending a request to its first streamed content chunk;
- ITL (inter-token latency): per request, (end-to-end - TTFT) / (output tokens - 1), the time per token
  after the first; it does not depend on how many tokens an engine puts in one chunk;
- e2e: from sending a request to the end of its stream;
- prompt tokens: the engine's ``usage.prompt_tokens`` per request (the prompt is asked for in words,
  and how many tokens they make depends on the model's tokenizer and chat template);
- generator CPU: CPU seconds (user + system) the load generator's own process spent during the level,
  per request sent; on a host shared with the engine it is CPU the engine did not get.
Percentiles are over the level's successful requests (linear interpolation between ranks).
"""

from __future__ import annotations

import os
from pathlib import Path

from .load import LevelRun, Settings

PERCENTILES = (50, 90, 99)
METRICS = (("ttft_s", "TTFT"), ("itl_s", "ITL"), ("e2e_s", "e2e"))


def percentile(values: list[float], p: float) -> float | None:
    if not values:
        return None
    xs = sorted(values)
    k = (len(xs) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def _dist(values: list[float]) -> dict:
    out = {f"p{p}": _r(percentile(values, p)) for p in PERCENTILES}
    out["mean"] = _r(sum(values) / len(values)) if values else None
    return out


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 5)


def _prompt_tokens(samples) -> dict:
    """The engine's prompt token counts of these samples: median, range, how many reported one."""
    counts = [s.prompt_tokens for s in samples if s.ok and s.prompt_tokens is not None]
    return {"p50": percentile(counts, 50), "min": min(counts, default=None), "max": max(counts, default=None),
            "reported": len(counts)}


def summarize(level: LevelRun) -> dict:
    ok = [s for s in level.samples if s.ok]
    failed = [s for s in level.samples if not s.ok]
    tokens = sum(s.output_tokens for s in ok)
    itl = [(s.e2e_s - s.ttft_s) / (s.output_tokens - 1) for s in ok if s.output_tokens > 1]
    errors: dict[str, int] = {}
    for s in failed:
        errors[s.error or "unknown"] = errors.get(s.error or "unknown", 0) + 1
    wall = level.wall_s if level.wall_s > 0 else None
    return {
        "concurrency": level.concurrency,
        "requests": len(level.samples),
        "ok": len(ok),
        "errors": len(failed),
        "error_kinds": [{"error": e, "count": n} for e, n in sorted(errors.items(), key=lambda x: -x[1])[:5]],
        "cut_short": level.cut_short,
        "wall_s": _r(level.wall_s),
        "requests_per_s": _r(len(ok) / wall) if wall else None,
        "output_tokens": tokens,
        "output_tokens_per_s": _r(tokens / wall) if wall else None,
        "ttft_s": _dist([s.ttft_s for s in ok if s.ttft_s is not None]),
        "itl_s": _dist(itl),
        "e2e_s": _dist([s.e2e_s for s in ok if s.e2e_s is not None]),
        "prompt_tokens": _prompt_tokens(level.samples),
        "generator_cpu_s": _r(level.cpu_s),
        "generator_cpu_s_per_request": _r(level.cpu_s / len(level.samples)) if level.samples else None,
        "generator_cpu_cores": _r(level.cpu_s / wall) if wall else None,  # CPU s per wall s
    }


def report(settings: Settings, levels: list[LevelRun], target: dict) -> dict:
    return {
        "target": target,
        "settings": {"requests_per_level": settings.requests, "duration_s_per_level": settings.duration_s,
                     "timeout_s": settings.timeout_s, "input_tokens": settings.input_tokens,
                     "output_tokens": settings.output_tokens, "ignore_eos": settings.ignore_eos,
                     "concurrency": [lv.concurrency for lv in levels]},
        "prompt": {"words_asked": settings.input_tokens,
                   **{f"tokens_counted_{k}": v for k, v in
                      _prompt_tokens([s for lv in levels for s in lv.samples]).items()}},
        "levels": [summarize(lv) for lv in levels],
    }


def plot(data: dict, path: str) -> None:
    """A PNG: latency percentiles (left) and throughput (right) against concurrency. Written whole or
    not at all (a temporary file renamed into place)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    levels = data["levels"]
    xs = [lv["concurrency"] for lv in levels]
    fig, (ax_l, ax_t) = plt.subplots(1, 2, figsize=(11, 4.2), constrained_layout=True)
    colors = {"ttft_s": "tab:blue", "itl_s": "tab:orange", "e2e_s": "tab:green"}
    for key, label in METRICS:
        for p, style in ((50, "-o"), (90, "--")):
            ys = [lv[key][f"p{p}"] * 1000 if lv[key][f"p{p}"] is not None else float("nan") for lv in levels]
            ax_l.plot(xs, ys, style, color=colors[key], label=f"{label} p{p}")
    ax_l.set(xscale="log", yscale="log", xlabel="concurrency (requests in flight)", ylabel="latency (ms)",
             title="Latency")
    top = max([lv[k]["p90"] or 0 for lv in levels for k, _ in METRICS] + [1e-3]) * 1000
    ax_l.set_ylim(top=top * 8)  # room above the lines for the legend
    ax_l.legend(fontsize=8, ncol=3, loc="upper left")
    ax_t.plot(xs, [lv["output_tokens_per_s"] or 0 for lv in levels], "-o", color="tab:purple",
              label="output tokens/s")
    ax_t.set(xscale="log", xlabel="concurrency (requests in flight)", ylabel="output tokens/s", title="Throughput")
    ax_r = ax_t.twinx()
    ax_r.plot(xs, [lv["requests_per_s"] or 0 for lv in levels], "--s", color="tab:gray", label="requests/s",
              markerfacecolor="none", markersize=9)
    ax_r.set_ylabel("requests/s")
    handles = ax_t.get_legend_handles_labels()[0] + ax_r.get_legend_handles_labels()[0]
    ax_t.legend(handles, [h.get_label() for h in handles], fontsize=8, loc="upper left")
    for ax in (ax_l, ax_t):
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.grid(True, which="both", alpha=0.3)
    ax_t.set_ylim(bottom=0)
    ax_r.set_ylim(bottom=0)
    errors = sum(lv["errors"] for lv in levels)
    t = data["target"]
    fig.suptitle(f"env_layers bench: {t['model']} at {t['base_url']}"
                 + (f"  ({errors} failed requests)" if errors else ""), fontsize=10)
    out = Path(path)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        fig.savefig(tmp, format="png", dpi=110)
        os.replace(tmp, out)
    finally:
        plt.close(fig)
        tmp.unlink(missing_ok=True)
