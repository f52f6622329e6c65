"""Issue 68's models side by side: TV-Rec, WEARec, SLIME4Rec and MUFFIN in one comparison beside
BSARec, FMLP-Rec and the count baseline, through the real pipeline (FEARec's authors'
settings need sequences longer than the small data's 12 positions: tests/test_fearec.py)."""

from recbole_freq.jobs.compare import compare


def test_the_frequency_family_compares_in_one_table_beside_the_count_baseline(
    small_config, tmp_path
):
    overrides = {k: v for k, v in dict(small_config, epochs=1).items() if k != "seed"}
    entries = "TVRec,WEARec,SLIME4Rec,MUFFIN,BSARec,FMLPRec,TransitionCount"
    result = compare(entries, "tiny", seeds="3", overrides=overrides, out=tmp_path / "family")
    rows = {row["model"] for row in result["rows"]}
    assert {"TVRec", "WEARec", "SLIME4Rec", "MUFFIN", "BSARec"} <= rows
    lines = result["markdown"].splitlines()
    for model in ("TVRec", "WEARec", "SLIME4Rec", "MUFFIN", "TransitionCount (baseline)"):
        assert any(line.startswith(f"| {model} ") for line in lines), model
    # every proposed model's gain over the best baseline, the count lookup among them
    for model in ("TVRec", "WEARec", "SLIME4Rec", "MUFFIN"):
        assert any(line.startswith(f"| Improv. {model} |") for line in lines), model
    stored = sorted(p.name for p in (tmp_path / "family" / "runs").glob("*.json"))
    assert len(stored) == 7


def test_the_search_grids_of_the_models_without_a_published_grid_parse():
    from pathlib import Path

    from recbole_freq.jobs.tune.hyper import grid_size, parse_hyper_file

    hyper = Path(__file__).resolve().parents[1] / "properties" / "hyper"
    assert grid_size(parse_hyper_file(hyper / "MUFFIN.hyper")) == 27
    assert grid_size(parse_hyper_file(hyper / "TVRec.hyper")) == 90
    slime = parse_hyper_file(hyper / "SLIME4Rec.hyper")
    assert grid_size(slime) == 12 and slime["filter_mixer"].values == ("G", "L", "M")
