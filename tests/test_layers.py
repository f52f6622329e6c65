"""The encoder's pieces against the paper's definitions, explicit DFT matrices and oracles."""

import math

import pytest
import torch

from recbole_freq.model.encoder import build_encoder
from recbole_freq.model.frequency import (
    BeyondSelfAttentionMixer,
    FrequencyRescaler,
    low_pass_projector,
)
from recbole_freq.model.layers import (
    Dropout,
    FeedForward,
    MultiHeadSelfAttention,
    SelfAttentionMixer,
    SoftmaxAttention,
    StandardResidual,
    TransformerBlock,
    attention_probabilities,
    build_attention_mask,
    explicit_in_training,
)


def explicit_low_pass(x: torch.Tensor, low_bins: int) -> torch.Tensor:
    """LFC[x] of eq. 2 from the DFT matrix: keep the bases f_j whose frequency is below
    ``low_bins`` (frequency k and its mirror N - k for a real signal), then invert."""
    n = x.size(1)
    j, k = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
    dft = torch.exp(-2j * math.pi * j * k / n).to(torch.complex128) / math.sqrt(n)
    frequency = torch.minimum(torch.arange(n), n - torch.arange(n))
    keep = (frequency < low_bins).to(torch.complex128)
    projector = dft.conj().T @ torch.diag(keep) @ dft
    return torch.einsum("ij,bjd->bid", projector.real, x.to(torch.float64))


@pytest.mark.parametrize("seq_len,c", [(50, 3), (50, 9), (49, 5), (8, 1), (8, 8), (7, 6)])
def test_low_pass_equals_projection_on_lowest_fourier_bases(seq_len, c):
    torch.manual_seed(0)
    x = torch.randn(3, seq_len, 4, dtype=torch.float64)
    rescaler = FrequencyRescaler(seq_len, c, 4)
    low = torch.matmul(rescaler.low_pass.double(), x)
    # The projector is stored in float32, hence the tolerance.
    torch.testing.assert_close(low, explicit_low_pass(x, c // 2 + 1), atol=2e-5, rtol=0)
    # ... and the authors' rfft form of the same filter.
    spectrum = torch.fft.rfft(x, dim=1, norm="ortho")
    spectrum[:, c // 2 + 1 :] = 0
    torch.testing.assert_close(
        low, torch.fft.irfft(spectrum, n=seq_len, dim=1, norm="ortho"), atol=2e-5, rtol=0
    )


def test_low_plus_high_reproduces_input_and_projector_is_idempotent():
    torch.manual_seed(1)
    rescaler = FrequencyRescaler(20, 5, 6)
    with torch.no_grad():
        rescaler.sqrt_beta.fill_(1.0)  # beta = 1: LFC + HFC
    x = torch.randn(2, 20, 6)
    torch.testing.assert_close(rescaler(x), x, atol=1e-5, rtol=0)
    projector = low_pass_projector(20, 3)
    torch.testing.assert_close(projector @ projector, projector, atol=1e-6, rtol=0)


def test_constant_sequence_has_no_high_frequency_part():
    rescaler = FrequencyRescaler(50, 1, 8)  # c=1 keeps only the frequency-0 bin
    x = torch.ones(2, 50, 8) * torch.randn(1, 1, 8)
    low = torch.matmul(rescaler.low_pass, x)
    torch.testing.assert_close(low, x, atol=1e-5, rtol=0)
    torch.testing.assert_close(rescaler(x), x, atol=1e-5, rtol=0)  # beta * 0 whatever beta is


def test_gradients_reach_beta_which_stays_non_negative():
    rescaler = FrequencyRescaler(10, 3, 4, beta_type="vector")
    rescaler(torch.randn(2, 10, 4)).pow(2).sum().backward()
    assert rescaler.sqrt_beta.grad is not None and rescaler.sqrt_beta.grad.abs().sum() > 0
    assert (rescaler.beta >= 0).all() and rescaler.beta.shape == (4,)
    assert FrequencyRescaler(10, 3, 4, beta_type="scalar").beta.shape == (1,)


@pytest.mark.parametrize("c", [0, -1, 52, 100])
def test_c_out_of_range_is_rejected_with_the_fix(c):
    with pytest.raises(ValueError, match=r"c=.*choose 1 <= c <= 51"):
        FrequencyRescaler(50, c, 8)
    FrequencyRescaler(50, 51, 8)  # keeps all 26 bins: HFC is empty but well defined


def test_training_attention_leaves_the_fused_kernel_where_it_would_change_results():
    """CPU training with dropout (slow fused dropout) and CUDA training under
    deterministic algorithms (the fused backward adds in a varying order there) compute
    the attention explicitly; elsewhere the fused kernel runs."""
    cpu, cuda, meta = torch.device("cpu"), torch.device("cuda"), torch.device("meta")
    previous = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(False)
        assert [explicit_in_training(cpu, 0.5), explicit_in_training(cpu, 0.0)] == [True, False]
        assert not explicit_in_training(cuda, 0.5) and not explicit_in_training(meta, 0.5)
        torch.use_deterministic_algorithms(True, warn_only=True)
        assert explicit_in_training(cuda, 0.5) and explicit_in_training(cuda, 0.0)
        assert not explicit_in_training(cpu, 0.0) and not explicit_in_training(meta, 0.5)
    finally:
        torch.use_deterministic_algorithms(previous)


def test_fused_attention_matches_unfused_softmax_oracle():
    torch.manual_seed(2)
    q, k, v = (torch.randn(3, 2, 9, 5) for _ in range(3))
    item_seq = torch.tensor([[4, 5, 6, 0, 0, 0, 0, 0, 0], [1] * 9, [3, 3, 0, 0, 0, 0, 0, 0, 0]])
    mask = build_attention_mask(item_seq)
    additive = torch.where(mask, 0.0, -10000.0)  # RecBole's encoding of the same mask
    oracle = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(5) + additive, -1) @ v
    operator = SoftmaxAttention(0.5).eval()
    torch.testing.assert_close(operator(q, k, v, mask), oracle, atol=1e-5, rtol=1e-5)
    # The explicit path used for CPU training computes the same function.
    explicit = attention_probabilities(q, k, mask) @ v
    torch.testing.assert_close(explicit, oracle, atol=1e-5, rtol=1e-5)


def test_attention_mask_is_causal_and_hides_padding():
    mask = build_attention_mask(torch.tensor([[7, 8, 0]]))[0, 0]
    expected = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 0]], dtype=torch.bool)
    assert torch.equal(mask, expected)
    assert torch.equal(
        build_attention_mask(torch.tensor([[7, 0]]), bidirectional=True)[0, 0, 0],
        torch.tensor([True, False]),
    )


def test_dropout_keeps_expectation_and_rate():
    torch.manual_seed(3)
    dropout = Dropout(0.3).train()
    out = dropout(torch.ones(200_000))
    assert abs((out == 0).float().mean().item() - 0.3) < 0.01
    assert abs(out.mean().item() - 1.0) < 0.02
    assert torch.equal(dropout.eval()(torch.ones(5)), torch.ones(5))
    with pytest.raises(ValueError):
        Dropout(1.0)


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_dropout_gives_the_bits_of_a_cast_boolean_mask(p):
    """The in-place mask gives, from the same draws, the values and gradients of
    ``x * (rand >= p).to(x.dtype) / (1 - p)``, so runs stored before it reproduce."""
    x = torch.randn(4, 50, 64, requires_grad=True)
    torch.manual_seed(11)
    ours = Dropout(p).train()(x)
    (ours_grad,) = torch.autograd.grad(ours.square().sum(), x)
    torch.manual_seed(11)
    keep = torch.rand_like(x) >= p
    cast = x * keep.to(x.dtype).mul_(1.0 / (1.0 - p))
    (cast_grad,) = torch.autograd.grad(cast.square().sum(), x)
    assert torch.equal(ours, cast) and torch.equal(ours_grad, cast_grad)


def _attention_and_ffn(hidden=8, heads=2, inner=16):
    residual = lambda: StandardResidual(hidden, 0.0, 1e-12)  # noqa: E731
    attention = MultiHeadSelfAttention(hidden, heads, SoftmaxAttention(0.0), residual())
    return attention, FeedForward(hidden, inner, "gelu", residual())


def test_alpha_zero_equals_attention_only_block_with_same_weights():
    torch.manual_seed(4)
    attention, feed_forward = _attention_and_ffn()
    rescaler = FrequencyRescaler(6, 3, 8)
    bsa = TransformerBlock(
        BeyondSelfAttentionMixer(attention, rescaler, StandardResidual(8, 0.0, 1e-12), 0.0),
        feed_forward,
    )
    plain = TransformerBlock(SelfAttentionMixer(attention), feed_forward)
    x, mask = (
        torch.randn(2, 6, 8),
        build_attention_mask(torch.tensor([[1, 2, 3, 0, 0, 0], [1] * 6])),
    )
    torch.testing.assert_close(bsa(x, mask), plain(x, mask))


def test_alpha_one_is_only_the_inductive_bias_and_mix_is_linear():
    torch.manual_seed(5)
    attention, feed_forward = _attention_and_ffn()
    mixer = BeyondSelfAttentionMixer(
        attention, FrequencyRescaler(6, 3, 8), StandardResidual(8, 0.0, 1e-12), 0.3
    )
    x, mask = torch.randn(2, 6, 8), build_attention_mask(torch.ones(2, 6, dtype=torch.long))
    features = mixer(x, mask, ("bsa", "sa", "ib"))
    torch.testing.assert_close(features["bsa"], 0.3 * features["ib"] + 0.7 * features["sa"])
    mixer.alpha = 1.0
    torch.testing.assert_close(mixer(x, mask, ("bsa",))["bsa"], features["ib"])


@pytest.mark.parametrize("alpha", [-0.1, 1.5])
def test_alpha_outside_unit_interval_is_rejected(alpha):
    attention, _ = _attention_and_ffn()
    with pytest.raises(ValueError, match=r"alpha=.* must lie in \[0, 1\]"):
        BeyondSelfAttentionMixer(
            attention, FrequencyRescaler(6, 3, 8), StandardResidual(8, 0.0, 1e-12), alpha
        )


def test_heads_must_divide_hidden_size():
    with pytest.raises(ValueError, match="hidden_size=10 is not divisible by n_heads=4"):
        MultiHeadSelfAttention(10, 4, SoftmaxAttention(0.0), StandardResidual(10, 0.0, 1e-12))


def test_unknown_fusion_branch_is_rejected():
    settings = dict(
        n_layers=1,
        hidden_size=8,
        n_heads=2,
        inner_size=16,
        hidden_dropout_prob=0.1,
        attn_dropout_prob=0.1,
        hidden_act="gelu",
        layer_norm_eps=1e-12,
        max_seq_length=6,
        token_mixer="bsa",
        alpha=0.5,
        c=3,
    )
    with pytest.raises(
        ValueError, match=r"fusion_branches=\['bsa', 'xyz'\] is invalid.*\['bsa', 'sa', 'ib'\]"
    ):
        build_encoder(**settings, fusion_branches=["bsa", "xyz"])
    with pytest.raises(ValueError, match="one weight per branch"):
        build_encoder(**settings, fusion_branches=["bsa", "sa"], fusion_weights=[1.0])
    with pytest.raises(ValueError, match="attention_operator='nope' is unknown"):
        build_encoder(**settings, attention_operator="nope")


@pytest.mark.parametrize("seq_len,c", [(50, 3), (49, 9), (8, 8), (7, 6), (201, 5)])
def test_fft_and_matmul_low_pass_are_the_same_function(seq_len, c):
    torch.manual_seed(3)
    x = torch.randn(3, seq_len, 4, requires_grad=True)
    matmul = FrequencyRescaler(seq_len, c, 4, method="matmul")
    fft = FrequencyRescaler(seq_len, c, 4, method="fft")
    fft.load_state_dict(matmul.state_dict())
    weights = torch.randn(3, seq_len, 4)
    outputs, grads = [], []
    for rescaler in (matmul, fft):
        out = rescaler(x)
        (grad,) = torch.autograd.grad((out * weights).sum(), x)
        outputs.append(out)
        grads.append(grad)
    torch.testing.assert_close(outputs[1], outputs[0], atol=2e-5, rtol=0)
    torch.testing.assert_close(grads[1], grads[0], atol=2e-5, rtol=0)
    torch.testing.assert_close(
        fft.low_frequency(x.double()), explicit_low_pass(x.detach(), c // 2 + 1), atol=2e-5, rtol=0
    )


def test_long_sequences_use_the_fft_and_hold_no_n_by_n_matrix():
    from recbole_freq.model.frequency import FFT_LOW_PASS_FROM_LENGTH

    short = FrequencyRescaler(FFT_LOW_PASS_FROM_LENGTH - 1, 3, 4)
    long = FrequencyRescaler(FFT_LOW_PASS_FROM_LENGTH, 3, 4)
    assert short.method == "matmul" and short.low_pass is not None
    assert long.method == "fft" and long.low_pass is None
    with pytest.raises(ValueError, match="low-pass method 'dense' is unknown"):
        FrequencyRescaler(10, 3, 4, method="dense")


def _sasrec_code_block_stack(encoder, x, mask, n_heads):
    """SASRec's own code (Kang and McAuley, ``model.py``; its PyTorch port's
    ``log2feats``) written out with the encoder's weights, dropout off: per block
    ``Q = LN(x)``, ``x = Q + MHA(Q, x, x)``, ``x = LN(x)``, ``x = x + FFN(x)``; a last
    LayerNorm."""
    from torch.nn.functional import gelu, layer_norm, linear

    def norm(module, h):
        return layer_norm(h, h.shape[-1:], module.weight, module.bias, module.eps)

    batch, seq_len, width = x.shape
    head = width // n_heads
    for block in encoder.blocks:
        attention = block.mixer.attention
        queries = norm(attention.residual.input_norm, x)
        w, b = attention.qkv.weight, attention.qkv.bias
        q = linear(queries, w[:width], b[:width])
        k = linear(x, w[width : 2 * width], b[width : 2 * width])
        v = linear(x, w[2 * width :], b[2 * width :])

        def split(t):
            return t.view(batch, seq_len, n_heads, head).transpose(1, 2)

        scores = split(q) @ split(k).transpose(-1, -2) / math.sqrt(head)
        probs = scores.masked_fill(~mask, float("-inf")).softmax(-1)
        context = (probs @ split(v)).transpose(1, 2).reshape(batch, seq_len, width)
        x = queries + attention.dense(context)
        ffn = block.feed_forward
        x = norm(ffn.residual.input_norm, x)
        x = x + ffn.dense_out(gelu(ffn.dense_in(x)))
    return norm(encoder.final_norm, x)


def test_sasrec_pre_norm_blocks_are_sasrecs_code():
    torch.manual_seed(0)
    encoder = build_encoder(
        n_layers=2, hidden_size=8, n_heads=2, inner_size=16, hidden_dropout_prob=0.3,
        attn_dropout_prob=0.3, hidden_act="gelu", layer_norm_eps=1e-8, max_seq_length=6,
        block_norm="sasrec_pre",
    ).double().eval()  # fmt: skip
    for module in encoder.modules():
        if isinstance(module, torch.nn.LayerNorm):  # not the identity they start as
            torch.nn.init.normal_(module.weight)
            torch.nn.init.normal_(module.bias)
    items = torch.tensor([[3, 1, 4, 1, 5, 0], [2, 7, 0, 0, 0, 0]])
    mask = build_attention_mask(items)
    x = torch.randn(2, 6, 8, dtype=torch.float64)
    expected = _sasrec_code_block_stack(encoder, x, mask, n_heads=2)
    torch.testing.assert_close(encoder(x, mask), expected)
    every_layer = encoder(x, mask, output_all_layers=True)
    torch.testing.assert_close(every_layer[-1], expected)  # the final LayerNorm included
    post = build_encoder(
        n_layers=2, hidden_size=8, n_heads=2, inner_size=16, hidden_dropout_prob=0.3,
        attn_dropout_prob=0.3, hidden_act="gelu", layer_norm_eps=1e-8, max_seq_length=6,
    )  # fmt: skip
    assert post.final_norm is None


def test_sasrec_pre_norm_is_refused_where_the_block_is_not_sasrecs():
    settings = dict(
        n_layers=1, hidden_size=8, n_heads=2, inner_size=16, hidden_dropout_prob=0.1,
        attn_dropout_prob=0.1, hidden_act="gelu", layer_norm_eps=1e-8, max_seq_length=6,
        block_norm="sasrec_pre",
    )  # fmt: skip
    with pytest.raises(ValueError, match="needs self-attention and the standard residual"):
        build_encoder(**settings, token_mixer="bsa")
    with pytest.raises(ValueError, match="block_norm='pre' is unknown"):
        build_encoder(**dict(settings, block_norm="pre"))
