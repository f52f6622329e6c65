"""Issue 68's models side by side: WEARec, SLIME4Rec and MUFFIN in one comparison beside
BSARec, FMLP-Rec and the count baseline, through the real pipeline (FEARec's authors'
settings need sequences longer than the small data's 12 positions: tests/test_fearec.py)."""

from recbole_freq.jobs.compare import compare


def test_the_frequency_family_compares_in_one_table_beside_the_count_baseline(
    small_config, tmp_path
):
    overrides = {k: v for k, v in dict(small_config, epochs=1).items() if k != "seed"}
    entries = "WEARec,SLIME4Rec,MUFFIN,BSARec,FMLPRec,TransitionCount"
    result = compare(entries, "tiny", seeds="3", overrides=overrides, out=tmp_path / "family")
    rows = {row["model"] for row in result["rows"]}
    assert {"WEARec", "SLIME4Rec", "MUFFIN", "BSARec"} <= rows
    lines = result["markdown"].splitlines()
    for model in ("WEARec", "SLIME4Rec", "MUFFIN", "TransitionCount (baseline)"):
        assert any(line.startswith(f"| {model} ") for line in lines), model
    # every proposed model's gain over the best baseline, the count lookup among them
    for model in ("WEARec", "SLIME4Rec", "MUFFIN"):
        assert any(line.startswith(f"| Improv. {model} |") for line in lines), model
    stored = sorted(p.name for p in (tmp_path / "family" / "runs").glob("*.json"))
    assert len(stored) == 6
