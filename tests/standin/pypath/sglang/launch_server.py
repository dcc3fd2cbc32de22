"""Test-only stand-in for ``python -m sglang.launch_server``: runs tests/standin/engine.py."""
import importlib.util
import os
import sys


def _load_engine():
    here = os.path.dirname(os.path.realpath(__file__))
    path = os.path.join(os.path.dirname(os.path.dirname(here)), "engine.py")
    spec = importlib.util.spec_from_file_location("envlayers_standin_engine", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":
    sys.exit(_load_engine().main_sglang(sys.argv[1:]))
