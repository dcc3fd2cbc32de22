"""Terminal text of the operator commands (wait, status, logs, stop): every line they print is made here,
from the records ``envlayers.ops`` returns. Imports nothing heavy."""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING, Callable, TextIO

if TYPE_CHECKING:
    from ..ops import StopResult, WaitEvent, WaitResult

REQUEUED = "requeued (restart {n}); waiting for Slurm to start it again"
LAUNCHER_DIED = "the launcher died without reporting (killed?); Slurm reports {state} exit {code}"


def fmt_duration(seconds: float | None) -> str:
    """``75`` -> ``1m15s``, ``3725`` -> ``1h02m05s``; ``None`` -> ``-``."""
    if seconds is None:
        return "-"
    s = max(0, int(round(seconds)))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    if h:
        return f"{h}h{m:02d}m{s:02d}s"
    if m:
        return f"{m}m{s:02d}s"
    return f"{s}s"


def _exits_text(exits: dict) -> str:
    return ", ".join(f"rank {r} exited with code {c if c is not None else '?'}" for r, c in exits.items())


# ------------------------------------------------------------------------------------------ wait

def progress_text(event: "WaitEvent", details: bool = True) -> str:
    """The one-line state of a starting job, without the clock. ``details=False`` leaves out the
    phase's numbers: the text then changes only when the state or phase does."""
    job, info, report, phase = event.job, event.job.info, event.report, event.phase
    jid = job.job_id
    if info is None:
        return f"job {jid}: Slurm no longer lists it"
    state = info.state or "?"
    if info.pending or job.requeued and not info.running:
        head = f"job {jid}: {state}" + (f" ({info.reason})" if info.reason and info.reason != "None" else "")
        return head + (", " + REQUEUED.format(n=job.restart) if job.requeued else "")
    if info.state == "COMPLETING" or info.finished:
        return f"job {jid}: {state}"
    parts = [f"job {jid}: {state}"]
    if info.nodelist:
        parts[0] += f" on {info.nodelist}"
    if job.requeued:
        parts.append(f"restart {job.restart}, waiting for the launcher of the new run")
        return ", ".join(parts)
    if phase is not None:
        parts.append(f"rank 0 {phase.summary() if details else phase.label}")
    elif report.ranks_up or report.ranks_started:
        total = report.ranks_started or info.nodes or None
        if report.ranks_started:
            parts.append(f"all {report.ranks_started} ranks started, waiting for the server log")
        else:
            parts.append(f"{len(report.ranks_up)}/{total or '?'} ranks up")
    elif report.stages or report.topology:
        parts.append("launcher starting the ranks")
    else:
        parts.append("waiting for the launcher")
    if event.rank_exits:
        parts.append(_exits_text(event.rank_exits) + ": not live, the launcher is ending the job")
    return ", ".join(parts)


class Progress:
    """Shows a changing one-line state on stderr.

    ``tty``: one line rewritten in place, elapsed time ticking. ``plain``: a timestamped line per change.
    ``none``: silent. Launcher warnings and errors are printed once, as their own lines, in both modes.
    """

    def __init__(self, stream: TextIO | None = None, mode: str | None = None,
                 clock: Callable[[], float] = time.time):
        self.stream = stream if stream is not None else sys.stderr
        if mode is None:
            mode = "tty" if getattr(self.stream, "isatty", lambda: False)() else "plain"
        if mode not in ("tty", "plain", "none"):
            raise ValueError(f"progress mode {mode!r}")
        self.mode = mode
        self.clock = clock
        self._last: str | None = None  # the line as last shown
        self._key: str | None = None
        self._drawn = False

    def __call__(self, event: "WaitEvent") -> None:
        """Show one ``WaitEvent`` (the callback ``ops.wait_for`` takes)."""
        if event.kind == "launcher":
            self.message(event.text or "")
        elif event.kind == "slurm-silent":
            self.message(f"Slurm did not answer ({event.text}); retrying")
        else:
            self.update(progress_text(event), event.elapsed_s, key=progress_text(event, details=False))

    def update(self, text: str, elapsed_s: float | None = None, key: str | None = None) -> None:
        """Show ``text`` (+ elapsed). In plain mode a line is printed only when ``key`` (default: the
        text) differs from the previous one."""
        shown = f"{text} [{fmt_duration(elapsed_s)}]" if elapsed_s is not None else text
        key = text if key is None else key
        if self.mode == "tty":
            if shown != self._last or not self._drawn:
                self.stream.write("\r\x1b[K" + shown)
                self._drawn = True
                self.stream.flush()
        elif self.mode == "plain" and key != self._key:
            self._emit(shown)
        self._key = key
        self._last = shown

    def message(self, line: str) -> None:
        if self.mode == "none":
            return
        if self.mode == "tty":
            self._clear()
            self.stream.write(line + "\n")
            if self._last is not None:
                self.stream.write(self._last)
                self._drawn = True
            self.stream.flush()
        else:
            self._emit(line)

    def close(self) -> None:
        if self.mode == "tty" and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False

    def _clear(self) -> None:
        if self._drawn:
            self.stream.write("\r\x1b[K")
            self._drawn = False

    def _emit(self, line: str) -> None:
        stamp = time.strftime("%H:%M:%S", time.localtime(self.clock()))
        self.stream.write(f"[{stamp}] {line}\n")
        self.stream.flush()


def endpoint_block(result: "WaitResult") -> str:
    """The endpoint block ``wait`` prints once live (from endpoint.json, else the job output's copy)."""
    from ..readiness import Endpoint

    data = dict(result.endpoint or {})
    try:
        text = Endpoint.from_json(json.dumps(data)).block()
        return text + "".join(f"{label}: {said}\n" for label, said in replica_lines(data))  # replicas alive
    except (TypeError, ValueError, KeyError, IndexError):
        if result.report.endpoint_block:
            return result.report.endpoint_block
        return json.dumps(data, indent=2) + "\n"


def launcher_line(end: dict) -> str | None:
    """What the launcher said about its end (or that it could not): one line, or ``None`` while running."""
    if end["launcher"] == "died":
        if end["slurm_state"] is None:
            return LAUNCHER_DIED.split(";")[0] + "; Slurm no longer lists the job"
        return LAUNCHER_DIED.format(state=end["slurm_state"], code=end["slurm_exit"] or "-")
    if end["launcher"] == "reported":
        code = f" (code {end['code']})" if end.get("code") is not None else ""
        return f"the launcher reported: {end.get('reason') or 'no reason given'}{code}"
    if end["launcher"] == "never started" and end["slurm_state"]:
        return (f"the launcher of this run never started; Slurm reports {end['slurm_state']} "
                f"exit {end['slurm_exit'] or '-'}")
    return None


def describe_end(result: "WaitResult") -> list[str]:
    """The lines ``wait`` prints when the job ended before its endpoint was live."""
    from ..ops import launcher_end

    job, info = result.job, result.job.info
    jid = job.job_id
    if job.requeued:
        when = f"while requeued (restart {job.restart}), before it started again"
    else:
        when = "after its endpoint had been live" if result.report.live else "before its endpoint was live"
    if info is None:
        head = f"job {jid} ended {when} (Slurm no longer lists it)"
    else:
        bits = [info.state or "?"]
        if info.reason and info.reason != "None":
            bits.append(info.reason)
        if info.exit_code:
            bits.append(f"exit {info.exit_code}")
        head = f"job {jid} ended {when}: {', '.join(bits)}"
    lines = [head]
    if result.report.last_error:
        lines.append(f"  ENVLAYERS-ERROR: {result.report.last_error}")
    said = launcher_line(launcher_end(job)) if info is not None else None
    if said and not job.requeued:
        lines.append(f"  {said}")
    if result.phase is not None:
        lines.append(f"  last phase of rank 0: {result.phase.summary()}")
    bad = {r: c for r, c in result.rank_exits.items() if c not in (0, None)}
    if bad:
        lines.append("  rank exits: " + ", ".join(f"rank {r} -> {c}" for r, c in bad.items()))
    # errors first, informational findings after; the knowledge base's order within each
    ranked = sorted(result.findings, key=lambda f: (f.severity != "error", f.status == "informational"))
    for f in ranked[:3]:
        where = f.evidence[0].where if f.evidence else "-"
        lines.append(f"  diagnosis [{f.rule_id}] {where}: {f.cause}")
        lines.append(f"    fix: {f.fix}")
    lines.append(f"  next: env_layers diagnose {jid}; env_layers logs {jid} --tail 50")
    return lines


def describe_timeout(result: "WaitResult", timeout_s: float) -> list[str]:
    job, info = result.job, result.job.info
    state = info.state if info else "unknown"
    if info is not None and info.pending:
        state += f" ({info.reason})"
    if job.requeued:
        state += ", " + REQUEUED.format(n=job.restart)
    line = f"job {job.job_id} not live after {fmt_duration(timeout_s)}: {state}"
    if result.phase is not None:
        line += f", rank 0 {result.phase.summary()}"
    if result.rank_exits:
        line += f", {_exits_text(result.rank_exits)}"
    return [line, f"  the job goes on; `env_layers wait {job.job_id}` again, or "
                  f"`env_layers stop {job.job_id}` to end it"]


# ------------------------------------------------------------------------------------------ status

def format_table(rows: list[dict]) -> str:
    # the catalog target (every catalog model is served under the same name, so that name tells nothing)
    head = ("JOBID", "STATE", "NODES", "TIME LEFT", "MODEL", "ENDPOINT")
    body = [(r["job_id"], r["state"], str(r["nodes"]), fmt_duration(r["time_left_s"])
             if r["time_left_s"] is not None else "-", r.get("target") or r.get("hf_model") or r["model"] or "-",
             r["endpoint"] or "-") for r in rows]
    widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [head, *body]]
    return "\n".join(lines) + "\n"


def format_record(rec: dict) -> str:
    from ..rundir import TAIL_HEADER_RE
    from ..slurm import TERMINAL_STATES

    s = rec["slurm"] or {}
    jid = rec["job_id"]
    lines = []
    state = rec["state"] or "unknown to Slurm (finished and forgotten)"
    if s.get("reason") and s.get("state") not in ("RUNNING",):
        state += f" ({s['reason']})"
    if s.get("exit_code") and s.get("state") in TERMINAL_STATES:
        state += f", exit {s['exit_code']}"
    lines.append(f"job {jid}: {state}")
    if rec.get("requeued"):
        lines.append(f"  run:        {REQUEUED.format(n=rec['restart'])}")
    elif rec.get("restart"):
        lines.append(f"  run:        restart {rec['restart']} (its files are at the top of the run dir)")
    if s:
        nodes = f"{s['nodes']} ({s['nodelist']})" if s.get("nodelist") else str(s.get("nodes", "-"))
        lines.append(f"  nodes:      {nodes}")
        left = fmt_duration(s["time_left_s"]) if s.get("time_left_s") is not None else "-"
        limit = fmt_duration(s["time_limit_s"]) if s.get("time_limit_s") is not None else "unlimited"
        lines.append(f"  time:       {left} left of {limit}; start {s.get('start_time') or '-'}, "
                     f"end {s.get('end_time') or '-'}")
    if rec["model"] or rec["served_model_name"]:
        lines.append(f"  model:      {rec['served_model_name'] or '-'} = {rec['model'] or '-'}"
                     f" ({rec['engine'] or '?'})")
    lines.append(f"  job output: {rec['job_output'] or '-'}")
    lines.append(f"  run dir:    {rec['run_dir'] or '- (not created yet)'}")
    said = launcher_line(rec["launcher_end"])
    if said:
        lines.append(f"  launcher:   {said}")
    la = rec["launcher"]
    if la["ranks_up"] or la["ranks_started"]:
        ups = ", ".join(f"{r} on {h}" for r, h in la["ranks_up"].items())
        total = la["ranks_started"] or len(la["ranks_up"])
        lines.append(f"  ranks:      {len(la['ranks_up'])}/{total} up ({ups})")
    if rec["rank_exits"]:
        lines.append("  rank exits: " + ", ".join(f"rank {r} -> {c}" for r, c in rec["rank_exits"].items()))
    ph = rec["phase"]
    if ph:
        detail = ", ".join(f"{k}={v}" for k, v in ph["details"].items())
        lines.append(f"  phase:      rank 0 {ph['label']}" + (f" ({detail})" if detail else ""))
    ep = rec["endpoint"]
    if ep:
        bases = ep.get("base_urls") or [ep.get("base_url")]
        for base in bases:
            lines.append(f"  endpoint:   {base}")
        lines += [f"  {label + ':':<11} {said}" for label, said in replica_lines(ep)]
        for p in rec["probes"]:
            lines.append(f"  probe:      {p['url']}: {'answers' if p['answers'] else 'no answer'} ({p['detail']})")
        if ep.get("curl") and rec["state"] in ("RUNNING",):
            lines.append(f"  try:        {ep['curl']}")
    elif rec["state"] == "RUNNING" and not rec.get("requeued"):
        lines.append("  endpoint:   not live yet (`env_layers wait " + jid + "`)")
    for w in la["warnings"]:
        lines.append(f"  warning:    {w}")
    for e in la["errors"]:
        if not TAIL_HEADER_RE.match(e):  # "last 20 lines of ...:" introduces the tail, it says nothing
            lines.append(f"  error:      {e}")
    chain = rec.get("chain")
    if chain:
        bits = [f"after job {chain['predecessor']}" if chain.get("predecessor") else "first job"]
        if chain.get("successor"):
            bits.append(f"successor job {chain['successor']} ({chain.get('dependency')})")
        elif chain.get("left"):
            bits.append(f"{chain['left']} successor(s) to submit once live")
        else:
            bits.append("last job, no successor")
        lines.append("  chain:      " + "; ".join(bits))
    for run in rec.get("earlier_runs", []):
        lines.append(f"  earlier:    {_run_line(run)}")
    return "\n".join(lines) + "\n"


def replica_lines(ep: dict) -> list[tuple[str, str]]:
    """(label, text): ``replicas`` (how many alive of how many) and a ``dropped`` line per dropped replica."""
    from ..launch.replicas import replica_rows

    rows = replica_rows(ep)
    if not rows:
        return []
    alive = [r for r in rows if r.get("alive")]
    out = [("replicas", f"{len(alive)} of {len(rows)} alive (" + ", ".join(
        f"rank {r.get('rank')} on {r.get('node')}" for r in alive) + f"); the job ends below "
        f"MIN_REPLICAS={ep.get('min_replicas', 1)}")]
    out += [("dropped", f"rank {r.get('rank')} on {r.get('node')}: {r.get('ended') or 'ended'}")
            for r in rows if not r.get("alive")]
    return out


def _run_line(run: dict) -> str:
    where = f"run-{run['folder']}/" if run["folder"] is not None else "top of the run dir (not moved yet)"
    bits = [f"restart {run['restart']}" if run["restart"] is not None else "restart ?"]
    bits.append("had been live" if run["live"] else "never live")
    bad = {r: c for r, c in run["rank_exits"].items() if c not in (0, None)}
    if bad:
        bits.append("rank exits " + ", ".join(f"{r} -> {c}" for r, c in bad.items()))
    if run["launcher"] == "reported":
        bits.append(f"launcher: {run['reason'] or 'ended'}")
    elif run["launcher"] == "died":
        bits.append("launcher ended without reporting")
    return f"{where}: " + ", ".join(bits)


# ------------------------------------------------------------------------------------------ stop

def describe_stop(result: "StopResult") -> list[tuple[str, bool]]:
    """``stop``'s lines as ``(text, to_stderr)``."""
    jid = result.job_id
    out: list[tuple[str, bool]] = []
    if result.cancelled:
        out.append((f"job {jid}: scancel sent ({result.state_before})", False))
    else:
        out.append((f"job {jid}: already ended ({result.state_before or 'forgotten by Slurm'}); nothing to cancel",
                    False))
    if not result.ended:
        out.append((f"job {jid}: still {result.state_after} after {fmt_duration(result.waited_s)}", True))
        out.append((f"  Slurm has not ended it yet; check `squeue -j {jid}` and run `env_layers stop {jid}` again",
                    True))
        return out
    if result.cancelled:
        out.append((f"job {jid}: ended ({result.state_after or 'gone from Slurm'}) after "
                    f"{fmt_duration(result.waited_s)}", False))
    for p in result.probes:
        word = "STILL ANSWERS" if p["answers"] else "no longer answers"
        out.append((f"endpoint {p['url']}: {word} ({p['detail']})", p["answers"]))
    if not result.probes:
        out.append(("endpoint: none recorded (the job never went live)", False))
    if result.still_answers:
        out.append(("  a server outlived its job: find it on the node (`ps -ef | grep serve`) and tell the admins",
                    True))
        return out
    out.append((f"job {jid}: stopped", False))
    return out
