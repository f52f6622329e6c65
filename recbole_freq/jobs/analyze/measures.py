"""Frequency analysis of trained checkpoints: ``run_recbole_freq.py --analyze``.

The papers' arguments are about frequencies; this module measures them on a trained
model and real validation sequences of its dataset, and writes figures (PNG) and the
numbers behind them (``analysis.json``).  Several checkpoints (e.g. SASRec and BSARec on
the same data) share the figures.

Definitions (``N`` = ``MAX_ITEM_LIST_LENGTH``; RecBole right-pads sequences):

- **Valid part.**  Every measurement uses the real (non-padding) positions only: a
  sequence with ``L`` real items contributes the ``L x L`` block of each token-mixing
  matrix between its real positions, and the ``L`` representations at those positions.
  Real positions are read off the attention mask the model itself builds (a query
  position is real iff it may attend to itself, or, for a key-only bidirectional mask,
  iff it is a real key), so models that rewrite the input (BERT4Rec's appended
  ``[mask]``) are measured on what their encoder actually saw.
- **Spectral response** of an ``L x L`` matrix ``M`` (BSARec Fig. 2b): for each DFT
  frequency ``k = 0 .. L // 2``, ``|M f_k| / |f_k|`` with ``f_k[n] = exp(2 pi i k n / L)``
  (``spectral_response``): how much ``M`` passes a pure oscillation of ``k / L`` cycles
  per position (for real ``M`` the bins ``k`` and ``L - k`` agree).  A row-stochastic
  matrix passes frequency 0 exactly (gain 1); a low-pass filter attenuates the rest.
  Per layer the response is averaged over heads and over the validation sequences; as
  sequences differ in length, each length's mean response is interpolated onto the
  common grid of ``N // 2 + 1`` frequencies ``j / N`` (cycles per position, 0 to 0.5)
  and the lengths are weighted by their number of sequences.  Sequences with fewer than
  ``MIN_SPECTRAL_LENGTH`` real items are left out of the response (too few frequencies).
- **Attention matrix** of a layer: the matrix the layer's own attention operator applies
  to the value vectors, obtained by calling that operator with the identity matrix as
  values (every operator is linear in ``V``): softmax attention ``A`` (BSARec eq. 1),
  Rec-Denoiser's masked ``A * Z`` at inference, PolyRec's ``sum_k w_k T_k(A)``.  For
  RecBole's Transformer (SASRec, BERT4Rec ...) it is the softmax output of
  ``MultiHeadAttention``.  Residual paths, LayerNorm and projections are not part of it.
- **Mixed filter** of BSARec layers (eq. 5): ``alpha A_IB + (1 - alpha) A`` with the
  layer's own frequency rescaler ``A_IB = LFC + beta HFC`` (eq. 7, per hidden dimension,
  obtained by applying the rescaler to unit impulses) and the head-averaged ``A``; its
  response is averaged over the hidden dimensions.
- **Over-smoothing** (BSARec Fig. 3), per layer (0 = embedding output, ``l`` = output
  of block ``l``): the singular values of the *sequence output embeddings* (the
  representation at each sequence's last real position, the one that scores the next
  item; a ``sequences x hidden`` matrix), and the mean pairwise cosine similarity of the
  token representations within a sequence (over pairs ``i != j`` of real positions,
  averaged over sequences with at least 2 items).
- **High/low frequency energy ratio** (Theorem 1's ``|HFC| / |LFC|``, squared): for a
  sequence's representations ``X`` (``L x d``), with the orthonormal DFT along the
  sequence, the energy of every bin except frequency 0 divided by the energy of the
  frequency-0 (DC) bin.  By Parseval this is ``sum_i |x_i - mean|^2 / (L |mean|^2)``.
  The low band is the DC bin alone because sequence lengths differ; per layer the ratio
  of the energies summed over sequences is reported.  Over-smoothing drives it to 0.
- **Model-specific**: BSARec's learned beta per layer and dimension (Fig. 7a,
  ``learned_beta()``); Rec-Denoiser's inference masks and pruned fractions
  (``learned_masks()``); PolyRec's mean contribution norm of each Chebyshev order per
  layer (section 4.5, ``order_contributions``).
"""

from __future__ import annotations

import sys

import numpy as np
import torch

from recbole_freq.utils.command import DEFAULT_MAX_SEQUENCES

MIN_SPECTRAL_LENGTH = 4


# --- measurements --------------------------------------------------------------------


def spectral_response(matrices: torch.Tensor) -> torch.Tensor:
    """``|M f_k| / |f_k|`` for ``k = 0 .. L // 2`` of ``(..., L, L)`` matrices ``M``."""
    length = matrices.size(-1)
    positions = torch.arange(length, dtype=torch.float64)
    angle = 2 * torch.pi * torch.outer(positions, positions) / length
    basis = torch.polar(torch.full_like(angle, length**-0.5), angle)  # unit columns f_k
    passed = matrices.to(torch.complex128) @ basis
    return passed.abs().square().sum(-2).sqrt()[..., : length // 2 + 1].float()


def high_low_energy(hidden: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Per sequence, the energy outside and inside the frequency-0 bin of the real rows.

    ``hidden`` ``(batch, N, d)``, ``valid`` ``(batch, N)``; returns ``(high, low)``, each
    ``(batch,)``: with ``L`` real rows, ``low = L |mean|^2`` (the DC bin of the
    orthonormal DFT) and ``high = sum |x_i - mean|^2`` (all other bins, by Parseval).
    """
    weight = valid.to(hidden.dtype)[..., None]
    count = weight.sum(1).clamp_min(1)
    mean = (hidden * weight).sum(1) / count
    low = count.squeeze(-1) * mean.square().sum(-1)
    high = ((hidden - mean[:, None]).square() * weight).sum((1, 2))
    return high, low


def mean_pairwise_cosine(hidden: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Per sequence, the mean cosine similarity over pairs ``i != j`` of real rows
    (NaN for sequences with fewer than 2)."""
    unit = torch.nn.functional.normalize(hidden.double(), dim=-1) * valid[..., None]
    count = valid.sum(-1).double()
    total = unit.sum(1).square().sum(-1)  # sum over all ordered pairs, i == j included
    pairs = count * (count - 1)
    return torch.where(pairs > 0, (total - count) / pairs.clamp_min(1), torch.nan)


def singular_values(matrix: torch.Tensor) -> torch.Tensor:
    """Singular values of a ``(rows, d)`` matrix, largest first."""
    return torch.linalg.svdvals(matrix.double()).float()


def valid_positions(mask: torch.Tensor) -> torch.Tensor:
    """``(batch, N)``: real positions, read off a model's attention mask.

    Boolean masks (``True`` = allowed, the core's) or additive ones (0 = allowed,
    negative = hidden, RecBole's); ``(batch, 1, N, N)`` query-key masks give the
    diagonal (a real query may attend to itself), key-only ``(batch, 1, 1, N)`` ones
    the keys.
    """
    allowed = mask if mask.dtype == torch.bool else mask >= 0
    allowed = allowed[:, 0]
    if allowed.size(-2) == 1:
        return allowed[:, 0]
    return allowed.diagonal(dim1=-2, dim2=-1)


# --- probing a model's encoder -------------------------------------------------------


class EncoderProbe:
    """Forward hooks that record, for one forward pass of a model, the encoder input,
    every layer's output, the attention mask and each layer's attention matrix.

    Supports the recbole-freq core (``model.encoder.blocks``) and RecBole's Transformer
    (``model.trm_encoder.layer``, e.g. SASRec, BERT4Rec).  The model's own modules
    compute everything; nothing of their math is copied here.
    """

    def __init__(self, model):
        self.model = model
        self.handles = []
        self.reset()
        from recbole.model.layers import TransformerEncoder as RecboleTransformerEncoder

        from recbole_freq.model.abstract_recommender import TransformerRecommender

        if isinstance(model, TransformerRecommender):
            self.family, layers = "core", list(model.encoder.blocks)
        elif isinstance(getattr(model, "trm_encoder", None), RecboleTransformerEncoder):
            self.family, layers = "recbole", list(model.trm_encoder.layer)
        else:
            raise ValueError(
                f"cannot analyse {type(model).__name__}: the analysis reads Transformer "
                "encoders of recbole-freq models (encoder.blocks) and RecBole's "
                "(trm_encoder.layer, e.g. SASRec, BERT4Rec)"
            )
        self.n_layers = len(layers)
        self.handles.append(layers[0].register_forward_pre_hook(self._record_input))
        for index, layer in enumerate(layers):
            self.handles.append(layer.register_forward_hook(self._record_output(index)))
            if self.family == "core":
                attention = getattr(layer.mixer, "attention", None)  # a filter mixer has none
                if attention is not None:
                    operator = attention.operator
                    self.handles.append(operator.register_forward_pre_hook(self._core_attn(index)))
            else:
                softmax = layer.multi_head_attention.softmax
                self.handles.append(softmax.register_forward_hook(self._recbole_attn(index)))

    def reset(self):
        self.hidden0, self.mask, self.outputs, self.attention = None, None, {}, {}

    def close(self):
        for handle in self.handles:
            handle.remove()

    def _record_input(self, module, args):
        self.hidden0, self.mask = args[0].detach(), args[1].detach()

    def _record_output(self, index):
        def hook(module, args, output):
            self.outputs[index] = output.detach()

        return hook

    def _core_attn(self, index):
        def hook(operator, args):
            query, key, value, mask = args
            size = value.size(-2)
            identity = torch.eye(size, dtype=value.dtype, device=value.device)
            identity = identity.expand(*value.shape[:-2], size, size).contiguous()
            # module.forward, not module(...): calling it must not re-enter this hook.
            self.attention[index] = operator.forward(query, key, identity, mask).detach()

        return hook

    def _recbole_attn(self, index):
        def hook(module, args, output):
            self.attention[index] = output.detach()

        return hook

    def mixers(self) -> dict[int, tuple[float, torch.Tensor]]:
        """Per BSARec layer: ``(alpha, R)`` with ``R`` ``(hidden, N, N)`` the frequency
        rescaler's matrix per hidden dimension (row = output position)."""
        from recbole_freq.model.frequency import BeyondSelfAttentionMixer

        found = {}
        if self.family != "core":
            return found
        for index, block in enumerate(self.model.encoder.blocks):
            mixer = block.mixer
            if isinstance(mixer, BeyondSelfAttentionMixer):
                length = mixer.rescaler.seq_len
                hidden = mixer.rescaler.sqrt_beta.size(-1)
                param = mixer.rescaler.sqrt_beta
                impulses = torch.eye(length, dtype=param.dtype, device=param.device)
                impulses = impulses[:, :, None].expand(length, length, max(hidden, 1))
                with torch.no_grad():
                    response = mixer.rescaler(impulses)  # [j, n, d] = R_d[n, j]
                found[index] = (float(mixer.alpha), response.permute(2, 1, 0).cpu())
        return found


def _blocks(matrices: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``(S, ..., L, L)`` blocks of ``(S, ..., N, N)`` at per-sequence positions ``index``."""
    extra = matrices.dim() - 3
    shape = (index.size(0),) + (1,) * extra
    rows = index.view(*shape, -1, 1).expand(*matrices.shape[:-2], index.size(1), matrices.size(-1))
    picked = matrices.gather(-2, rows)
    cols = index.view(*shape, 1, -1).expand(*picked.shape[:-1], index.size(1))
    return picked.gather(-1, cols)


class _ResponseAccumulator:
    """Sum and count of spectral responses per sequence length."""

    def __init__(self):
        self.sums: dict[int, torch.Tensor] = {}
        self.counts: dict[int, int] = {}

    def add(self, length: int, responses: torch.Tensor) -> None:
        total = responses.double().sum(0)
        self.sums[length] = self.sums.get(length, 0) + total
        self.counts[length] = self.counts.get(length, 0) + responses.size(0)

    def on_grid(self, grid: np.ndarray) -> list[float] | None:
        if not self.counts:
            return None
        curve, weight = np.zeros_like(grid), 0
        for length, count in self.counts.items():
            freqs = np.arange(length // 2 + 1) / length
            mean = (self.sums[length] / count).numpy()
            curve += count * np.interp(grid, freqs, mean)
            weight += count
        return (curve / weight).tolist()


@torch.no_grad()
def analyse_model(model, batches, max_sequences: int = DEFAULT_MAX_SEQUENCES, chunk: int = 16):
    """Measure ``model`` on the sequences of ``batches`` (RecBole interactions, e.g. of
    the validation loader); returns the JSON-ready numbers (see the module docstring)."""
    model.eval()
    device = next(model.parameters()).device
    probe = EncoderProbe(model)
    mixers = probe.mixers()
    attention = [_ResponseAccumulator() for _ in range(probe.n_layers)]
    mixed = {index: _ResponseAccumulator() for index in mixers}
    n_reps = probe.n_layers + 1
    last_rows = [[] for _ in range(n_reps)]
    cosine_sum, cosine_count = np.zeros(n_reps), 0
    high_sum, low_sum = np.zeros(n_reps), np.zeros(n_reps)
    seen, used_batches, max_len = 0, [], None
    try:
        for batch in batches:
            if seen >= max_sequences:
                break
            batch = batch[: min(len(batch), max_sequences - seen)].to(device)
            used_batches.append(batch)
            probe.reset()
            model.full_sort_predict(batch)
            valid = valid_positions(probe.mask)
            max_len = probe.mask.size(-1)
            reps = [probe.hidden0] + [probe.outputs[i] for i in range(probe.n_layers)]
            lengths = valid.sum(-1)
            last = (valid * torch.arange(valid.size(1), device=device)).argmax(-1)
            rows = torch.arange(valid.size(0), device=device)
            multi = lengths >= 2
            for index, hidden in enumerate(reps):
                last_rows[index].append(hidden[rows, last].cpu())
                cosine_sum[index] += mean_pairwise_cosine(hidden, valid)[multi].sum().item()
                high, low = high_low_energy(hidden.double(), valid)
                high_sum[index] += high.sum().item()
                low_sum[index] += low.sum().item()
            cosine_count += int(multi.sum())
            seen += valid.size(0)
            _add_spectra(probe, valid, lengths, attention, mixed, mixers, chunk)
    finally:
        probe.close()
    if seen == 0:
        raise ValueError("no validation sequences to analyse")
    grid = np.arange(max_len // 2 + 1) / max_len
    result = _spectra_result(seen, max_len, grid, attention, mixed, probe.n_layers)
    result["representations"] = [
        {
            "layer": index,
            "singular_values": singular_values(torch.cat(last_rows[index])).tolist(),
            "mean_cosine_similarity": cosine_sum[index] / max(cosine_count, 1),
            "high_low_energy_ratio": high_sum[index] / low_sum[index]
            if low_sum[index] > 0
            else None,
        }
        for index in range(n_reps)
    ]
    result.update(model_specific(model, used_batches))
    return result


def _add_spectra(probe, valid, lengths, attention, mixed, mixers, chunk) -> None:
    """Add the batch's spectral responses, per sequence length: each layer's attention
    matrices (mean over heads) and, for BSARec's mixers, the matrix eq. 5 mixes."""
    for length in sorted(set(lengths.tolist())):
        if length < MIN_SPECTRAL_LENGTH:
            continue
        chosen = (lengths == length).nonzero().squeeze(-1)
        index = valid[chosen].nonzero()[:, 1].view(len(chosen), length)
        for layer in range(probe.n_layers):
            matrix = probe.attention.get(layer)
            head_mean = None
            if matrix is not None:
                block = _blocks(matrix[chosen].double(), index)  # (S, H, L, L)
                attention[layer].add(length, spectral_response(block).mean(1))
                head_mean = block.mean(1)
            if layer in mixers:
                alpha, rescale = mixers[layer]
                for start in range(0, len(chosen), chunk):
                    part = index[start : start + chunk].cpu()
                    filt = _blocks(rescale.double().expand(len(part), -1, -1, -1), part)
                    if head_mean is not None:
                        other = head_mean[start : start + chunk, None].cpu()
                        filt = alpha * filt + (1 - alpha) * other
                    mixed[layer].add(length, spectral_response(filt).mean(1))


def _spectra_result(seen, max_len, grid, attention, mixed, n_layers) -> dict:
    return {
        "n_sequences": seen,
        "max_seq_length": max_len,
        "frequency_grid": grid.tolist(),
        "attention_layers": [
            {
                "layer": layer + 1,
                "attention_response": attention[layer].on_grid(grid),
                "mixed_response": mixed[layer].on_grid(grid) if layer in mixed else None,
            }
            for layer in range(n_layers)
        ],
        "representations": [],
    }


def model_specific(model, batches) -> dict:
    """What a plugin model reports of itself (``analysis_report``): BSARec's beta,
    Rec-Denoiser's masks, PolyRec's orders; nothing for RecBole's models."""
    from recbole_freq.model.abstract_recommender import TransformerRecommender

    if isinstance(model, TransformerRecommender):
        return model.analysis_report(batches)
    return {}


# --- checkpoints ------------------------------------------------------------------------


def analyse_checkpoint(
    path, data_path=None, max_sequences=DEFAULT_MAX_SEQUENCES, device="cpu", trust_data=False
):
    """Load ``path`` safely, rebuild its dataset and analyse it on validation sequences."""

    from recbole_freq.quick_start.restore import describe_checkpoint, restore_model

    model, config, _, loaders, checkpoint = restore_model(
        path, data_path, device, trust_data=trust_data
    )
    print(describe_checkpoint(path, config, checkpoint), file=sys.stderr)
    from tqdm import tqdm

    valid_data = loaders[1]
    batches = (batch[0] if isinstance(batch, tuple) else batch for batch in valid_data)
    # Shown on a terminal only (disable=None); the loop stops at max_sequences.
    batches = tqdm(batches, desc="analysing", unit="batch", disable=None, file=sys.stderr)
    result = analyse_model(model, batches, max_sequences)
    return {
        "checkpoint": str(path),
        "weights_sha256": checkpoint["weights_sha256"],
        "model": config["model"],
        "dataset": config["dataset"],
        **result,
    }


def label_results(results: list[dict], labels: dict | None = None) -> None:
    """Name each result in the figures' legends: the label given for its checkpoint
    (``--labels``), else its model, numbered where models repeat (``BSARec 1``,
    ``BSARec 2``, in the order given; analysis.json keeps each one's checkpoint)."""
    names = [r["model"] for r in results]
    seen: dict[str, int] = {}
    for result in results:
        model = result["model"]
        seen[model] = seen.get(model, 0) + 1
        label = model if names.count(model) == 1 else f"{model} {seen[model]}"
        result["label"] = (labels or {}).get(result["checkpoint"], label)
