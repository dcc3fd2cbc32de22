"""The one way a test skips when an optional extra of pyproject.toml (bench, report, ray, router, test) is not
installed: ``needs_extra(module, extra)`` imports the module, or skips the test saying which extra brings it."""

from __future__ import annotations

import pytest


def needs_extra(module: str, extra: str):
    """``module``, imported; else the test (or, at a module's top, the module) is skipped, naming ``extra``."""
    return pytest.importorskip(module, reason=f"needs the `{extra}` extra (pip install '.[{extra}]'): "
                                              f"{module} is not installed")
