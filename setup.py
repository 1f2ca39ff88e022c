"""The build step that ships the project's notebooks with the package (everything else is in pyproject.toml).

The repository's notebooks/ is their one source. Building a wheel (from the checkout or from an sdist) copies
the packaged ones (bsresearch/templates.py: PACKAGED) into the built package as bsresearch/_notebooks/, where
bsresearch.templates finds them once installed. An editable install keeps reading notebooks/ itself.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
PACKAGED = ("01_train", "02_noise_scale", "03_sharpness_landscape", "04_systems", "05_advise", "06_own_model",
            "10_sweep_report", "11_train_group")   # as in bsresearch/templates.py (a test checks they agree)


class BuildWithNotebooks(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return   # an editable install reads notebooks/ in the checkout
        target = Path(self.build_lib) / "bsresearch" / "_notebooks"
        target.mkdir(parents=True, exist_ok=True)
        for name in PACKAGED:
            for suffix in (".ipynb", ".py"):
                source = HERE / "notebooks" / f"{name}{suffix}"
                if not source.is_file():
                    raise FileNotFoundError(f"{source}: a packaged notebook is missing from the source tree")
                shutil.copyfile(source, target / source.name)


setup(cmdclass={"build_py": BuildWithNotebooks})
