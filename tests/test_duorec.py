"""DuoRec (``recbole_freq.model.DuoRec``): its NT-Xent against the authors' formulation,
without contrast it is RecBole's SASRec on shared weights, its loss terms, its settings
and its training through the real pipeline."""

import pytest
import torch
import torch.nn.functional as F
from recbole.model.sequential_recommender import SASRec

from conftest import assert_same_as_recbole, first_batch, prepare
from recbole_freq.cli import main
from recbole_freq.model import BASELINES, DuoRec
from recbole_freq.model.contrastive import nt_xent
from recbole_freq.protocol import ProtocolError
from recbole_freq.quick_start.quick_start import run

NO_DROPOUT = {"hidden_dropout_prob": 0.0, "attn_dropout_prob": 0.0}


def authors_info_nce(z_i, z_j, temperature, similarity):
    """The DuoRec / BSARec authors' ``info_nce`` + ``CrossEntropyLoss``, written out: the
    positive's logit first, then the 2N - 2 others, label 0."""
    n = z_i.size(0)
    z = torch.cat([z_i, z_j])
    if similarity == "cos":
        sim = F.cosine_similarity(z.unsqueeze(1), z.unsqueeze(0), dim=2) / temperature
    else:
        sim = z @ z.t() / temperature
    positives = torch.cat([torch.diag(sim, n), torch.diag(sim, -n)]).reshape(2 * n, 1)
    mask = torch.ones(2 * n, 2 * n, dtype=torch.bool).fill_diagonal_(False)
    for i in range(n):
        mask[i, n + i] = mask[n + i, i] = False
    negatives = sim[mask].reshape(2 * n, -1)
    logits = torch.cat([positives, negatives], dim=1)
    return F.cross_entropy(logits, torch.zeros(2 * n, dtype=torch.long))


@pytest.mark.parametrize("similarity, temperature", [("dot", 1.0), ("dot", 0.5), ("cos", 0.2)])
def test_nt_xent_is_the_authors_info_nce(similarity, temperature):
    torch.manual_seed(0)
    first, second = torch.randn(6, 8, dtype=torch.float64), torch.randn(6, 8, dtype=torch.float64)
    ours = nt_xent(first, second, temperature, similarity)
    assert ours.item() == pytest.approx(
        authors_info_nce(first, second, temperature, similarity).item(), rel=1e-12
    )


@pytest.mark.parametrize("similarity", ["dot", "cos"])
def test_nt_xent_gradients(similarity):
    torch.manual_seed(1)
    first = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    second = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: nt_xent(a, b, 0.7, similarity), (first, second))


def test_without_contrast_duorec_is_recboles_sasrec(small_config):
    """``contrast: ~`` leaves SASRec: same scores, metrics, loss and gradients as RecBole's
    SASRec given the same weights."""
    config, train, _, test = prepare("DuoRec", dict(small_config, contrast=None, **NO_DROPOUT))
    model = DuoRec(config, train._dataset)
    assert model.auxiliary_losses() == [] and model.positive_sampler is None
    assert_same_as_recbole(model, SASRec(config, train._dataset), config, train, test)


def loss_terms(model, batch, seed):
    """CE of the sequence and, with the same draw of same-target positives as the model,
    the outputs of the sequence and of its positives (eval mode: no dropout)."""
    item_seq, lengths = batch[model.ITEM_SEQ], batch[model.ITEM_SEQ_LEN]
    targets = batch[model.POS_ITEM_ID]
    output = model.forward(item_seq, lengths)
    cross_entropy = F.cross_entropy(output @ model.item_embedding.weight.t(), targets)
    if model.positive_sampler is None:
        return cross_entropy, output, None
    torch.manual_seed(seed)
    positive_seq, positive_len, _ = model.positive_sampler.positives(item_seq, lengths, targets)
    return cross_entropy, output, model.forward(positive_seq, positive_len)


@pytest.mark.parametrize("contrast", ["us_x", "us", "un", "su"])
def test_each_contrast_adds_its_terms(small_config, contrast):
    overrides = dict(small_config, contrast=contrast, lmd=0.3, lmd_sem=0.2, tau=0.5)
    config, train, _, _ = prepare("DuoRec", overrides)
    model = DuoRec(config, train._dataset)
    model.eval()  # the dropout view is then the sequence's own output
    batch = first_batch(train)
    with torch.no_grad():
        torch.manual_seed(3)
        loss = model.calculate_loss(batch).item()
        cross_entropy, output, positive = loss_terms(model, batch, seed=3)
        unsupervised = 0.3 * nt_xent(output, output, 0.5).item()
        supervised = 0.2 * nt_xent(output, positive, 0.5).item() if contrast != "un" else 0
    expected = (
        cross_entropy.item()
        + {
            "us_x": supervised,
            "us": unsupervised + supervised,
            "un": unsupervised,
            "su": supervised,
        }[contrast]
    )
    assert loss == pytest.approx(expected, rel=1e-5)


def test_duorec_trains_and_evaluates_and_is_a_baseline(small_config):
    summary = run("DuoRec", "tiny", cmd_overrides=dict(small_config, epochs=1), saved=False)
    assert summary["epochs_run"] == 1 and summary["config"]["contrast"] == "us_x"
    assert summary["history"][0]["train_loss"] > 0
    assert "DuoRec" in BASELINES


@pytest.mark.parametrize(
    "setting, message",
    [
        ("--contrast=xx", "contrast='xx' is unknown; choose from ['su', 'un', 'us', 'us_x']"),
        ("--tau=0", "tau=0 must be a number > 0"),
        ("--sim=l2", "sim='l2' is unknown; choose from ['dot', 'cos']"),
        ("--lmd_sem=-1", "lmd_sem=-1 must be a number >= 0"),
    ],
)
def test_bad_settings_are_one_line(small_config, capsys, setting, message):
    args = [f"--{key}={value}" for key, value in small_config.items()]
    assert main(["--model=DuoRec", "--dataset=tiny", *args, setting]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err, err


def test_a_protocol_loss_that_would_drop_the_contrast_is_refused(small_config):
    overrides = dict(small_config, epochs=1, train_loss="bce")
    with pytest.raises(ProtocolError, match="leaves out DuoRec's contrastive term"):
        run("DuoRec", "tiny", cmd_overrides=overrides, saved=False)
    summary = run("DuoRec", "tiny", cmd_overrides=dict(overrides, contrast=None), saved=False)
    assert summary["protocol"]["train_loss"] == "bce"
