"""Paper settings for PolyRec and FBSARec, and the named rows of the papers' ablation
tables (``--variant``): BSARec's Table 3 / 7, the FBSARec thesis' Tables 1-6, PolyRec's
Table 3.  Each file loads, names its protocol and trains on small data; a comparison
names each variant's row and sets the paper's figure beside it."""

from pathlib import Path

import pytest
import torch
import yaml

from conftest import small_overrides, write_sequences
from dataset_prep import convert_one_line
from recbole_freq.cli import main
from recbole_freq.config.configurator import FreqConfig, model_variants, paper_file
from recbole_freq.jobs.compare import ComparisonError, compare
from recbole_freq.protocol import protocol_label
from recbole_freq.quick_start.quick_start import run

PROPERTIES = Path(__file__).resolve().parents[1] / "properties"
PAPER_FILES = sorted(
    (model, path.stem)
    for model in ("PolyRec", "FBSARec")
    for path in (PROPERTIES / "paper" / model).glob("*.yaml")
)
VARIANTS = sorted(
    (path.parent.name, path.stem) for path in (PROPERTIES / "variant").glob("*/*.yaml")
)


# A value other than each variant's, for the command line to set over it.
OTHER = {
    "alpha": 0.5,
    "beta_type": "vector",
    "fusion_branches": ["bsa"],
    "cl_weight": 0.2,
    "residual": "fourier_truncated",
    "attention_operator": "chebyshev",
    "trc_skip": ("bsarec_mix", "truncated"),  # the first that is not the variant's
    "count_last_k": 2,
    "mask_learning": "learned",
    "sparsity_beta": 0.05,
    "jacobian_normalization": "entry",
}


# Variants that name what the model does by default, so that a comparison's entry keeps
# its meaning if the default changes.
DEFAULT_VARIANTS = {("FBSARec", "fusion-bsa-sa"), ("PolyRec", "skip-identity-and-truncated")}


@pytest.fixture(scope="module")
def paper_named_data(tmp_path_factory):
    """Small datasets named lastfm and amazon-beauty, so that their paper files apply."""
    root = tmp_path_factory.mktemp("variants")
    for name in ("lastfm", "amazon-beauty"):
        raw = write_sequences(root / f"{name}.txt", n_users=40, n_items=30, max_len=12)
        convert_one_line(raw, root, name, show_progress=False, check=False)
    return root


@pytest.fixture(autouse=True)
def _deterministic_algorithms_off_afterwards():
    yield  # --paper turns torch's deterministic algorithms on for the process
    torch.use_deterministic_algorithms(False)


def test_the_expected_files_exist():
    assert {m for m, _ in PAPER_FILES} == {"PolyRec", "FBSARec"}
    assert {d for m, d in PAPER_FILES if m == "PolyRec"} == {
        "amazon-beauty",
        "amazon-sports-outdoors",
        "ml-1m",
    }
    assert len([1 for m, _ in PAPER_FILES if m == "FBSARec"]) == 6
    assert model_variants("BSARec") == ["only-inductive-bias", "only-self-attention", "scalar-beta"]
    assert len(model_variants("FBSARec")) == 6 and len(model_variants("PolyRec")) == 6
    assert model_variants("RecDenoiser") == [
        "frozen-masks", "jacobian-as-written", "without-denoiser", "without-sparsity"
    ]  # fmt: skip


@pytest.mark.parametrize("model,dataset", PAPER_FILES, ids=[f"{m}-{d}" for m, d in PAPER_FILES])
def test_paper_file_loads_with_every_setting_and_names_its_protocol(model, dataset):
    settings = yaml.safe_load((PROPERTIES / "paper" / model / f"{dataset}.yaml").read_text())
    config = FreqConfig(model, dataset, paper=True)
    assert protocol_label(config).split("+")[0] == settings["protocol"]
    for key, value in settings.items():
        assert config[key] == value, key


@pytest.mark.parametrize("model,variant", VARIANTS, ids=[f"{m}-{v}" for m, v in VARIANTS])
def test_variant_sets_its_settings_over_the_paper_files(model, variant):
    settings = yaml.safe_load((PROPERTIES / "variant" / model / f"{variant}.yaml").read_text())
    dataset = "amazon-beauty"
    paper = paper_file(model, dataset) is not None  # a count baseline has no paper
    plain = FreqConfig(model, dataset, paper=paper)
    config = FreqConfig(model, dataset, paper=paper, cmd_overrides={"variant": variant})
    assert config["variant"] == variant
    for key, value in settings.items():
        assert config[key] == value, key
        # FBSARec's own default is its Table 4 variant, PolyRec's its reading of eq. 13
        assert plain[key] != value or (model, variant) in DEFAULT_VARIANTS, key
    assert protocol_label(config) == protocol_label(plain)
    # the command line still wins over a variant
    key = next(iter(settings))
    other = OTHER[key]
    if isinstance(other, tuple):
        other = next(value for value in other if value != settings[key])
    overridden = FreqConfig(
        model, dataset, paper=paper, cmd_overrides={"variant": variant, key: other}
    )
    assert overridden[key] == other != settings[key]


def test_polyrec_takes_the_reading_of_eq13_chosen_on_beauty_validation():
    """Issue 66: the identity skip kept beside the truncated one is PolyRec's reading,
    with --paper on every dataset and without it; the reading used before is a variant."""
    for dataset in ("amazon-beauty", "amazon-sports-outdoors", "ml-1m"):
        assert FreqConfig("PolyRec", dataset, paper=True)["trc_skip"] == "identity_and_truncated"
    assert FreqConfig("PolyRec", "lastfm")["trc_skip"] == "identity_and_truncated"
    before = FreqConfig(
        "PolyRec", "amazon-beauty", paper=True, cmd_overrides={"variant": "skip-truncated"}
    )
    assert before["trc_skip"] == "truncated"


def test_tiny_runs_with_the_paper_files_and_a_variant(paper_named_data, tmp_path):
    polyrec = run(
        "PolyRec",
        "amazon-beauty",
        cmd_overrides=small_overrides(paper_named_data, tmp_path),
        paper=True,
    )
    assert polyrec["protocol"]["label"] == "recbole" and polyrec["test_result"]["hit@10"] >= 0
    assert polyrec["config"]["trc_skip"] == "identity_and_truncated"
    fused = run(
        "FBSARec",
        "lastfm",
        cmd_overrides=small_overrides(paper_named_data, tmp_path, variant="fusion-sa-ib"),
        paper=True,
    )
    assert fused["config"]["fusion_branches"] == ["sa", "ib"]
    assert fused["config"]["variant"] == "fusion-sa-ib"
    assert fused["protocol"]["label"].startswith("bsarec")


def test_unknown_variant_is_one_clear_line(paper_named_data, tmp_path, capsys):
    args = [f"--{k}={v}" for k, v in small_overrides(paper_named_data, tmp_path).items()]
    assert main(["--model=BSARec", "--dataset=lastfm", "--paper", "--variant=only-a", *args]) == 2
    err = capsys.readouterr().err
    assert "variant 'only-a' of BSARec is not one of its named variants" in err
    assert "only-self-attention" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(ComparisonError, match="SASRec is not one of its named variants"):
        compare(
            "BSARec,SASRec@variant=x",
            "lastfm",
            seeds="1",
            overrides=small_overrides(paper_named_data, tmp_path),
        )


def test_ablation_rows_are_named_and_set_beside_table_7(paper_named_data, tmp_path):
    """BSARec Table 7 as one comparison: each ablation's row named by its variant and
    followed by the paper's figure for it (LastFM, HR@20 0.0899 for "only A")."""
    entries = "BSARec,BSARec@variant=only-self-attention,BSARec@variant=scalar-beta"
    result = compare(
        entries,
        "lastfm",
        seeds="1",
        overrides=small_overrides(paper_named_data, tmp_path),
        out=tmp_path / "table7",
        paper=True,
        baselines="BSARec",
        log=print,
    )
    names = [row["model"] for row in result["rows"]]
    assert names == ["BSARec", "BSARec [only-self-attention]", "BSARec [scalar-beta]"]
    markdown = result["markdown"]
    assert "| BSARec [only-self-attention] (paper, Table 7) |" in markdown and "0.0899" in markdown
    assert "| BSARec [scalar-beta] (paper, Table 7) |" in markdown and "0.1092" in markdown
    runs = sorted(p.name for p in (tmp_path / "table7" / "runs").glob("*.json"))
    assert runs == [
        "BSARec-seed1.json",
        "BSARec@variant=only-self-attention-seed1.json",
        "BSARec@variant=scalar-beta-seed1.json",
    ]
