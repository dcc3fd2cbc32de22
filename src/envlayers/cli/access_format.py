"""Terminal text of the access commands (connect, ping, release) and the ``moved:`` line of a chain,
from the records ``envlayers.access`` returns (``connect_info``'s dict, ``PingResult``, ``ReleaseResult``,
``chain.newest_live``'s dict). ``status`` takes the ``moved:`` line from here too."""

from __future__ import annotations

from .. import shell
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..access.ping import PingResult
    from ..access.release import ReleaseResult


def format_connect(data: dict) -> str:
    jid = data["job_id"]
    lines = []
    if data.get("moved"):
        lines.append(f"moved:       {moved_line(data['moved'], data['moved'].get('from_state'))}")
    lines.append(f"job {jid}: {data['state'] or 'unknown to Slurm'}" + ("" if data["live"] else " (endpoint not live)"))
    reach = data["reachable_urls"]
    for i, base in enumerate(data["base_urls"]):
        also = f"  (by address: {reach[i]})" if i < len(reach) and reach[i] != base else ""
        lines.append(f"base URL:    {base}{also}")
    if not data["base_urls"]:
        lines.append(f"base URL:    none yet (`env_layers wait {jid}`)")
    lines.append(f"served name: {data['served_model_name'] or '-'} (what clients pass as model)")
    if not data["api_key_required"]:
        lines.append('API key:     none needed; OpenAI clients still want one: pass api_key="EMPTY" '
                     "(anyone who can reach the address can use it)")
    elif data.get("api_key"):
        lines.append(f"API key:     {data['api_key']}")
    elif data["api_key_file"]:
        lines.append(f"API key:     required; it is in {data['api_key_file']} "
                     "(send 'Authorization: Bearer <key>'; --show-key prints it)")
    else:
        lines.append("API key:     required; its file is not recorded in the run directory")
    gw = data["gateway"]
    if gw:
        lines.append(f"gateway:     {gw['base_url']} on {gw['destination']} (tunnel open; provider_model_id "
                     f"{gw['provider_model_id']})")
    shut = data.get("tunnel_closed")
    if shut:
        lines.append(f"gateway:     {shut['base_url']} on {shut['destination']}: tunnel closed at {shut['closed_at']} "
                     f"({shut['closed_why']}); that route leads nowhere now")
    laptop = data.get("laptop")
    if laptop:
        lines.append(f"laptop:      {shell.words(laptop['ssh'])}  (leave it running), then base URL "
                     f"{laptop['base_url']}" + (" with the same key" if data["api_key_required"] else ""))
    lines.append(f"check:       env_layers ping {jid}")
    lines.append(f"stop:        env_layers stop {jid}")
    for w in data["warnings"]:
        lines.append(f"warning:     {w}")
    return "\n".join(lines) + "\n"


def format_ping(results: list["PingResult"]) -> str:
    lines = []
    for r in results:
        lines.append(f"{r.base_url}: {'ok' if r.ok else 'FAILED'} (model {r.served_model_name or '?'})")
        for c in r.checks:
            took = f"{c.latency_s * 1000:.0f} ms" if c.latency_s is not None else "-"
            what = "GET /v1/models" if c.name == "models" else "POST /v1/chat/completions (max_tokens=1)"
            lines.append(f"  {what}: {c.status or 'no answer'} in {took}: {c.detail}")
    return "\n".join(lines) + "\n"


_LABELS = {"route": "1. gateway route", "successors": "2c. successors (chain)", "tunnel": "2. tunnel", "containers": "2b. containers",
           "job": "3. server and allocation",
           "gateway-port": "4. gateway port"}


def format_release(result: "ReleaseResult") -> str:
    lines = []
    for s in result.steps:
        lines.append(f"{_LABELS[s.name]}: {s.status}: {s.detail}")
        lines += [f"     {ln}" for ln in s.lines]
    if not result.ok:
        lines.append(f"job {result.job_id}: NOT fully released; fix the failed step(s) and run "
                     f"`env_layers release {result.job_id}` again")
    elif result.already:
        lines.append(f"job {result.job_id}: everything is already released")
    else:
        lines.append(f"job {result.job_id}: released")
    return "\n".join(lines) + "\n"


def moved_line(moved: dict, from_state: str | None) -> str:
    """``the endpoint moved from job A (COMPLETED) to job C, its successor (chain A -> B -> C); new base
    URL: ...``, in the words ``connect`` and ``status`` both use."""
    path = " -> ".join(moved["links"])
    after = "its successor" if len(moved["links"]) == 2 else "a later successor"
    was = f" ({from_state})" if from_state else ""
    if from_state in ("RUNNING", "COMPLETING"):
        was = f" ({from_state}: it drains and ends)"
    urls = ", ".join(moved["base_urls"]) or "-"
    return (f"the endpoint moved from job {moved['from']}{was} to job {moved['to']}, {after} (chain {path}); "
            f"new base URL: {urls}")
