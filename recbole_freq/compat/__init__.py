"""Every fix that RecBole 1.2.1 needs to run on our modern stack, one module per area.

RecBole 1.2.1 was written for numpy 1.x, pandas 1.x/2.x, torch < 2.6 and Ray <= 2.6.3.
Each fix names the break it repairs, the RecBole issue and its test, in the docstring of
its module; none changes what RecBole computes, so RecBole's built-in models and
evaluators behave as on the stack they were written for.  The numbers are stable (docs
and tests cite them):

- ``numeric_stack``: 1 numpy 2's removed aliases, 3 pandas < 3, 4 ``sine.py``'s
  process-wide anomaly detection, 5 Ray next to RecBole, 13 a missing RecBole named in
  one line;
- ``trainer`` (trainer and checkpoints): 2 checkpoints read by the restricted loader and
  written whole, 10 the collector's item counts, 11 ``torch.amp``'s ``GradScaler``,
  21 FEARec's frequency attention in float32 under mixed precision;
- ``data`` (data and downloads): 8 no pickled dataset or dataloader cache, 9 no download
  of a missing dataset for a plugin run, 19 real times in float64;
- ``logs`` (logging and TensorBoard): 6 ``ensure_dir`` without a race, 7 one log per
  run, 17 TensorBoard writers opened late and closed;
- ``distributed``: 14 a ``gloo`` group without CUDA, 15 DDP of a CPU model, 16 one
  process writes TensorBoard events;
- ``settings``: 18 setting values read as literals, never ``eval()``-ed;
- ``import_hooks``: 12 each fix installed when its RecBole module is first imported;
- ``site_hook``: 20 the fixes for a program that imports RecBole without the plugin.

The fixes that call the plugin's upper layers (the checkpoint loader, the model
restorer, the data guard) find them in ``plugin_parts``, where the package's entry
registers them; no module here imports those layers.

``apply()`` is idempotent and runs when ``recbole_freq`` is imported, after
``require_recbole()``.  It imports no RecBole module: each fix is installed by
``when_imported`` on the module it repairs, right after that module's first import (or
at once for a module a program imported before the plugin), so that importing the
plugin, and ``--help``, load neither torch nor RecBole (applying the fixes by importing
their modules took 2 s of every start-up, scikit-learn included, and ``--help`` up to
8 s).  Tests: ``test_cli.test_help_answers_without_loading_torch_or_recbole``,
``test_importing_the_plugin_is_light_and_its_names_load_on_use``,
``test_recbole_modules_imported_before_the_plugin_are_patched_at_its_import``.
"""

from __future__ import annotations

from recbole_freq.compat import data, distributed, logs, numeric_stack, settings, trainer
from recbole_freq.compat.numeric_stack import require_recbole
from recbole_freq.compat.plugin_parts import register

__all__ = ["apply", "register", "require_recbole"]

_applied = False


def apply() -> None:
    """Install every fix once; safe to call repeatedly."""
    global _applied
    if _applied:
        return
    # In this order: fixes of one RecBole module run in the order they are installed,
    # and some wrap what an earlier one put in place (fix 17's writer around fix 16's).
    numeric_stack.restore_numpy_aliases()
    numeric_stack.require_pandas_below_3()
    numeric_stack.silence_pandas_chained_assignment_notice()
    trainer.patch_recbole_checkpoint_loading()
    numeric_stack.contain_sine_anomaly_detection()
    logs.make_ensure_dir_race_free()
    logs.give_each_run_its_own_log()
    data.never_read_pickled_caches()
    data.never_download_datasets()
    trainer.collector_moves_only_tensors()
    trainer.grad_scaler_of_torch_amp()
    distributed.data_parallel_without_cuda()
    logs.open_tensorboard_late_and_close_it_after_fit()
    trainer.guard_recboles_quick_start()
    settings.read_settings_as_literals()
    data.keep_real_times_in_float64()
    trainer.fearec_attention_in_float32()
    _applied = True
