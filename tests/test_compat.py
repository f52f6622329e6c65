"""The compatibility module: RecBole 1.2.1 behaves on our stack as on its own."""

import subprocess
import sys

import numpy as np
import pytest
import recbole.trainer.trainer as trainer_module
import torch
from recbole.data import create_dataset
from recbole.evaluator.metrics import NDCG, Hit

from conftest import prepare, without_transformer_settings
from recbole_freq.checkpoint.schema import UntrustedCheckpointError
from recbole_freq.compat import numeric_stack
from recbole_freq.config.configurator import FreqConfig
from recbole_freq.data.guard import DatasetNotPreparedError


class NotAllowlisted:
    pass


def test_numpy_aliases_name_the_old_types():
    assert np.float_ is np.float64 and np.complex_ is np.complex128 and np.unicode_ is np.str_
    assert np.dtype(np.float) == np.float64 and np.dtype(np.int) == np.int64


def test_recbole_metrics_give_textbook_values():
    # One user, hit at rank 2 of top-3: HR@3 = 1, NDCG@3 = 1 / log2(3).
    pos_index = np.array([[False, True, False]])
    pos_len = np.array([1])
    config = {"topk": [3], "metric_decimal_place": 6}
    assert Hit(config).metric_info(pos_index)[0, 2] == 1.0
    assert NDCG(config).metric_info(pos_index, pos_len)[0, 2] == pytest.approx(1 / np.log2(3))


def test_recboles_trainer_unpickles_no_checkpoint(tmp_path):
    # Fix 2: every torch.load of RecBole's trainer goes through the restricted loader.
    path = tmp_path / "any.pth"
    torch.save({"config": NotAllowlisted(), "state_dict": {}}, path)
    with pytest.raises(UntrustedCheckpointError, match="test_compat.NotAllowlisted"):
        trainer_module.torch.load(str(path))


def test_recboles_own_trainer_tests_on_its_saved_checkpoint(small_config):
    # Fix 2: RecBole's own Trainer (not the plugin's) saves its best checkpoint in the
    # plain form and reads it back through the restricted loader for the test, which
    # torch >= 2.6's weights-only default broke; the numbers are those of the weights saved.
    from recbole.trainer import Trainer
    from recbole.utils import get_model

    config, train, valid, test = prepare("SASRec", dict(small_config, epochs=1))
    model = get_model("SASRec")(config, train._dataset)
    trainer = Trainer(config, model)
    trainer.fit(train, valid, saved=True, show_progress=False)
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(1.0)  # what the test must not see
    reloaded = trainer.evaluate(test, load_best_model=True, show_progress=False)
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items())
    assert "ndcg@10" in reloaded


def test_recboles_trainer_saves_atomically(tmp_path, monkeypatch):
    # Fix 2: a save that fails half-way leaves the previous file as it was.
    from recbole_freq.utils import files

    path = tmp_path / "model.pth"
    trainer_module.torch.save({"w": torch.ones(3)}, str(path))
    before = path.read_bytes()

    def fail_half_way(handle):
        handle.write(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files, "_write_content", lambda handle, content: fail_half_way(handle))
    with pytest.raises(files.OutputWriteError, match="No space left on device"):
        trainer_module.torch.save({"w": torch.zeros(3)}, str(path))
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["model.pth"]


def test_pandas_3_is_refused_with_the_fix(monkeypatch):
    """Read from the installed metadata, so that the check imports no pandas."""
    import importlib.metadata

    real_version = importlib.metadata.version
    monkeypatch.setattr(
        importlib.metadata,
        "version",
        lambda name: "3.1.0" if name == "pandas" else real_version(name),
    )
    with pytest.raises(ImportError, match=r"pandas < 3 \(found 3.1.0\)"):
        numeric_stack.require_pandas_below_3()


def test_recbole_never_downloads_a_missing_dataset(tmp_path):
    config = FreqConfig("SASRec", "yelp", cmd_overrides={"data_path": str(tmp_path)})
    with pytest.raises(DatasetNotPreparedError, match="python -m dataset_prep yelp"):
        create_dataset(config)
    assert list(tmp_path.iterdir()) == []  # nothing created, nothing downloaded


def test_loading_a_dataset_shows_no_pandas_chained_assignment_noise(tiny_data):
    # A fresh interpreter: pytest's own warning filters (setup.cfg) would hide the noise.
    code = (
        "import recbole_freq, pandas as pd\n"
        "from recbole.data import create_dataset\n"
        "from recbole_freq.config.configurator import FreqConfig\n"
        f"create_dataset(FreqConfig('SASRec', 'tiny', cmd_overrides={{'data_path': {str(tiny_data)!r}}}))\n"
        "frame = pd.DataFrame({'a': [1.0, None]})\n"
        "frame['a'].fillna(0, inplace=True)  # outside RecBole: still warned\n"
    )
    result = subprocess.run(
        [sys.executable, "-W", "default", "-c", code], capture_output=True, text=True, check=True
    )
    noise = [line for line in result.stderr.splitlines() if "chained assignment" in line]
    assert len(noise) == 1 and noise[0].startswith("<string>:")


def test_importing_recbole_freq_restores_everything_in_a_fresh_process():
    code = "import recbole_freq, numpy as np; from recbole.config import Config; print(np.float_)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "float64" in result.stdout


def test_recbole_builtins_leave_autograd_anomaly_detection_off():
    # RecBole's sine.py switches it on at import; it slows every backward pass.
    code = (
        "import torch, recbole_freq; from recbole_freq.config.configurator import get_model_class;"
        "get_model_class('SASRec'); from recbole.model.sequential_recommender import sine;"
        "print(torch.is_anomaly_enabled())"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_recbole_ensure_dir_tolerates_a_folder_created_meanwhile(tmp_path, monkeypatch):
    import recbole.utils.logger
    import recbole.utils.utils

    folder = tmp_path / "log" / "SASRec"
    folder.mkdir(parents=True)
    # Another process created the folder between RecBole's existence check and makedirs.
    monkeypatch.setattr("os.path.exists", lambda path: False)
    for ensure_dir in (recbole.utils.utils.ensure_dir, recbole.utils.logger.ensure_dir):
        ensure_dir(str(folder))
    assert folder.is_dir()


def open_writers() -> set:
    """The TensorBoard writer threads alive in this process."""
    import threading

    from tensorboard.summary.writer.event_file_writer import _AsyncWriterThread

    return {t for t in threading.enumerate() if isinstance(t, _AsyncWriterThread)}


def test_a_run_leaves_its_tensorboard_scalars_on_disk_and_no_writer_open(small_config, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from recbole_freq.quick_start.quick_start import run

    before = open_writers()
    summary = run("SASRec", "tiny", cmd_overrides=dict(small_config, epochs=2), saved=False)
    (folder,) = (tmp_path / "log_tensorboard").iterdir()
    events = EventAccumulator(str(folder))
    events.Reload()
    losses = events.Scalars("Loss/Train")
    assert [e.step for e in losses] == [0, 1]
    recorded = [epoch["train_loss"] for epoch in summary["history"]]
    assert [e.value for e in losses] == pytest.approx(recorded, rel=1e-6)
    assert [e.step for e in events.Scalars("Vaild_score")] == [0, 1]  # RecBole's spelling
    assert open_writers() <= before


def test_an_evaluation_opens_no_tensorboard_writer(small_config, tmp_path):
    import copy

    from recbole_freq.protocol import trainer_for
    from recbole_freq.quick_start.quick_start import new_model

    before = open_writers()
    config, train, _, test = prepare("SASRec", small_config)
    trainer = trainer_for(config, new_model(config, train))
    assert "ndcg@10" in trainer.evaluate(test, load_best_model=False, show_progress=False)
    copy.deepcopy(trainer.tensorboard)
    assert not (tmp_path / "log_tensorboard").exists()
    assert open_writers() <= before


def test_each_run_in_one_process_writes_its_own_log(small_config, tmp_path):
    import logging

    from recbole_freq.quick_start.quick_start import run

    root = logging.getLogger()
    others = [h for h in root.handlers if not hasattr(h, "_recbole_freq_run_handler")]
    for model in ("SASRec", "GRU4Rec"):
        config = dict(small_config, epochs=1, state="INFO")
        if model == "GRU4Rec":
            config = without_transformer_settings(config)
        run(model, "tiny", config_dict=config)
    logs = {
        model: list((tmp_path / "log" / model).glob("*.log")) for model in ("SASRec", "GRU4Rec")
    }
    assert [len(files) for files in logs.values()] == [1, 1]
    sasrec, gru4rec = (files[0].read_text() for files in logs.values())
    assert "SASRec(" in sasrec and "GRU4Rec(" not in sasrec
    assert "GRU4Rec(" in gru4rec and "valid result" in gru4rec
    # One stream and one file handler of the latest run, plus whatever pytest installed.
    run_handlers = [h for h in root.handlers if hasattr(h, "_recbole_freq_run_handler")]
    assert sorted(type(h).__name__ for h in run_handlers) == ["FileHandler", "StreamHandler"]
    assert all(h in root.handlers for h in others)
