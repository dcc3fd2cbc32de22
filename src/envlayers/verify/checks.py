"""The gates: each sends fixed requests to a live endpoint and judges the answers.

- ``tools``: a tool the model must call comes back as structured ``tool_calls`` (name and JSON
  arguments that parse), not as prose in ``content``;
- ``reasoning``: a reasoning model's reasoning comes back separately (``reasoning_content`` or
  ``reasoning``) and the final answer is clean (no ``<think>``);
- ``accuracy``: the fixed prompts of data/accuracy-prompts.yaml at temperature 0, scored against
  the model's baseline;
- ``metrics``: ``<root>/metrics`` answers Prometheus text.

A failure names the cause and the fix (the missing parser flag and its layer key; the fabric knob for
wrong answers). Every check returns a :class:`Check`; none raises for what the server answered.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..httpclient import Response
from .client import Client, describe
from .data import Baselines, Prompt, final_answer, is_correct

if TYPE_CHECKING:
    from .target import Target

NAMES = ("tools", "reasoning", "accuracy", "metrics")
GDR_DOC = "docs/knobs.md (the fabric) and docs/known-issues.md"

TOOL = {"type": "function", "function": {
    "name": "get_weather",
    "description": "The current weather in a city.",
    "parameters": {"type": "object",
                   "properties": {"city": {"type": "string", "description": "The city, e.g. Paris"}},
                   "required": ["city"]},
}}
TOOL_MESSAGES = [
    {"role": "system", "content": "You answer weather questions only by calling the get_weather tool."},
    {"role": "user", "content": "What is the weather in Paris right now? Use the get_weather tool."},
]
REASONING_PROMPT = "Compute 7 + 5. Think it through, then reply with only the number."
MAX_TOKENS = 2048  # room for a reasoning model to think before it answers
_PROSE_CALL = re.compile(r"<tool_call>|<\|tool_call|\"name\"\s*:\s*\"get_weather\"|get_weather\s*\("
                         r"|functions\.get_weather")


@dataclass
class Check:
    name: str
    status: str  # "pass" | "fail" | "skip"
    summary: str
    evidence: list[str] = field(default_factory=list)
    hint: str | None = None
    url: str | None = None
    data: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"name": self.name, "status": self.status, "summary": self.summary, "evidence": self.evidence,
                "hint": self.hint, "url": self.url, **({"data": self.data} if self.data else {})}


def _message(answer: Response) -> dict | None:
    data = answer.json()
    try:
        message = data["choices"][0]["message"]
    except (TypeError, KeyError, IndexError):
        return None
    return message if isinstance(message, dict) else None


def _finish(answer: Response) -> str | None:
    try:
        return answer.json()["choices"][0].get("finish_reason")
    except (TypeError, KeyError, IndexError, AttributeError):
        return None


def _quote(text: str | None, limit: int = 160) -> str:
    text = "" if text is None else str(text)
    shown = json.dumps(text[:limit])
    return shown + ("..." if len(text) > limit else "")


def _tool_fix(target: "Target") -> str:
    parser = target.tool_call_parser or "<parser>"
    where = f" (the model's parser: {target.tool_call_parser})" if target.tool_call_parser else \
        " (docs/models/<model>.md names the model's parser)"
    if target.engine == "vllm":
        flags = f"--enable-auto-tool-choice --tool-call-parser {parser}"
    elif target.engine == "sglang":
        flags = f"--tool-call-parser {parser}"
    else:
        flags = f"SGLang: --tool-call-parser {parser}; vLLM: --enable-auto-tool-choice --tool-call-parser {parser}"
    return f"start the server with {flags}: layer key TOOL_CALL_PARSER{where}"


def _reasoning_fix(target: "Target") -> str:
    parser = target.reasoning_parser or "<parser>"
    return (f"start the server with --reasoning-parser {parser}: layer key REASONING_PARSER; name it together "
            "with TOOL_CALL_PARSER, with only one the other symptom shows")


def _payload(target: "Target", messages: list[dict], **extra) -> dict:
    return {"model": target.served, "messages": messages, "temperature": 0, "max_tokens": MAX_TOKENS, **extra}


def check_tools(client: Client, target: "Target") -> Check:
    answer = client.post("/chat/completions", _payload(target, TOOL_MESSAGES, tools=[TOOL], tool_choice="auto"))
    check = Check("tools", "fail", "", url=client.base_url)
    if answer.status != 200:
        body = answer.text(300)
        check.evidence.append(describe(answer))
        if answer.status == 400 and ("tool" in body.lower()):
            check.summary = "the server refused a request with tools: it has no tool-call parser"
        else:
            check.summary = "no chat answer to a request with tools"
        check.hint = _tool_fix(target) if answer.status == 400 else None
        return check
    message = _message(answer)
    if message is None:
        check.summary = "the answer is not an OpenAI chat completion"
        check.evidence.append(answer.text(300))
        return check
    calls = message.get("tool_calls") or []
    content = message.get("content")
    if not calls:
        if content and _PROSE_CALL.search(content):
            check.summary = "the tool call came back as prose in content, not as structured tool_calls"
        else:
            check.summary = "no tool_calls: the model answered in prose instead of calling get_weather"
        shown = final_answer(content)
        after = " (after its <think> block)" if shown != (content or "").strip() else ""
        check.evidence.append(f"content{after}: {_quote(shown)}")
        check.evidence.append(f"finish_reason: {_finish(answer)}")
        check.hint = _tool_fix(target)
        return check
    fn = (calls[0] or {}).get("function") or {}
    name, raw_args = fn.get("name"), fn.get("arguments")
    check.evidence.append(f"tool_calls[0]: {name}({raw_args})")
    try:
        args = json.loads(raw_args) if isinstance(raw_args, str) else raw_args
    except ValueError:
        args = None
    if name != "get_weather":
        check.summary = f"the tool call names {name!r}, not get_weather"
        check.hint = f"the tool-call parser may not be the model's: {_tool_fix(target)}"
    elif not isinstance(args, dict):
        check.summary = "the tool call's arguments are not a JSON object"
        check.hint = f"the tool-call parser may not be the model's: {_tool_fix(target)}"
    elif not isinstance(args.get("city"), str) or not args["city"].strip():
        check.summary = "the tool call lacks its required argument city"
    else:
        check.status = "pass"
        check.summary = f"structured tool call get_weather({json.dumps(args)})"
    return check


def check_reasoning(client: Client, target: "Target") -> Check:
    check = Check("reasoning", "fail", "", url=client.base_url)
    if target.reasoning_parser == "":
        check.status = "skip"
        check.summary = f"{target.catalog_model or 'the model'}'s catalog entry names no reasoning parser"
        return check
    answer = client.post("/chat/completions", _payload(target, [{"role": "user", "content": REASONING_PROMPT}]))
    message = _message(answer) if answer.status == 200 else None
    if message is None:
        check.summary = "no chat answer"
        check.evidence.append(describe(answer) if answer.status != 200 else answer.text(300))
        return check
    content = message.get("content") or ""
    field_name = next((k for k in ("reasoning_content", "reasoning") if message.get(k)), None)
    inline = "<think>" in content or "</think>" in content
    final = final_answer(content)
    check.evidence.append(f"content: {_quote(content)}")
    if field_name:
        check.evidence.append(f"{field_name}: {len(message[field_name])} characters")
    check.evidence.append(f"finish_reason: {_finish(answer)}")
    if inline:
        check.summary = "the reasoning is inline in content (<think>...</think>): the server has no reasoning parser"
        check.hint = _reasoning_fix(target)
    elif field_name and not final:
        check.summary = f"reasoning came back in {field_name}, but no final answer after it"
        check.hint = (f"finish_reason {_finish(answer)!r}: with 'length' the model thought past {MAX_TOKENS} "
                      "tokens; otherwise check the reasoning parser is the model's")
    elif field_name:
        check.status = "pass"
        check.summary = f"reasoning separate in {field_name}; final answer {_quote(final, 40)}"
    elif target.reasoning_parser:
        check.summary = (f"no reasoning came back, though {target.catalog_model or 'the model'}'s catalog entry "
                         f"names the reasoning parser {target.reasoning_parser}")
        check.hint = _reasoning_fix(target) + "; or the chat template has thinking turned off"
    else:
        check.status = "skip"
        check.summary = "not a reasoning model: the answer carries no reasoning, and no catalog entry expects any"
    return check


def check_accuracy(client: Client, target: "Target", prompts: list[Prompt], baselines: Baselines) -> Check:
    payloads = [_payload(target, [{"role": "user", "content": p.prompt}]) for p in prompts]
    answers = client.post_all("/chat/completions", payloads)
    baseline = baselines.lookup(target.catalog_model, target.model)
    check = Check("accuracy", "fail", "", url=client.base_url)
    score, errors = 0, 0
    for prompt, answer in zip(prompts, answers):
        message = _message(answer) if answer.status == 200 else None
        if message is None:
            errors += 1
            check.evidence.append(f"{prompt.id}: {describe(answer) if answer.status != 200 else 'not a chat answer'}")
            continue
        ok, got = is_correct(prompt, message.get("content"))
        score += ok
        if not ok:
            check.evidence.append(f"{prompt.id}: expected {prompt.answer!r}, got {_quote(got, 60)}")
    total = len(prompts)
    check.data = {"score": score, "of": total, "min_correct": baseline.min_correct, "baseline": baseline.name,
                  "errors": errors}
    floor = f"baseline {baseline.min_correct}/{total} ({baseline.describe()})"
    if errors == total:
        check.summary = f"no prompt got an answer ({floor})"
        return check
    if score >= baseline.min_correct:
        check.status = "pass"
        check.summary = f"{score}/{total} correct at temperature 0; {floor}"
        return check
    check.summary = f"{score}/{total} correct at temperature 0, below the {floor}"
    gdr = (f"this job ran with NCCL_NET_GDR_LEVEL={target.gdr_level}" if target.gdr_level
           else "this job ran without NCCL_NET_GDR_LEVEL" if target.job_id else "")
    where = "this multi-node endpoint" if target.multi_node else "a multi-node endpoint"
    check.hint = (f"wrong or garbled answers with no error in any log are, on {where}, the symptom of GPU-direct "
                  f"RDMA on the fabric: set NCCL_NET_GDR_LEVEL=LOC (layer key NCCL_NET_GDR_LEVEL, put on the server "
                  f"command) and relaunch" + (f"; {gdr}" if gdr else "") + f". See {GDR_DOC}")
    return check


def check_metrics(client: Client, target: "Target") -> Check:
    url = target.metrics_url or client.root + "/metrics"
    check = Check("metrics", "fail", "", url=url)
    if target.metrics_off is not None:
        check.status = "skip"
        check.summary = f"turned off for this job (SGLANG_ENABLE_METRICS={target.metrics_off!r})"
        return check
    answer = client.request("GET", url)
    if answer.status == 200:
        names = sorted({line.split()[2] for line in answer.body.decode("utf-8", "replace").splitlines()
                        if line.startswith("# TYPE ") and len(line.split()) > 2})
        if names:
            check.status = "pass"
            check.summary = f"Prometheus text, {len(names)} metrics"
            check.evidence.append("e.g. " + ", ".join(names[:3]))
            return check
        check.summary = "/metrics answered 200 but not Prometheus text"
        check.evidence.append(answer.text(120))
        return check
    check.evidence.append(describe(answer))
    check.summary = "/metrics does not answer"
    if answer.status == 404 and target.engine != "vllm":
        check.hint = ("SGLang serves /metrics only with --enable-metrics; the launcher passes it unless "
                      "SGLANG_ENABLE_METRICS is empty or false (docs/keys.md)")
    return check
