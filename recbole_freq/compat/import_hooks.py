"""Patching a RecBole module when it is first imported, never importing it to patch it.

12. ``recbole.quick_start`` imports Ray at module level (for ``run_hyper``), and patching
    it (fixes 2 and 7) imported Ray into every run: seconds of start-up and Ray's own
    warnings for a job that never searches.  Its patches now run when a program first
    imports it (``when_imported``: an import hook that patches the module right after it
    executes), or at once if it already was.  Tests:
    ``test_recbole_habits.test_importing_the_plugin_imports_no_ray_*``,
    ``test_a_plain_training_run_imports_no_ray``.
"""

from __future__ import annotations

import importlib.abc
import sys


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Runs the patches of ``when_imported`` right after their module executes (fix 12)."""

    def find_spec(self, name, path, target=None):
        if name not in _AFTER_IMPORT:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _LoaderThenPatch(spec.loader, name)
                return spec
        return None


class _LoaderThenPatch(importlib.abc.Loader):
    def __init__(self, loader, name: str):
        self.loader, self.name = loader, name

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        for before in _BEFORE_IMPORT.get(self.name, ()):
            before(self.name)
        self.loader.exec_module(module)
        for patch in _AFTER_IMPORT.get(self.name, ()):
            patch(module)


# Module name -> patches to run once it is imported (fix 12), and what to run just before.
_AFTER_IMPORT: dict[str, list] = {}


_BEFORE_IMPORT: dict[str, list] = {}


def when_imported(name: str, patch, before=None) -> None:
    """Run ``patch(module)`` on module ``name``: now if it is imported, else right after
    its first import, so that patching a module never imports it (fix 12);
    ``before(name)`` runs just before that import executes the module."""
    if name in sys.modules:
        patch(sys.modules[name])
        return
    _AFTER_IMPORT.setdefault(name, []).append(patch)
    if before is not None:
        _BEFORE_IMPORT.setdefault(name, []).append(before)
    if not any(isinstance(finder, _PatchAfterImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PatchAfterImport())
