"""The stand-in engine and the project's vLLM log patterns, held to the REAL vLLM 0.32 (its CPU build).

A module fixture runs the real engine four times, directly (no Slurm), on the tiny seeded model
(tests/realvllm.py, with its 1 GiB CPU KV cache): ``vllm serve`` with both parsers up to live, one chat and
one ``/metrics``; twice with ``--max-model-len`` beyond the model and one parser alone, as an operator who
forgot the other would (each prints its arguments, then refuses: a real root-cause line); and with a flag
missing its value (the argument parser's refusal). Then:

- every vLLM rule of src/envlayers/phases.py matches a line the real engine printed, or is listed in
  ``phases.VLLM_NOT_ON_CPU`` with who prints it and where that is to be read, which is checked: a file of
  the installed engine holding the pattern's words, or a real log here it matches;
- every vLLM pattern of src/envlayers/data/known-issues.yaml (its ``# vllm:`` comment) likewise; and every
  pattern of the knowledge base that matches a real vLLM line carries such a comment;
- every ``vllm:`` metric name the project reads is on the real ``/metrics``;
- the real healthy log gives no ``env_layers diagnose`` finding;
- the stand-in, asked to print 0.32's CPU lines (STANDIN_VLLM_LOG=0.32-cpu), reaches the same phases on
  the same kinds of line as the real engine, and its default (0.28 on GPUs) those of the real 0.28 log in
  tests/data/logs/healthy-vllm.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from nettools import free_port
import yaml

# tests/realvllm.py: the real engine's virtual environment and the tiny model (skips, or fails where required,
# when the engine is not installed here)
realvllm = pytest.importorskip("realvllm")

from envlayers import phases
from envlayers.diagnose import diagnose
from envlayers.diagnose.evidence import LogText
from envlayers.diagnose.rules import default_rules_path, load_rules
from envlayers.launch.idle import METRIC_NAMES, parse_prometheus

pytestmark = pytest.mark.real_vllm

REPO = Path(__file__).resolve().parents[1]
LOGS = REPO / "tests" / "data" / "logs"
STANDIN_VLLM = REPO / "tests" / "standin" / "bin" / "vllm"


@dataclass
class RealRun:
    log: list[str]  # the server's lines, stdout and stderr together, ANSI codes removed
    metrics: str  # /metrics after one chat
    refusals: list[str]  # the lines of the refused starts
    seconds: float


def read(path: Path) -> list[str]:
    return [phases.strip_ansi(line) for line in path.read_text(errors="replace").splitlines()]


def refused(tmp: Path, *extra: str) -> list[str]:
    """A real start that the engine refuses: its lines (it must end non-zero, on its own)."""
    with realvllm.serve(tmp, *extra, wait=False) as server:
        try:
            code = server.proc.wait(realvllm.LIVE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"vllm serve {' '.join(extra)} did not end on its own:\n{server.log_tail()}")
        assert code != 0, server.log_text()
        return read(server.log)


@pytest.fixture(scope="module")
def real(tmp_path_factory) -> RealRun:
    tmp = tmp_path_factory.mktemp("real-vllm")
    t0 = time.monotonic()
    with realvllm.serve(tmp, "--reasoning-parser", "qwen3", "--tool-call-parser", "hermes",
                        "--enable-auto-tool-choice") as server:
        deadline = time.monotonic() + 60  # uvicorn's line follows the first answer closely
        while "Application startup complete" not in server.log_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        status, _ = server.post("/v1/chat/completions", {"model": realvllm.SERVED, "max_tokens": 4,
                                                         "messages": [{"role": "user", "content": "Say hi."}]})
        assert status == 200, server.log_tail()
        status, metrics = server.get("/metrics", timeout=30)
        assert status == 200
        log = server.log
    log = read(log)
    # each prints its arguments (one parser alone, as an operator who forgot the other: the knowledge base's
    # one-parser patterns then have a real line), then refuses the length: a real root-cause line
    too_long = refused(tmp, "--reasoning-parser", "qwen3", "--max-model-len", "100000")
    tools_only = refused(tmp, "--tool-call-parser", "hermes", "--enable-auto-tool-choice", "--max-model-len", "100000")
    no_value = refused(tmp, "--tool-call-parser")  # the argument parser's refusal
    run = RealRun(log, metrics, too_long + tools_only + no_value, time.monotonic() - t0)
    print(f"\n[real-vllm] the real engine's four runs took {run.seconds:.0f}s", flush=True)
    return run


# --------------------------------------------------------------------------- where a line is printed


def longest_literal(pattern: str) -> str:
    """The longest run of plain characters a regex must match (its words, to look for in the engine)."""
    try:
        from re import _parser as sre_parse  # Python 3.11+
    except ImportError:  # pragma: no cover
        import sre_parse
    best = run = ""
    for op, arg in sre_parse.parse(pattern):
        if op is sre_parse.LITERAL:
            run += chr(arg)
            best = max(best, run, key=len)
        else:
            run = ""
    return best.strip()


def vllm_package() -> Path:
    found = list((realvllm.venv() / "lib").glob("python3*/site-packages/vllm"))
    assert found, f"no vllm package under {realvllm.venv()}"
    return found[0]


def check_where(pattern: str, where: str) -> None:
    """``where`` names who prints ``pattern`` and where to read it: each ``vllm/...`` file named exists in the
    installed engine and holds the pattern's words, unless the entry says the engine no longer has it ("gone"),
    in which case it must indeed be gone; each ``tests/data/logs/...`` file has a line the pattern matches."""
    assert re.search(r"\b(?:0\.\d+|V0)\b", where) and re.search(r"GPU|CPU|CUDA|ROCm|V0|answers|error|without", where), \
        f"{pattern!r}: {where!r} names no engine version and platform"
    files = re.findall(r"\bvllm/[\w/]+\.py\b", where)
    logs = re.findall(r"\btests/data/logs/[\w./-]+\b", where)
    assert files or logs, f"{pattern!r}: {where!r} names no file of the engine nor a real log"
    words = longest_literal(pattern)
    for rel in files:
        path = vllm_package().parent / rel
        if "gone" in where:
            assert not path.exists(), f"{pattern!r}: {where!r} says it is gone, but {path} exists"
            continue
        assert path.is_file(), f"{pattern!r}: {where!r}: no {path}"
        text = re.sub(r"""(['"])\s*\n\s*(['"])""", "", path.read_text(errors="replace"))  # "a " "b": "a b"
        assert len(words) >= 6 and words in text, \
            f"{pattern!r}: {path} does not hold {words!r}"
    for rel in logs:
        lines = read(REPO / rel)
        assert any(re.search(pattern, line) for line in lines), f"{pattern!r}: no line of {rel} matches it"


def matches(pattern: str, lines: list[str]) -> bool:
    regex = re.compile(pattern)
    return any(regex.search(line) for line in lines)


# --------------------------------------------------------------------------- phases.py


def vllm_phase_rules() -> list[str]:
    return [regex.pattern for engine, _name, regex, _groups in phases.RULES if engine == "vllm"]


def test_every_vllm_phase_rule_matches_the_real_log_or_says_who_prints_it(real):
    printed = [p for p in vllm_phase_rules() if matches(p, real.log)]
    assert [p for p in printed if p in phases.VLLM_NOT_ON_CPU] == [], "listed as not printed on CPUs, yet printed"
    for pattern in vllm_phase_rules():
        if pattern not in printed:
            assert pattern in phases.VLLM_NOT_ON_CPU, f"{pattern!r}: the real 0.32 CPU log has no such line"
            check_where(pattern, phases.VLLM_NOT_ON_CPU[pattern])
    assert set(phases.VLLM_NOT_ON_CPU) <= set(vllm_phase_rules())


def test_the_real_log_reaches_every_startup_phase_but_graph_capture_in_order(real):
    report = phases.parse_phases(real.log)
    assert report.engine == "vllm"
    assert [p.name for p in report.phases] == ["loading", "weights-loaded", "kv-cache", "ready"]  # --enforce-eager
    assert report.get("kv-cache").details["kv_cache_gib"] == 1.0  # VLLM_CPU_KVCACHE_SPACE=1


# --------------------------------------------------------------------------- known-issues.yaml


_PATTERN_LINE = re.compile(r"""^\s*(?:-\s+)?(?:\{?\s*pattern:\s+)?('(?:[^']|'')*'|"(?:[^"\\]|\\.)*")""")


def tagged_patterns() -> tuple[dict[str, str], set[str]]:
    """({pattern: its ``# vllm:`` comment}, every pattern the file holds), read from the file's text: a comment
    after the pattern on its line, or on the comment line just above it."""
    tags: dict[str, str] = {}
    seen: set[str] = set()
    above = None
    for line in default_rules_path().read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("# vllm:"):
            above = stripped[len("# vllm:"):].strip()
            continue
        m = _PATTERN_LINE.match(line)
        if m and ("- " in line[: m.start(1)] or "pattern:" in line[: m.start(1)]):
            pattern = yaml.safe_load(m.group(1))
            seen.add(pattern)
            rest = line[m.end(1):]
            tag = re.search(r"#\s*vllm:\s*(.*)$", rest)
            if tag or above:
                tags[pattern] = (tag.group(1) if tag else above).strip()
        if not stripped.startswith("#"):
            above = None
    return tags, seen


def every_rule_pattern() -> set[str]:
    out = set()
    for rule in load_rules():
        groups = [rule.signature, rule.not_followed_by, rule.requires, rule.unless]
        if rule.trend:
            groups.append([rule.trend.pattern])
        if rule.possible:
            groups += [rule.possible.context, rule.possible.also]
        out |= {p.regex.pattern for group in groups for p in group}
    return out


def test_the_tags_are_read_from_every_pattern_of_the_knowledge_base():
    tags, seen = tagged_patterns()
    assert seen == every_rule_pattern()
    assert tags  # the vLLM patterns carry their comment


def test_every_vllm_pattern_of_the_knowledge_base_matches_the_real_engine_or_says_who_prints_it(real):
    tags, _ = tagged_patterns()
    lines = real.log + real.refusals
    for pattern, tag in tags.items():
        if tag == "printed":
            assert matches(pattern, lines), f"{pattern!r} is tagged printed, but no real 0.32 CPU line matches it"
        else:
            assert not matches(pattern, lines), f"{pattern!r}: the real engine printed it: tag it `# vllm: printed`"
            check_where(pattern, tag)


def test_every_pattern_that_matches_a_real_vllm_line_is_tagged(real):
    tags, seen = tagged_patterns()
    lines = real.log + real.refusals
    untagged = sorted(p for p in seen - set(tags) if matches(p, lines))
    assert untagged == [], "these patterns match lines the real vLLM printed: say so with `# vllm: printed`"


# --------------------------------------------------------------------------- metrics, diagnose


def names_the_project_reads() -> set[str]:
    names = {n for group in METRIC_NAMES["vllm"] for n in group}
    for path in (REPO / "src" / "envlayers").rglob("*.py"):
        names |= set(re.findall(r"\bvllm:[a-z_]+[a-z]", path.read_text()))
    return names


def test_every_metric_name_the_project_reads_is_on_the_real_metrics(real):
    served = parse_prometheus(real.metrics)
    read = names_the_project_reads()
    assert "vllm:num_requests_running" in read and "vllm:request_success_total" in read
    assert sorted(read - set(served)) == [], sorted(n for n in served if n.startswith("vllm:"))
    assert served["vllm:request_success_total"] >= 1  # the chat was counted


def test_a_healthy_real_log_gives_no_diagnose_finding(real, tmp_path):
    assert diagnose([LogText("server-0.log", real.log)], load_rules()) == []
    path = tmp_path / "server-0.log"
    path.write_text("\n".join(real.log) + "\n")
    res = subprocess.run([sys.executable, "-m", "envlayers", "diagnose", str(path)], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert res.returncode == 0, res.stdout + res.stderr


def test_the_refused_length_gives_a_root_cause_line_the_launcher_can_quote(real):
    from envlayers.rootcause import root_cause

    cause = root_cause(real.refusals)
    assert cause and "100000" in cause and "max_model_len" in cause, cause


# --------------------------------------------------------------------------- the stand-in


def standin_log(tmp_path: Path, flavour: str | None, model: str, *extra: str) -> list[str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("STANDIN_")}
    env.update(STANDIN_LOAD_SECONDS="0.5", VLLM_CPU_KVCACHE_SPACE="1")
    if flavour:
        env["STANDIN_VLLM_LOG"] = flavour
    out = tmp_path / f"standin-{flavour}.log"
    with open(out, "w") as fh:
        proc = subprocess.Popen([str(STANDIN_VLLM), "serve", model, "--served-model-name", realvllm.SERVED,
                                 "--host", "127.0.0.1", "--port", str(port), *extra],
                                stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 60
        while "Application startup complete" not in out.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, out.read_text()
            time.sleep(0.05)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    return read(out)


_NORMALIZE = [
    (re.compile(r"^\((\w+?)(?:_DP\d+|_TP\d+|_PP\d+_TP\d+)? pid=\d+\) "), r"(\1 pid=N) "),
    (re.compile(r"\b\d\d-\d\d \d\d:\d\d:\d\d\b"), "MM-DD hh:mm:ss"),
    (re.compile(r"\[([\w.]+\.py):\d+\]"), r"[\1:N]"),
    (re.compile(r"\d[\d,.]*"), "N"),
    (re.compile(r"N(?:it/s|s/it)\b"), "N<rate>"),  # tqdm shows its rate either way round
    (re.compile(r"\s+"), " "),
]


def shape(line: str) -> str:
    """A line with its numbers, times, pids and source lines taken out: what kind of line it is."""
    for regex, repl in _NORMALIZE:
        line = regex.sub(repl, line)
    return line.strip()


def phase_lines(lines: list[str]) -> dict[str, set[str]]:
    """vLLM phase rule -> the kinds of line it matched."""
    out: dict[str, set[str]] = {}
    for pattern in vllm_phase_rules():
        hits = {shape(line) for line in lines if re.search(pattern, line)}
        if hits:
            out[pattern] = hits
    return out


@pytest.mark.parametrize("flavour, model, extra, real_log", [
    pytest.param("0.32-cpu", None, realvllm.SERVE_ARGS, None,
                 id="0.32-cpu-against-the-real-engine-now"),
    pytest.param(None, "openai/gpt-oss-120b", ("--tensor-parallel-size", "4"), "healthy-vllm/server-0.log",
                 id="default-0.28-gpu-against-a-real-0.28-rocm-log"),
])
def test_the_standin_prints_the_phase_lines_the_real_engine_prints(real, tmp_path, flavour, model, extra, real_log):
    real_lines = real.log if real_log is None else read(LOGS / real_log)
    stand = standin_log(tmp_path, flavour, model or str(realvllm.model_dir()), *extra)
    assert [p.name for p in phases.parse_phases(stand).phases] == \
        [p.name for p in phases.parse_phases(real_lines).phases]
    theirs, ours = phase_lines(real_lines), phase_lines(stand)
    assert set(ours) == set(theirs), {"only the stand-in": set(ours) - set(theirs),
                                      "only the real engine": set(theirs) - set(ours)}
    for pattern, kinds in ours.items():
        assert kinds <= theirs[pattern], (pattern, kinds - theirs[pattern], theirs[pattern])


def test_the_standin_names_the_processes_and_the_server_line_as_0_32_does(real, tmp_path):
    stand = standin_log(tmp_path, "0.32-cpu", str(realvllm.model_dir()), *realvllm.SERVE_ARGS)
    for lines in (real.log, stand):
        text = "\n".join(lines)
        assert re.search(r"^\(EngineCore pid=\d+\) ", text, re.M) and re.search(r"^\(Worker pid=\d+\) ", text, re.M)
        assert re.search(r"\[entry\.py:\d+\] Starting vLLM server on http://127\.0\.0\.1:\d+$", text, re.M)
        assert re.search(r"^INFO:     Application startup complete\.$", text, re.M)  # uvicorn's own, bare
        assert re.search(r"version 0\.32\.0$", text, re.M)  # the banner, not "vLLM API server version"
        assert "Model loading took" not in text and "vLLM API server version" not in text
