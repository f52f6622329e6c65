"""20. RecBole on its own in the plugin's environment: the fixes whenever RecBole is imported.

A plain RecBole program in the environment the plugin sets up failed unless it imported
``recbole_freq`` first: ``run_recbole`` stopped at numpy 2's missing ``np.float_`` (fix 1),
``load_data_and_model`` of a plugin checkpoint at ``KeyError: 'seed'`` (fix 2).  A line
in a ``.pth`` file of the environment's site-packages (``HOOK_FILE``) puts a finder on
``sys.meta_path`` at interpreter start; the first ``import recbole`` makes it remove
itself and import ``recbole_freq`` (which installs every fix, importing no RecBole
module), then RecBole loads as usual.  The hook fails open: where ``recbole_freq`` cannot
be imported (uninstalled with the ``.pth`` left behind, a broken installation) RecBole
loads without the fixes, after one warning that says how to take the hook out.  Until then it costs one call per new import, and
a program that never imports RecBole never loads the plugin.

``scripts/dev setup`` installs it into ``.venv``; a pip installation adds it with
``python -m recbole_freq.compat.site_hook`` (``--remove`` takes it out again).  Test:
``test_recbole_habits.test_plain_recbole_runs_in_the_plugins_environment``.
"""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

HOOK_FILE = "recbole_freq_fixes.pth"

# One line, as .pth files execute lines that start with "import"; once, though a venv's
# site-packages may be read twice (lib and its lib64 link).
HOOK_LINE = (
    'import sys; exec("class RecBoleFreqFixes:\\n'
    " def find_spec(self, name, path=None, target=None):\\n"
    "  if name == 'recbole':\\n"
    "   sys.meta_path.remove(self)\\n"
    "   try:\\n"
    "    import recbole_freq\\n"
    "   except Exception as error:\\n"
    "    import warnings\\n"
    "    warnings.warn('recbole-freq fixes not applied (' + repr(error) + '): RecBole loads "
    "without them; python -m recbole_freq.compat.site_hook --remove, or delete "
    f"{HOOK_FILE} from site-packages, takes this hook out', RuntimeWarning, 2)\\n"
    "  return None\\n"
    "'recbole' in sys.modules or any(type(f).__name__ == 'RecBoleFreqFixes' for f in "
    'sys.meta_path) or sys.meta_path.insert(0, RecBoleFreqFixes())")\n'
)


def site_packages() -> Path:
    """The site-packages folder of the running interpreter's environment."""
    return Path(sysconfig.get_paths()["purelib"])


def install(folder: Path | None = None) -> Path:
    """Write ``HOOK_FILE`` into ``folder`` (site-packages by default), whole or not at
    all; returns its path."""
    from recbole_freq.utils.files import write_atomic

    path = Path(folder or site_packages()) / HOOK_FILE
    write_atomic(path, HOOK_LINE)
    return path


def remove(folder: Path | None = None) -> Path:
    path = Path(folder or site_packages()) / HOOK_FILE
    path.unlink(missing_ok=True)
    return path


def main(argv: list[str]) -> int:
    if argv not in ([], ["--remove"]):
        print("usage: python -m recbole_freq.compat.site_hook [--remove]", file=sys.stderr)
        return 2
    from recbole_freq.utils.files import OutputWriteError

    try:
        if argv:
            print(f"removed {remove()}")
        else:
            path = install()
            print(f"RecBole imported in this environment now gets recbole-freq's fixes: {path}")
    except (OSError, OutputWriteError) as error:
        what = "remove" if argv else "write"
        print(f"error: cannot {what} {site_packages() / HOOK_FILE}: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
