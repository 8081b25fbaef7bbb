"""Where ``abstract_client.providers`` comes from when running from a checkout.

The lanes live in the repository's top-level ``providers/`` folder, but nothing generic is
installed at the top level of site-packages: the wheel ships that folder as
``abstract_client/providers`` (pyproject's ``force-include``), so an application with a
``providers`` package of its own can never shadow a lane. A checkout — the tests, an editable
install — has no such folder inside the package; this finder maps exactly the one name
``abstract_client.providers`` onto the repository's folder (hatch's editable installs cannot
remap a folder into a package: they only put the repository on ``sys.path``).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

__all__ = ["install"]

_NAME = "abstract_client.providers"


class _CheckoutLanes(importlib.abc.MetaPathFinder):
    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != _NAME:
            return None  # the lanes' own modules are found through the package's __path__
        return importlib.util.spec_from_file_location(
            fullname, self.folder / "__init__.py", submodule_search_locations=[str(self.folder)]
        )


def install(package_dir: Path) -> None:
    """Map ``abstract_client.providers`` onto the checkout's folder, when this is a checkout."""
    if (package_dir / "providers").is_dir():
        return  # an installed wheel: the lanes are inside the package
    folder = package_dir.parent / "providers"
    if not (folder / "_engine.py").is_file():
        return
    if not any(isinstance(f, _CheckoutLanes) for f in sys.meta_path):
        sys.meta_path.append(_CheckoutLanes(folder))


install(Path(__file__).resolve().parent)
