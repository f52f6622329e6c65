"""Shared fixtures: small real datasets and configurations for the real RecBole pipeline."""

import math
import os
import random
import sys
from pathlib import Path

import numpy as np
import pytest

import recbole_freq  # noqa: F401  (applies the compatibility fixes first)
from dataset_prep import convert_one_line

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data" / "s3rec"

# Small, fast settings: the pipeline is real, only the sizes shrink.
SMALL_MODEL = {
    "hidden_size": 16,
    "inner_size": 32,
    "n_heads": 2,
    "n_layers": 2,
    "MAX_ITEM_LIST_LENGTH": 12,
    "train_batch_size": 64,
    "eval_batch_size": 256,
    "epochs": 2,
    "show_progress": False,
    "state": "WARNING",
    "seed": 7,
}


def write_sequences(path: Path, n_users=60, n_items=40, seed=0, min_len=5, max_len=16):
    """One-line-per-user file with random sequences (ids from 1, as in the papers' files)."""
    rng = random.Random(seed)
    lines = []
    for user in range(1, n_users + 1):
        length = rng.randint(min_len, max_len)
        # Users drift through the catalogue so sequences carry some order signal.
        start = rng.randint(1, n_items)
        items = [((start + step + rng.randint(0, 2) - 1) % n_items) + 1 for step in range(length)]
        lines.append(" ".join(str(v) for v in [user, *items]))
    path.write_text("\n".join(lines) + "\n")
    return path


def permuted_items(source: Path, target: Path, seed: int = 7) -> Path:
    """The same users and histories with the items renamed by a permutation: data of the
    same shape that a model's weights fit without an error."""
    import random

    lines = [line.split() for line in source.read_text().splitlines()]
    items = sorted({item for line in lines for item in line[1:]}, key=int)
    renamed = dict(zip(items, random.Random(seed).sample(items, len(items))))
    target.write_text(
        "".join(" ".join([line[0], *(renamed[i] for i in line[1:])]) + "\n" for line in lines)
    )
    return target


# The first line of a subprocess that must run as in an environment without the site
# hook of compat fix 20 (scripts/dev installs it into .venv).
WITHOUT_SITE_HOOK = (
    "import sys; sys.meta_path[:] = "
    "[f for f in sys.meta_path if type(f).__name__ != 'RecBoleFreqFixes']\n"
)


def prepare(model, overrides, dataset="tiny"):
    """``(config, train, valid, test)`` of ``model`` on a prepared dataset through the real
    pipeline (``quick_start.load_splits``), the global RNG then seeded as for a model
    build; the one helper every test that builds a model itself uses."""
    from recbole.utils import init_seed

    from recbole_freq.config.configurator import FreqConfig
    from recbole_freq.quick_start.quick_start import load_splits

    config = FreqConfig(model, dataset, cmd_overrides=overrides)
    _, (train, valid, test) = load_splits(config)
    init_seed(config["seed"], config["reproducibility"])
    return config, train, valid, test


def authors_left_padded(item_seq, item_seq_len):
    """The BSARec authors' input rows (``src/dataset.py``, ``RecDataset.__getitem__``):
    ``[0] * pad_len + input_ids``, written out row by row from RecBole's right-padded
    rows."""
    import torch

    n = item_seq.size(1)
    rows = []
    for row, length in zip(item_seq.tolist(), item_seq_len.tolist()):
        items = [item for item in row[:length] if item != 0]
        rows.append([0] * (n - len(items)) + items)
    return torch.tensor(rows, dtype=item_seq.dtype)


def as_float64(tensor):
    """A tensor's values as a float64 numpy array, for the oracles written in numpy."""
    return tensor.detach().double().numpy()


def oracle_layer_norm(x, weight, bias, eps):
    """The BSARec authors' TF-style LayerNorm (epsilon inside the square root), in numpy."""
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * weight + bias


def oracle_gelu(x):
    """The authors' erf GELU, in numpy."""
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def oracle_feed_forward(x, feed_forward, eps):
    """The authors' ``FeedForward`` (dense, GELU, dense, residual, LayerNorm) of one row
    ``x`` (n, d), with the weights of the plugin's ``layers.FeedForward``."""
    inner = oracle_gelu(
        x @ as_float64(feed_forward.dense_in.weight).T + as_float64(feed_forward.dense_in.bias)
    )
    out = inner @ as_float64(feed_forward.dense_out.weight).T
    out = out + as_float64(feed_forward.dense_out.bias)
    norm = feed_forward.residual.layer_norm
    return oracle_layer_norm(x + out, as_float64(norm.weight), as_float64(norm.bias), eps)


def rows_of_every_length(n_items, n, seed=3):
    """``(item_seq, lengths)``: RecBole's right-padded rows of every length 0 .. n."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    lengths = torch.arange(n + 1)
    items = torch.randint(1, n_items, (n + 1, n), generator=generator)
    item_seq = torch.where(torch.arange(n)[None, :] < lengths[:, None], items, 0)
    return item_seq, lengths


def left_and_right_models(model_class, settings, prepare_weights):
    """``(config, left, right)``: ``model_class`` built under the authors' left layout, its
    weights changed by ``prepare_weights``, and the same weights under RecBole's right
    layout, both in eval mode."""
    name = model_class.__name__
    config, train, _, _ = prepare(name, dict(settings, sequence_layout="left"))
    left = model_class(config, train._dataset).eval()
    prepare_weights(left)
    right_config, right_train, _, _ = prepare(name, dict(settings, sequence_layout="right"))
    right = model_class(right_config, right_train._dataset).eval()
    right.load_state_dict(left.state_dict())
    return config, left, right


def first_batch(loader):
    """The first training interaction of ``loader`` (evaluation loaders yield tuples)."""
    for batch in loader:
        return batch[0] if isinstance(batch, tuple) else batch


# Settings of SMALL_MODEL that RNN baselines do not read (and so refuse).
TRANSFORMER_ONLY = ("inner_size", "n_heads", "n_layers")


def small_overrides(root, tmp_path, **extra) -> dict:
    """One short epoch on the small paper-named data in ``root`` (datasets named as the
    papers' so that their paper files apply), files under ``tmp_path``."""
    return dict(
        data_path=str(root),
        checkpoint_dir=str(tmp_path / "saved"),
        show_progress=False,
        state="WARNING",
        epochs=1,
        MAX_ITEM_LIST_LENGTH=10,
        **extra,
    )


def without_transformer_settings(config: dict) -> dict:
    """``config`` for a model without Transformer layers (GRU4Rec, STAMP ...)."""
    return {key: value for key, value in config.items() if key not in TRANSFORMER_ONLY}


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory):
    """Data folder holding the prepared datasets ``tiny`` (60 users, 40 items) and
    ``wide`` (60 users, 150 items: enough for 100 sampled negatives per target)."""
    root = tmp_path_factory.mktemp("data")
    raw = write_sequences(root / "tiny.txt")
    convert_one_line(raw, root, "tiny", show_progress=False)
    wide = write_sequences(root / "wide.txt", n_items=150, seed=1, min_len=8, max_len=20)
    convert_one_line(wide, root, "wide", show_progress=False)
    return root


@pytest.fixture
def small_config(tiny_data, tmp_path):
    """Overrides for a fast real run on ``tiny``, writing into ``tmp_path``."""
    return dict(
        SMALL_MODEL,
        data_path=str(tiny_data),
        checkpoint_dir=str(tmp_path / "saved"),
        log_wandb=False,
    )


@pytest.fixture(scope="session", autouse=True)
def _session_cwd(tmp_path_factory):
    # Module-scoped fixtures run before each test's own folder is entered: without this
    # their runs left log/ and log_tensorboard/ files in the checkout.
    before = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("session-cwd"))
    yield
    os.chdir(before)


@pytest.fixture(autouse=True)
def _isolated_cwd(tmp_path, monkeypatch):
    # RecBole writes log/ and log_tensorboard/ into the working directory.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["pytest"])


# How RecBole names a Transformer layer's parts: SASRec / BERT4Rec, and FEARec
RECBOLE_SASREC_NAMES = ("trm_encoder.layer", "multi_head_attention", ("query", "key", "value"))
RECBOLE_FEAREC_NAMES = (
    "item_encoder.layer",
    "hybrid_attention",
    ("query_layer", "key_layer", "value_layer"),
)


def recbole_state(model, reference, names=RECBOLE_SASREC_NAMES):
    """Load ``model``'s weights into RecBole's SASRec / BERT4Rec / FEARec ``reference``
    (``names``: how it names its layers); returns, per RecBole parameter name, ``(our
    parameter, rows)`` (rows of the fused QKV)."""
    layers, attention_name, projections = names
    pairs = {
        "item_embedding": model.embedding.item_embedding,
        "position_embedding": model.embedding.position_embedding,
        "LayerNorm": model.embedding.layer_norm,
    }
    shared = {}
    for i, block in enumerate(model.encoder.blocks):
        attention, ffn = block.mixer.attention, block.feed_forward
        prefix = f"{layers}.{i}."
        size = attention.qkv.weight.size(0) // 3
        for part, name in enumerate(projections):
            for kind in ("weight", "bias"):
                rows = slice(part * size, (part + 1) * size)
                shared[f"{prefix}{attention_name}.{name}.{kind}"] = (
                    getattr(attention.qkv, kind),
                    rows,
                )
        pairs.update(
            {
                f"{prefix}{attention_name}.dense": attention.dense,
                f"{prefix}{attention_name}.LayerNorm": attention.residual.layer_norm,
                f"{prefix}feed_forward.dense_1": ffn.dense_in,
                f"{prefix}feed_forward.dense_2": ffn.dense_out,
                f"{prefix}feed_forward.LayerNorm": ffn.residual.layer_norm,
            }
        )
    if hasattr(model, "output_ffn"):  # BERT4RecDenoiser's head
        pairs.update(output_ffn=model.output_ffn, output_ln=model.output_ln)
        shared["output_bias"] = (model.output_bias, slice(None))
    for name, module in pairs.items():
        for kind, parameter in module.named_parameters():
            shared[f"{name}.{kind}"] = (parameter, slice(None))
    # ours may hold input-only tokens after the catalogue (CL4SRec's [mask])
    catalogue = reference.item_embedding.weight.size(0)
    shared["item_embedding.weight"] = (shared["item_embedding.weight"][0], slice(0, catalogue))
    state = {name: parameter.detach()[rows].clone() for name, (parameter, rows) in shared.items()}
    # A module RecBole registers twice (FEARec's last block is also item_encoder.layer_ramp)
    # is one set of tensors under two names: give the second name the same weights.
    theirs = reference.state_dict(keep_vars=True)
    named = {id(tensor): name for name, tensor in theirs.items() if name in state}
    for name, tensor in theirs.items():
        if name not in state and id(tensor) in named:
            state[name] = state[named[id(tensor)]]
    reference.load_state_dict(state, strict=True)
    return shared


def assert_same_as_recbole(model, reference, config, train, test):
    """``model`` with ``reference``'s weights loaded from it (``recbole_state``) gives the
    same full-sort scores, RecBole metrics, training loss and gradients; returns the
    shared parameters (their gradients are set) for further checks."""
    import pytest
    import torch
    from recbole.trainer import Trainer

    shared = recbole_state(model, reference)
    model.eval(), reference.eval()
    batch = first_batch(test)
    torch.testing.assert_close(
        model.full_sort_predict(batch), reference.full_sort_predict(batch), atol=1e-5, rtol=1e-5
    )
    assert dict(Trainer(config, model).evaluate(test, load_best_model=False)) == dict(
        Trainer(config, reference).evaluate(test, load_best_model=False)
    )
    model.train(), reference.train()
    batch = first_batch(train)
    ours, theirs = model.calculate_loss(batch), reference.calculate_loss(batch)
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-5)
    ours.backward(), theirs.backward()
    assert_same_gradients(shared, reference)
    return shared


def assert_same_gradients(shared, reference):
    """Each shared parameter's gradient (``recbole_state``'s pairs) equals the reference's."""
    import torch

    reference_parameters = dict(reference.named_parameters())
    for name, (parameter, rows) in shared.items():
        torch.testing.assert_close(
            parameter.grad[rows], reference_parameters[name].grad, atol=1e-6, rtol=1e-4
        )


def assert_all_ones_masks_give_the_backbone(denoiser, backbone, batch):
    """``denoiser`` (a Rec-Denoiser model) with every mask kept (``sigmoid(Phi)`` = 1)
    scores ``batch`` as ``backbone`` given the same weights (its state without the
    mask parameters)."""
    import torch

    for module in denoiser.modules():
        if hasattr(module, "phi"):
            with torch.no_grad():
                module.phi.fill_(30.0)
    loaded = backbone.load_state_dict(denoiser.state_dict(), strict=False)
    assert not loaded.missing_keys and all("phi" in key for key in loaded.unexpected_keys)
    denoiser.eval(), backbone.eval()
    with torch.no_grad():
        torch.testing.assert_close(
            denoiser.full_sort_predict(batch), backbone.full_sort_predict(batch)
        )


def main_with_ctrl_c_once(argv, when, sig=None) -> int:
    """``recbole_freq.cli.main(argv)`` with Ctrl-C (SIGINT to this process, or ``sig``) as
    soon as ``when()`` holds."""
    import os
    import signal
    import threading
    import time

    from recbole_freq.cli import main

    search_returned = threading.Event()

    def ctrl_c_when():
        # Generous: a loaded 2-core machine needs minutes for a first trial or epoch.
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and not search_returned.is_set():
            if when():
                os.kill(os.getpid(), sig or signal.SIGINT)
                return
            time.sleep(0.05)

    watcher = threading.Thread(target=ctrl_c_when, daemon=True)
    watcher.start()
    try:
        return main(argv)
    finally:
        search_returned.set()  # never a stray SIGINT into the rest of the test session
        watcher.join()
