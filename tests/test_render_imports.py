"""`env_layers render` imports only what a render uses (docs/layers.md, "Start-up"): a command's module is
imported when that command runs, so a render never pays for the job script (its module and Jinja2), the
launcher, the engines' command lines or tomli-w. click, PyYAML, dataclasses and typing are used plainly and
are not checked here. A real process, so nothing this test run imported hides an import.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NOT_FOR_A_RENDER = ("jinja2", "tomli_w", "envlayers.jobscript", "envlayers.scripttext", "envlayers.launch",
                    "envlayers.engines", "envlayers.edf", "envlayers.topology")
PROBE = """
import json, sys
from envlayers.cli import main
try:
    main(["render", "experiment:glm53"])
except SystemExit as end:
    assert not end.code, end.code
print(json.dumps(sorted(sys.modules)), file=sys.stderr)
"""


def test_a_render_imports_neither_the_job_script_nor_the_launcher_nor_jinja2():
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip(), "the render printed nothing"
    modules = set(json.loads(proc.stderr.strip().splitlines()[-1]))
    assert "envlayers.layers" in modules and "click" in modules  # the probe did render
    assert sorted(m for m in modules if any(m == p or m.startswith(p + ".") for p in NOT_FOR_A_RENDER)) == []
