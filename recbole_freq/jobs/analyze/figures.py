"""The figures of ``--analyze`` (``analysis.write_figures``): spectral response of the
attention and mixed filters, high/low-frequency energy and representation similarity
per layer, singular values, and each model's own plots."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np

from recbole_freq.utils.files import write_atomic


def _save_figure(figure, path: Path) -> None:
    import matplotlib.pyplot as plt

    try:
        write_atomic(
            path, lambda handle: figure.savefig(handle, format="png", dpi=120, bbox_inches="tight")
        )
    finally:
        plt.close(figure)


def write_figures(results: list[dict], out: Path, written: list | None = None) -> list[str]:
    """PNG figures of one or more analysed checkpoints; returns the file names, which are
    also appended to ``written`` as each file is complete (what a failure left behind).
    Each figure is drawn by its own function (``FIGURES``); one that has nothing to show
    (no BSARec beta among the results, ...) is left out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    written = [] if written is None else written
    for name, draw in FIGURES:
        figure = draw(plt, results, colors)
        if figure is not None:
            _save_figure(figure, out / name)
            written.append(name)
    return written


def _title(figure, text: str, results) -> None:
    """The figure's title, naming the datasets analysed, set above the subplots' own
    titles (at the default height it ran into them)."""
    datasets = ", ".join(dict.fromkeys(str(r.get("dataset", "?")) for r in results))
    figure.suptitle(f"{text} on {datasets}", y=1.04)


def _integer_layers(axis) -> None:
    """Layer axes tick at whole layers (not 0.25 steps)."""
    from matplotlib.ticker import MaxNLocator

    axis.xaxis.set_major_locator(MaxNLocator(integer=True))


def _spectral_response(plt, results, colors):
    n_layers = max(len(r["attention_layers"]) for r in results)
    figure, axes = plt.subplots(
        1, n_layers, figsize=(4 * n_layers, 3.4), squeeze=False, sharey=True
    )
    for column in range(n_layers):
        axis = axes[0, column]
        for number, result in enumerate(results):
            color = colors[number % len(colors)]
            if column >= len(result["attention_layers"]):
                continue
            layer = result["attention_layers"][column]
            grid = result["frequency_grid"]
            if layer["attention_response"] is not None:
                axis.plot(grid, layer["attention_response"], color=color, label=result["label"])
            if layer["mixed_response"] is not None:
                axis.plot(
                    grid,
                    layer["mixed_response"],
                    color=color,
                    linestyle="--",
                    label=f"{result['label']} (mixed, eq. 5)",
                )
        axis.set_title(f"layer {column + 1}")
        axis.set_xlabel("frequency (cycles per position)")
        axis.grid(alpha=0.3)
    axes[0, 0].set_ylabel("|M f_k| / |f_k|")
    figure.tight_layout()
    # Below the panels: inside the first one it covered its y label and curves.
    handles, labels = axes[0, 0].get_legend_handles_labels()
    figure.legend(
        handles, labels, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, 0.0),
        ncol=min(3, max(1, len(labels))), frameon=False,
    )  # fmt: skip
    _title(figure, "Spectral response of the attention matrices (BSARec Fig. 2b)", results)
    return figure


def _oversmoothing(plt, results, colors):
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    for number, result in enumerate(results):
        color = colors[number % len(colors)]
        reps = result["representations"]
        values = np.asarray(reps[-1]["singular_values"])
        if values.size and values[0] > 0:
            left.plot(values / values[0], color=color, label=result["label"])
        layers = [rep["layer"] for rep in reps]
        right.plot(
            layers,
            [rep["mean_cosine_similarity"] for rep in reps],
            "o-",
            color=color,
            label=result["label"],
        )
    left.set_yscale("log")
    left.set_title("singular values of the sequence output embeddings")
    left.set_xlabel("index")
    left.set_ylabel("sigma_i / sigma_1 (last layer)")
    right.set_title("mean pairwise cosine similarity of tokens")
    right.set_xlabel("layer (0 = embedding)")
    _integer_layers(right)
    for axis in (left, right):
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    _title(figure, "Over-smoothing (BSARec Fig. 3)", results)
    return figure


def _frequency_energy(plt, results, colors):
    figure, axis = plt.subplots(figsize=(5, 3.6))
    for number, result in enumerate(results):
        reps = result["representations"]
        points = [(r["layer"], r["high_low_energy_ratio"]) for r in reps]
        points = [(x, y) for x, y in points if y is not None]
        axis.plot(*zip(*points), "o-", color=colors[number % len(colors)], label=result["label"])
    axis.set_yscale("log")
    axis.set_xlabel("layer (0 = embedding)")
    _integer_layers(axis)
    axis.set_ylabel("high / low frequency energy")
    axis.set_title("Energy outside / inside the DC bin (Theorem 1)")
    _title(figure, "Frequency energy per layer", results)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7)
    return figure


def _bsarec_beta(plt, results, colors):
    with_beta = [r for r in results if r.get("bsarec_beta")]
    if not with_beta:
        return None
    figure, axes = plt.subplots(
        len(with_beta),
        1,
        figsize=(8, 1.2 + 1.0 * sum(len(r["bsarec_beta"]) for r in with_beta)),
        squeeze=False,
    )
    for axis, result in zip(axes[:, 0], with_beta):
        image = axis.imshow(np.asarray(result["bsarec_beta"]), aspect="auto", cmap="viridis")
        axis.set_title(f"{result['label']}: learned beta (Fig. 7a)")
        axis.set_xlabel("hidden dimension")
        axis.set_ylabel("layer")
        axis.set_yticks(range(len(result["bsarec_beta"])))
        axis.set_yticklabels(range(1, len(result["bsarec_beta"]) + 1))
        figure.colorbar(image, ax=axis)
    figure.tight_layout()  # each panel's x label clear of the next panel's title
    _title(figure, "BSARec's learned beta", with_beta)
    return figure


def _rec_denoiser_masks(plt, results, colors):
    with_masks = [r for r in results if r.get("rec_denoiser_masks")]
    if not with_masks:
        return None
    n_cols = max(len(r["rec_denoiser_masks"]) for r in with_masks)
    figure, axes = plt.subplots(
        len(with_masks), n_cols, figsize=(3.6 * n_cols, 3.4 * len(with_masks)), squeeze=False
    )
    for row, result in enumerate(with_masks):
        for column, entry in enumerate(result["rec_denoiser_masks"]):
            mask = np.asarray(entry["mask"]).mean(0)  # average over heads
            image = axes[row, column].imshow(mask, vmin=0, vmax=1, cmap="magma")
            axes[row, column].set_title(
                f"layer {entry['layer']}, pruned {entry['pruned_fraction']:.1%}", fontsize=9
            )
            axes[row, column].set_xlabel("key (n-1 = latest)")
            # The checkpoint's name once per row, wrapped: side by side, long names
            # in every title ran into each other.
            if column == 0:
                name = "\n".join(textwrap.wrap(result["label"], 28))
                axes[row, column].set_ylabel(f"{name}\nquery", fontsize=8)
        figure.colorbar(image, ax=axes[row, :].tolist())
    _title(figure, "Rec-Denoiser's attention masks", with_masks)
    return figure


def _polyrec_orders(plt, results, colors):
    with_orders = [r for r in results if r.get("polyrec_order_contributions")]
    if not with_orders:
        return None
    figure, axes = plt.subplots(
        1, len(with_orders), figsize=(5 * len(with_orders), 3.4), squeeze=False
    )
    for axis, result in zip(axes[0], with_orders):
        values = np.asarray(result["polyrec_order_contributions"])
        width = 0.8 / values.shape[0]
        for layer, row in enumerate(values):
            axis.bar(np.arange(len(row)) + layer * width, row, width, label=f"layer {layer + 1}")
        axis.set_xlabel("Chebyshev order k")
        axis.set_ylabel("mean |w_k T_k(A) V| per token")
        axis.set_title(f"{result['label']}: per-order contribution (section 4.5)", fontsize=9)
        axis.legend(fontsize=7)
    _title(figure, "PolyRec's per-order contributions", with_orders)
    return figure


# The figures in the order they are written: file name, drawing function.
FIGURES = [
    ("spectral_response.png", _spectral_response),
    ("oversmoothing.png", _oversmoothing),
    ("frequency_energy.png", _frequency_energy),
    ("bsarec_beta.png", _bsarec_beta),
    ("rec_denoiser_masks.png", _rec_denoiser_masks),
    ("polyrec_orders.png", _polyrec_orders),
]
