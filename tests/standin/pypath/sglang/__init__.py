"""Test-only stand-in for the ``sglang`` package (envlayers tests): only ``python -m sglang.launch_server``."""

__version__ = "0.5.20"
