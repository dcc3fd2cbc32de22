"""Ship the catalog (experiments/, containers/) inside the wheel as envlayers/_catalog, so the
commands work outside a checkout. Everything else is in pyproject.toml."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


class BuildPyWithCatalog(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads the checkout itself
        dest = Path(self.build_lib) / "envlayers" / "_catalog"
        for sub in ("experiments", "containers"):
            shutil.copytree(HERE / sub, dest / sub, dirs_exist_ok=True)


setup(cmdclass={"build_py": BuildPyWithCatalog})
