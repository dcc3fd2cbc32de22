"""joblines: each line of the job output is declared once; what a producer makes, its reader reads back."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

from envlayers import joblines, rundir
from envlayers.jobscript import _SCRIPT_LINES
from envlayers.launch.ranks import RANK_UP_ECHO

SRC = Path(__file__).resolve().parents[1] / "src" / "envlayers"

SAMPLES = [
    pytest.param(joblines.RUN_DIR, {"path": "/scratch/u/inference-server/42"}, id="run-dir"),
    pytest.param(joblines.RANK_UP, {"rank": "3", "host": "nid001234"}, id="rank-up"),
    pytest.param(joblines.ALL_STARTED, {"n": "4"}, id="all-started"),
    pytest.param(joblines.LIVE, {"seconds": "123.4"}, id="live"),
    pytest.param(joblines.TAIL_HEADER, {"n": "20", "log": "/r/42/server-1.log"}, id="tail-header"),
    pytest.param(joblines.UNRECORDED_END, {"code": "-15", "path": "/r/42/launch-end.json",
                                           "why": "No space left on device", "reason": "received signal 15"},
                 id="unrecorded-end"),
    pytest.param(joblines.RUN_DIR_UNWRITABLE, {"path": "/r/42", "error": "Read-only file system",
                                               "doing": "writing serve.env"}, id="run-dir-unwritable"),
]


@pytest.mark.parametrize("form, values", SAMPLES)
def test_a_produced_line_parses_back_to_its_values(form, values):
    produced = form.line(**({**values, "seconds": float(values["seconds"])} if "seconds" in values else values))
    kind, text = joblines.parse(produced)
    assert kind == form.kind.name
    assert form.match(text) == values
    assert form.match_line(produced) == values


def test_every_form_is_in_the_list_and_no_two_read_the_same_line():
    assert {id(f) for f in joblines.FORMS} == {id(p.values[0]) for p in SAMPLES}
    for param in SAMPLES:
        form, values = param.values
        text = form.text_of(**({**values, "seconds": 1.0} if "seconds" in values else values))
        assert [f for f in joblines.FORMS if f.kind == form.kind and f.match(text)] == [form]


@pytest.mark.parametrize("text, form, values", [
    ("all 4 ranks launched", joblines.ALL_STARTED, {"n": "4"}),
    ("all 1 rank started", joblines.ALL_STARTED, {"n": "1"}),
    ("endpoint live after 12.5 s", joblines.LIVE, {"seconds": "12.5"}),
])
def test_what_earlier_launchers_printed_is_still_read(text, form, values):
    assert form.match(text) == values


def test_a_line_of_another_kind_or_rank_is_not_taken():
    assert joblines.RANK_UP.match_line("ENVLAYERS-WARN: rank 0 up on n1") is None
    assert joblines.RANK_UP.match("rank x up on n1") is None
    assert joblines.parse("ENVLAYERS-POOL: grow") is None  # not a kind the launcher's report reads
    assert joblines.parse("  ENVLAYERS-STAGE: indented") is None
    assert joblines.TAIL_HEADER.match("last 20 lines of /r/server-0.log: and more") is None  # it ends the line


def test_the_launcher_report_reads_the_produced_lines():
    out = "\n".join([joblines.RUN_DIR.line(path="/r/42"), joblines.RANK_UP.line(rank=0, host="n1"),
                     joblines.RANK_UP.line(rank=1, host="n2"), joblines.ALL_STARTED.line(n=2),
                     joblines.TAIL_HEADER.line(n=20, log="/r/42/server-1.log"),
                     joblines.ERROR.line("rank 1 died"), joblines.LIVE.line(seconds=61.26)]) + "\n"
    report = rundir.parse_job_output(out)
    assert report.run_dir == "/r/42" and report.ranks_up == {0: "n1", 1: "n2"} and report.ranks_started == 2
    assert report.live_after_s == 61.3 and report.last_error == "rank 1 died"


def _bash(script: str) -> str:
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout


def test_the_scripts_print_the_declared_lines():
    # ranks.sh and the job script fill the fields in the shell: what bash prints is what the reader reads
    said = _bash(f'rank=7; SLURMD_NODENAME=nid9; echo "{RANK_UP_ECHO}"')
    assert joblines.RANK_UP.match_line(said.strip()) == {"rank": "7", "host": "nid9"}
    said = _bash(f'RUN_DIR=/s/42; echo "{_SCRIPT_LINES["run_dir"]}"')
    assert joblines.RUN_DIR.match_line(said.strip()) == {"path": "/s/42"}
    said = _bash(f'f() {{ said="mkdir: /s/42: Disk quota exceeded"; RUN_DIR=/s/42; echo "{_SCRIPT_LINES["unwritable"]}"; }}; '
                 'f "making the run folder"')
    assert joblines.RUN_DIR_UNWRITABLE.match_line(said.strip()) == {
        "path": "/s/42", "error": "Disk quota exceeded", "doing": "making the run folder"}


PREFIX_RE = re.compile(r"ENVLAYERS-([A-Z]+):")


def test_every_line_prefix_in_the_sources_is_a_declared_kind():
    # the producers that spell a kind themselves (free text after it) spell only kinds declared here
    files = [p for p in SRC.rglob("*") if p.suffix in (".py", ".j2") and "__pycache__" not in p.parts]
    found = {m.group(1): p for p in files for m in PREFIX_RE.finditer(p.read_text(encoding="utf-8"))}
    assert found  # the scan sees the producers
    unknown = {k: str(p) for k, p in found.items() if k not in joblines.BY_NAME}
    assert not unknown, f"undeclared ENVLAYERS- kinds: {unknown}"


def test_the_gateways_own_lines_are_the_relayed_ones():
    # gateway_app.py runs with the standard library and Ray only: it spells its lines, the relay reads them
    text = (SRC / "gateway_app.py").read_text(encoding="utf-8")
    spelled = set(re.findall(r"ENVLAYERS-[A-Z]+: gateway: ", text))
    assert spelled and spelled <= set(joblines.GATEWAY_LINES)


# Modules that still spell a kind in their own string literals: the standalone scripts (standard library only,
# they cannot import joblines).
SPELL_THEIR_OWN = {"gateway_app.py", "launch/raynode.py", "joblines.py"}


def _literals(tree):
    """Every string constant of a module (f-strings' literal parts included), docstrings left out."""
    docs = {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [n.value for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]


def test_the_package_makes_its_lines_through_joblines():
    spelled = set()
    for path in SRC.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if any(PREFIX_RE.search(text) for text in _literals(tree)):
            spelled.add(path.relative_to(SRC).as_posix())
    assert "launch/raynode.py" in spelled  # the scan sees a literal where one is
    assert spelled <= SPELL_THEIR_OWN, f"make these lines with joblines' kinds: {sorted(spelled - SPELL_THEIR_OWN)}"
