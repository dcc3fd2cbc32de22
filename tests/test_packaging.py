"""The wheel carries the catalog, so the commands work outside a checkout, and its console scripts run.

Nothing here depends on an activated virtual environment: the interpreter is sys.executable and the
console scripts are the wheel's own, under the install target's bin/.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_installed_wheel_renders_from_outside_a_checkout(tmp_path):
    wheels, target = tmp_path / "wheels", tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w",
                    str(wheels), str(REPO)], check=True, capture_output=True, timeout=300)
    (wheel,) = wheels.glob("envlayers-*.whl")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    env = {k: v for k, v in os.environ.items() if k != "ENVLAYERS_ROOT"}
    env["PYTHONPATH"] = str(target)
    proc = subprocess.run([sys.executable, "-m", "envlayers", "render", "experiment:glm53", "--format", "json"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert '"SGLANG_ATTENTION_BACKEND": ""' in proc.stdout
    where = subprocess.run([sys.executable, "-c", "import envlayers; print(envlayers.__file__)"], cwd=tmp_path,
                           env=env, capture_output=True, text=True, timeout=60).stdout
    assert where.startswith(str(target))  # the wheel ran, not this checkout
    # the console scripts pip wrote for the wheel (their shebang is this interpreter)
    script = subprocess.run([str(target / "bin" / "env_layers"), "render", "experiment:qwen38"], cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=60)
    assert (script.returncode, script.stderr) == (0, "")
    assert script.stdout == (REPO / "experiments/renders/.env.experiment.qwen38").read_text()
    usage = subprocess.run([str(target / "bin" / "install_edfs"), "--help"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=60)
    assert usage.returncode == 0 and usage.stdout.startswith("Usage: install_edfs [OPTIONS]")
