"""CUDA paths (marker ``gpu``; skipped without a CUDA device, so never in CI): every model
trains an epoch on the GPU with and without mixed precision, and the fused attention's CUDA
branches compute the explicit attention, the overlapped loader and the captured (CUDA
graph) step give the plain step's numbers.  ``benchmarks/gpu_suite.sh`` runs this module
and the speed benchmarks in one command."""

import math

import pytest
import torch

from conftest import without_transformer_settings
from recbole_freq.model import MODELS
from recbole_freq.model.layers import (
    SoftmaxAttention,
    attention_probabilities,
    build_attention_mask,
)
from recbole_freq.quick_start.quick_start import run

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
BASELINES = ["SASRec", "BERT4Rec", "GRU4Rec"]  # RecBole's; FEARec is in MODELS


@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "amp"])
@pytest.mark.parametrize("model", sorted(MODELS) + BASELINES)
def test_every_model_trains_an_epoch_on_cuda(small_config, model, amp):
    settings = dict(small_config, epochs=1, device="cuda", enable_amp=amp)
    if model == "GRU4Rec":
        settings = without_transformer_settings(settings)
    if model == "FEARec":
        # Its time delays need L >= 36 at topk_factor 10 (under AMP its frequency
        # attention computes in float32, whatever the length).
        settings["MAX_ITEM_LIST_LENGTH"] = 50
    summary = run(model, "tiny", config_dict=settings)
    assert summary["device"].startswith("cuda")
    assert all(math.isfinite(epoch["train_loss"]) for epoch in summary["history"])
    assert all(0 <= value <= 1 for value in summary["test_result"].values())


def attention_inputs(device):
    torch.manual_seed(2)
    q, k, v = (torch.randn(3, 2, 9, 8, device=device, requires_grad=True) for _ in range(3))
    item_seq = torch.tensor(
        [[4, 5, 6, 0, 0, 0, 0, 0, 0], [1] * 9, [3, 3, 0, 0, 0, 0, 0, 0, 0]], device=device
    )
    return q, k, v, build_attention_mask(item_seq)


def test_cuda_fused_training_branch_computes_the_explicit_attention():
    # In training mode on CUDA the operator always takes the fused kernel; with dropout 0
    # its values and gradients must be those of the explicit softmax attention.
    q, k, v, mask = attention_inputs("cuda")
    operator = SoftmaxAttention(0.0).train()
    fused = operator(q, k, v, mask)
    fused_grads = torch.autograd.grad(fused.square().sum(), (q, k, v))
    explicit = attention_probabilities(q, k, mask) @ v
    explicit_grads = torch.autograd.grad(explicit.square().sum(), (q, k, v))
    torch.testing.assert_close(fused, explicit, atol=1e-4, rtol=1e-4)
    for got, want in zip(fused_grads, explicit_grads):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_cuda_in_kernel_dropout_keeps_the_expected_output():
    # The fused kernel's dropout rescales kept probabilities by 1 / (1 - p): averaged
    # over many draws the output is the explicit attention's.
    q, k, v, mask = attention_inputs("cuda")
    operator = SoftmaxAttention(0.3).train()
    with torch.no_grad():
        mean = torch.stack([operator(q, k, v, mask) for _ in range(4000)]).mean(0)
        explicit = attention_probabilities(q, k, mask) @ v
    torch.testing.assert_close(mean, explicit, atol=0.05, rtol=0.05)


def test_cuda_and_cpu_inference_agree():
    q, k, v, mask = attention_inputs("cpu")
    operator = SoftmaxAttention(0.5).eval()
    on_cpu = operator(q, k, v, mask)
    on_cuda = operator(*(t.cuda() for t in (q, k, v, mask)))
    torch.testing.assert_close(on_cuda.cpu(), on_cpu, atol=1e-4, rtol=1e-4)


def test_deterministic_cuda_training_repeats_bit_for_bit(small_config):
    """``deterministic: True`` on CUDA: two runs with one seed give the same losses and
    metrics to the last bit (the fused attention's CUDA backward adds in a varying order,
    so training computes the attention explicitly there)."""
    settings = dict(small_config, epochs=2, device="cuda", deterministic=True)
    first, second = (run("BSARec", "tiny", config_dict=settings) for _ in range(2))
    assert [e["train_loss"] for e in first["history"]] == [
        e["train_loss"] for e in second["history"]
    ]
    assert first["test_result"] == second["test_result"]
    assert first["weights_sha256"] == second["weights_sha256"]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
@pytest.mark.parametrize("model", ["BSARec", "RecDenoiser"])
def test_two_gpus_train_data_parallel_and_evaluate_as_one(small_config, model):
    """--nproc 2 on two GPUs (nccl): the test metrics equal those of evaluating the
    checkpoint in one process (``tests/test_distributed.py`` runs the same on the CPU)."""
    from recbole_freq.jobs.evaluate import evaluate_checkpoint

    settings = dict(small_config, epochs=1, nproc=2, gpu_id="0,1")
    summary = run(model, "tiny", config_dict=settings)
    assert summary["processes"] == 2 and summary["device"] == "cuda:0"
    (one,) = evaluate_checkpoint(
        summary["checkpoint"], [summary["protocol"]["protocol"]], device="cuda"
    )
    assert one["test_result"] == summary["test_result"]


@pytest.mark.parametrize("model", ["SASRec", "BSARec", "DuoRec"])
def test_overlapped_loader_on_cuda_gives_the_same_run(small_config, model):
    """``overlap_loader`` on CUDA (pinned batches copied on a side stream): the run of
    the plain step, bit for bit under ``deterministic``."""
    settings = dict(small_config, epochs=2, device="cuda", deterministic=True)
    plain = run(model, "tiny", config_dict=dict(settings, overlap_loader=False))
    overlapped = run(model, "tiny", config_dict=dict(settings, overlap_loader=True))
    assert [e["train_loss"] for e in overlapped["history"]] == [
        e["train_loss"] for e in plain["history"]
    ]
    assert overlapped["test_result"] == plain["test_result"]
    assert overlapped["weights_sha256"] == plain["weights_sha256"]


@pytest.mark.parametrize("model", ["SASRec", "BSARec", "PolyRec"])
def test_cuda_graph_step_gives_the_eager_numbers(small_config, model):
    """``compile_step`` on CUDA (inductor, mode reduce-overhead: CUDA graphs) against the
    eager step, without what draws random numbers in the step (inductor draws its own):
    dropout, and PolyRec's same-target positives (its contrastive term off; a lease found
    them drawn apart, 0.5% in the loss); equal to float rounding then; the last partial
    batch of each pass runs eagerly."""
    torch._dynamo.reset()
    settings = dict(
        small_config, epochs=2, device="cuda", hidden_dropout_prob=0.0, attn_dropout_prob=0.0
    )
    if model == "PolyRec":
        settings["cl_weight"] = 0.0
    eager = run(model, "tiny", config_dict=dict(settings, compile_step=False))
    captured = run(
        model, "tiny", config_dict=dict(settings, compile_step=True, overlap_loader=True)
    )
    for a, b in zip(eager["history"], captured["history"], strict=True):
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-4)
        assert b["valid_score"] == pytest.approx(a["valid_score"], abs=1e-3)
    assert captured["test_result"] == pytest.approx(eager["test_result"], abs=1e-3)


@pytest.mark.parametrize("model", ["SASRec", "BSARec"])
def test_the_epoch_without_waits_is_recboles_epoch_on_cuda(small_config, monkeypatch, model):
    """``fast_step.train_pass`` (no per-step read of the loss) on CUDA: RecBole's own
    loop's run, bit for bit under ``deterministic``."""
    from recbole.trainer import Trainer

    from recbole_freq.protocol import trainer as trainer_module

    settings = dict(small_config, epochs=2, device="cuda", deterministic=True)
    ours = run(model, "tiny", config_dict=settings)

    def recboles(trainer, *args):
        return Trainer._train_epoch(trainer, *args)

    monkeypatch.setattr(trainer_module, "train_pass", recboles)
    theirs = run(model, "tiny", config_dict=settings)
    assert [e["train_loss"] for e in ours["history"]] == [
        e["train_loss"] for e in theirs["history"]
    ]
    assert ours["weights_sha256"] == theirs["weights_sha256"]
