"""Terminal text of the operator commands (wait, status, logs, stop): every line they print is made here,
from the records ``envlayers.ops`` returns. Imports nothing heavy."""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING, Callable, TextIO

from ..durations import compact, parse_time
from ..joblines import ERROR, TAIL_HEADER
from ..rundir import EndpointRecord
from .serving_format import gpu_hours_lines, replica_lines
from .textfmt import table
from .textfmt import label as _label

if TYPE_CHECKING:
    from ..ops import StopResult, WaitEvent, WaitResult

REQUEUED = "requeued (restart {n}); waiting for Slurm to start it again"
LAUNCHER_DIED = "the launcher died without reporting (killed?); Slurm reports {state} exit {code}"


def _exits_text(exits: dict) -> str:
    return ", ".join(f"rank {r} exited with code {c if c is not None else '?'}" for r, c in exits.items())


# ------------------------------------------------------------------------------------------ wait

def pending_text(info, now: float | None = None, countdown: bool = True) -> str:
    """``PENDING (Resources), expected start 2026-12-02T10:15:00 (in 12m00s)``: Slurm's reason, and its
    expected start time when it has one (scontrol's ``StartTime`` of a pending job) that is still ahead."""
    text = info.state or "?"
    if info.reason and info.reason != "None":
        text += f" ({info.reason})"
    ahead = _seconds_until(info.start_time, now)
    if ahead is not None:
        text += f", expected start {info.start_time}" + (f" (in {compact(ahead)})" if countdown else "")
    return text


def _seconds_until(iso: str | None, now: float | None = None) -> float | None:
    then = parse_time(iso)
    if then is None:
        return None
    ahead = then - (time.time() if now is None else now)
    return ahead if ahead > 0 else None


def progress_text(event: "WaitEvent", details: bool = True) -> str:
    """The one-line state of a starting job, without the clock. ``details=False`` leaves out what changes
    without news (the phase's numbers, the countdown to the expected start): the text then changes only
    when the state, the step or the rank count does."""
    job, info, report, phase = event.job, event.job.info, event.report, event.phase
    jid = job.job_id
    if info is None:
        return f"job {jid}: Slurm no longer lists it"
    state = info.state or "?"
    if info.pending or job.requeued and not info.running:
        head = f"job {jid}: " + pending_text(info, countdown=details)
        return head + (", " + REQUEUED.format(n=job.restart) if job.requeued else "")
    if info.state == "COMPLETING" or info.finished:
        return f"job {jid}: {state}"
    parts = [f"job {jid}: {state}"]
    if info.nodelist:
        parts[0] += f" on {info.nodelist}"
    if job.requeued:
        parts.append(f"restart {job.restart}, waiting for the launcher of the new run")
        return ", ".join(parts)
    if event.kind == "live":
        parts.append("endpoint live" + (f", phase: {phase.text(details)}" if phase is not None else ""))
    elif phase is not None:
        parts.append(f"phase: {phase.text(details)}")
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


def slurm_silent_line(text: str, outage_s: float | None = None) -> str:
    """The one line said when Slurm does not answer and the command asks again."""
    within = f" for up to {outage_s:g}s" if outage_s else ""
    return f"Slurm did not answer ({text}); retrying{within}"


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
            self.message(slurm_silent_line(event.text or ""))
        else:
            self.update(progress_text(event), event.elapsed_s, key=progress_text(event, details=False))

    def update(self, text: str, elapsed_s: float | None = None, key: str | None = None) -> None:
        """Show ``text`` (+ elapsed). In plain mode a line is printed only when ``key`` (default: the
        text) differs from the previous one."""
        shown = f"{text} [{compact(elapsed_s)}]" if elapsed_s is not None else text
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
    from ..readiness import block

    ep = result.endpoint
    try:
        text = block(ep if ep is not None else EndpointRecord())
        return text + "".join(f"{label}: {said}\n" for label, said in replica_lines(ep))  # replicas alive
    except ValueError:  # no endpoint.json, or one that lacks what the block says
        if result.report.endpoint_block:
            return result.report.endpoint_block
        return json.dumps(ep.to_dict() if ep is not None else {}, indent=2) + "\n"


def launcher_line(end: dict) -> str | None:
    """What the launcher said about its end (or that it could not): one line, or ``None`` while running."""
    if end["launcher"] == "died":
        if end["slurm_state"] is None:
            return LAUNCHER_DIED.split(";")[0] + "; Slurm no longer lists the job"
        return LAUNCHER_DIED.format(state=end["slurm_state"], code=end["slurm_exit"] or "-")
    if end["launcher"] == "idle stop":
        return f"ended on purpose, not a failure: {end.get('reason')} (code 0)"
    if end["launcher"] == "unrecorded":
        return (f"the launcher ended (code {end.get('code')}: {end.get('reason') or 'no reason given'}) but could "
                f"not write its records: {end.get('write_error')}")
    if end["launcher"] == "reported":
        code = f" (code {end['code']})" if end.get("code") is not None else ""
        return f"the launcher reported: {end.get('reason') or 'no reason given'}{code}"
    if end["launcher"] == "never started" and end["slurm_state"]:
        return (f"the launcher of this run never started; Slurm reports {end['slurm_state']} "
                f"exit {end['slurm_exit'] or '-'}")
    return None


def describe_end(result: "WaitResult") -> list[str]:
    """The lines ``wait`` prints when the job ended before its endpoint was live."""
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
        lines.append("  " + ERROR.line(result.report.last_error))  # the job output's line, as it was
    said = launcher_line(job.launcher_end()) if info is not None else None
    if said and not job.requeued:
        lines.append(f"  {said}")
    if result.phase is not None:
        lines.append(f"  last phase: {result.phase.text()}")
    bad = {r: c for r, c in result.rank_exits.items() if c not in (0, None)}
    if bad:
        lines.append("  rank exits: " + ", ".join(f"rank {r} -> {c}" for r, c in bad.items()))
    # errors first, informational findings after; the knowledge base's order within each
    ranked = sorted(result.findings, key=lambda f: (f.severity != "error", f.status == "informational"))
    for f in ranked[:3]:
        where = f.evidence[0].where if f.evidence else "-"
        mark = " POSSIBLE" if getattr(f, "possible", False) else ""
        lines.append(f"  diagnosis [{f.rule_id}]{mark} {where}: {f.cause}")
        lines.append(f"    fix: {f.fix}")
    lines.append(f"  next: env_layers diagnose {jid}; env_layers logs {jid} --tail 50")
    return lines


def describe_timeout(result: "WaitResult", timeout_s: float) -> list[str]:
    job, info = result.job, result.job.info
    state = info.state if info else "unknown"
    if info is not None and info.pending:
        state = pending_text(info)
    if job.requeued:
        state += ", " + REQUEUED.format(n=job.restart)
    line = f"job {job.job_id} not live after {compact(timeout_s)}: {state}"
    if result.phase is not None:
        line += f", phase: {result.phase.text()}"
    if result.rank_exits:
        line += f", {_exits_text(result.rank_exits)}"
    return [line, f"  the job goes on; `env_layers wait {job.job_id}` again, or "
                  f"`env_layers stop {job.job_id}` to end it"]


# ------------------------------------------------------------------------------------------ status

def format_table(rows: list[dict]) -> str:
    head = ("JOBID", "STATE", "NODES", "TIME LEFT", "TARGET", "MODEL ID", "SERVED NAME", "PHASE", "URL")
    body = []
    for r in rows:
        urls = r.get("urls") or []
        url = " ".join(urls) if urls else "-"  # every replica's, as a loop takes them
        body.append((r["job_id"], r["state"], str(r["nodes"]),
                     compact(r["time_left_s"]) if r["time_left_s"] is not None else "-",
                     r.get("target") or "-", r.get("model_id") or "-", r.get("served_name") or "-",
                     r.get("phase") or "-", url))
    return "\n".join(table([head, *body])) + "\n"


def phase_text(ph: dict) -> str:
    """A record's ``phase`` (``RankProgress.to_dict()``) as ``wait`` shows it."""
    if (ph.get("ranks_total") or 1) > 1:
        return f"{ph['label']} {ph['ranks_at']}/{ph['ranks_total']} ranks"
    detail = ", ".join(f"{k}={v}" for k, v in (ph.get("details") or {}).items())
    return ph["label"] + (f" ({detail})" if detail else "")


def format_record(rec: dict) -> str:
    from ..slurm import TERMINAL_STATES

    s = rec["slurm"] or {}
    jid = rec["job_id"]
    lines = []
    state = rec["state"] or "unknown to Slurm (finished and forgotten)"
    if s.get("state") == "PENDING":
        from ..slurm import JobInfo

        state = pending_text(JobInfo(job_id=jid, state="PENDING", reason=s.get("reason"),
                                     start_time=s.get("start_time")))
    elif s.get("reason") and s.get("reason") != "None" and s.get("state") not in ("RUNNING",):
        state += f" ({s['reason']})"
    if s.get("exit_code") and s.get("state") in TERMINAL_STATES:
        state += f", exit {s['exit_code']}"
    if (rec.get("launcher_end") or {}).get("launcher") == "idle stop":
        state = f"IDLE-STOPPED ({state})"
    lines.append(f"job {jid}: {state}")
    if rec.get("requeued"):
        lines.append(_label("run") + f"{REQUEUED.format(n=rec['restart'])}")
    elif rec.get("restart"):
        lines.append(_label("run") + f"restart {rec['restart']} (its files are at the top of the run dir)")
    if s:
        nodes = f"{s['nodes']} ({s['nodelist']})" if s.get("nodelist") else str(s.get("nodes", "-"))
        lines.append(_label("nodes") + f"{nodes}")
        left = compact(s["time_left_s"]) if s.get("time_left_s") is not None else "-"
        limit = compact(s["time_limit_s"]) if s.get("time_limit_s") is not None else "unlimited"
        lines.append(_label("time") + f"{left} left of {limit}; start {s.get('start_time') or '-'}, "
                     f"end {s.get('end_time') or '-'}")
    if rec.get("target") or rec.get("model_id") or rec.get("served_name"):
        lines.append(_label("target") + (rec.get("target") or "- (not launched from the catalog)"))
        lines.append(_label("model id") + (rec.get("model_id") or "-") + f" ({rec.get('engine') or '?'})")
        lines.append(_label("served name") + (rec.get("served_name") or "-"))
        if rec.get("site"):
            lines.append(_label("site") + rec["site"])
    lines.append(_label("job output") + f"{rec['job_output'] or '-'}")
    unwritable = rec["launcher"].get("run_dir_error")
    if unwritable:  # the job ended before any rank started: it could not write there
        where = rec["run_dir"] or unwritable["path"]
        lines.append(_label("run dir") + f"{where} (not writable: {unwritable['error']})")
    else:
        lines.append(_label("run dir") + f"{rec['run_dir'] or '- (not created yet)'}")
    said = launcher_line(rec["launcher_end"])
    if said:
        lines.append(_label("launcher") + f"{said}")
    la = rec["launcher"]
    if la["ranks_up"] or la["ranks_started"]:
        ups = ", ".join(f"{r} on {h}" for r, h in la["ranks_up"].items())
        total = la["ranks_started"] or len(la["ranks_up"])
        lines.append(_label("ranks") + f"{len(la['ranks_up'])}/{total} up ({ups})")
    if rec["rank_exits"]:
        lines.append(_label("rank exits") + ", ".join(f"rank {r} -> {c}" for r, c in rec["rank_exits"].items()))
    ph = rec["phase"]
    if ph:
        lines.append(_label("phase") + phase_text(ph))
    ep = rec["endpoint"]
    if ep:
        for base in rec.get("urls") or []:
            lines.append(_label("url") + base)
        lines += [_label(label) + said for label, said in replica_lines(EndpointRecord.from_dict(ep))]
        for p in rec["probes"]:
            lines.append(_label("probe") + f"{p['url']}: {'answers' if p['answers'] else 'no answer'} ({p['detail']})")
        if rec["state"] in ("RUNNING",):
            lines.append(_label("use") + f"`env_layers wait {jid}` prints the endpoint block (curl, Python)")
    elif rec["state"] == "RUNNING" and not rec.get("requeued"):
        lines.append(_label("url") + f"not live yet (`env_layers wait {jid}`)")
    for w in la["warnings"]:
        lines.append(_label("warning") + f"{w}")
    for e in la["errors"]:
        if not TAIL_HEADER.match(e):  # "last 20 lines of ...:" introduces the tail, it says nothing
            lines.append(_label("error") + f"{e}")
    chain = rec.get("chain")
    if chain:
        bits = [f"after job {chain['predecessor']}" if chain.get("predecessor") else "first job"]
        if chain.get("successor"):
            bits.append(f"successor job {chain['successor']} ({chain.get('dependency')})")
        elif chain.get("left"):
            bits.append(f"{chain['left']} successor(s) to submit once live")
        else:
            bits.append("last job, no successor")
        lines.append(_label("chain") + "; ".join(bits))
        if chain.get("moved"):
            from .access_format import moved_line

            lines.append(_label("moved") + moved_line(chain["moved"], rec["state"]))
    for run in rec.get("earlier_runs", []):
        lines.append(_label("earlier") + f"{_run_line(run)}")
    lines += gpu_hours_lines(rec.get("accounting"))
    return "\n".join(lines) + "\n"


def _run_line(run: dict) -> str:
    where = f"run-{run['folder']}/" if run["folder"] is not None else "top of the run dir (not moved yet)"
    bits = [f"restart {run['restart']}" if run["restart"] is not None else "restart ?"]
    bits.append("had been live" if run["live"] else "never live")
    bad = {r: c for r, c in run["rank_exits"].items() if c not in (0, None)}
    if bad:
        bits.append("rank exits " + ", ".join(f"{r} -> {c}" for r, c in bad.items()))
    if run["launcher"] in ("reported", "idle stop"):
        bits.append(f"launcher: {run['reason'] or 'ended'}")
    elif run["launcher"] == "died":
        bits.append("launcher ended without reporting")
    return f"{where}: " + ", ".join(bits)


# ------------------------------------------------------------------------------------------ stop

def describe_stop(result: "StopResult") -> list[tuple[str, bool]]:
    """``stop``'s lines as ``(text, to_stderr)``."""
    jid = result.job_id
    out: list[tuple[str, bool]] = []
    if result.successors:
        ids = ", ".join(r.job_id for r in result.successors)
        out.append((f"job {jid}: its chain goes on to job(s) {ids}; stopping those first, latest first, so none "
                    f"starts once this one ends", False))
        for later in result.successors:
            out += ([(f"job {later.job_id}: NOT stopped: {later.error}", True)] if later.error
                    else describe_stop(later))
    if result.cancelled:
        out.append((f"job {jid}: scancel sent ({result.state_before})", False))
    else:
        out.append((f"job {jid}: already ended ({result.state_before or 'forgotten by Slurm'}); nothing to cancel",
                    False))
    if not result.ended:
        out.append((f"job {jid}: still {result.state_after} after {compact(result.waited_s)}", True))
        out.append((f"  Slurm has not ended it yet; check `squeue -j {jid}` and run `env_layers stop {jid}` again",
                    True))
        return out
    if result.cancelled:
        out.append((f"job {jid}: ended ({result.state_after or 'gone from Slurm'}) after "
                    f"{compact(result.waited_s)}", False))
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
