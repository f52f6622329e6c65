"""Side-by-side comparison (``--compare``): real runs on tiny data, tables, plot, resume."""

import csv
import json
import os
from pathlib import Path

import pytest
from scipy.stats import ttest_rel

from recbole_freq.cli import main
from recbole_freq.jobs.compare import (
    ComparisonError,
    compare,
    improvement,
    markdown_table,
    paired_p_value,
    summarise,
)
from recbole_freq.jobs.compare.execution import Execution, _check_ray_resources
from recbole_freq.jobs.compare.runs import record_digest

METRICS = ["hit@5", "hit@10", "hit@20", "ndcg@5", "ndcg@10", "ndcg@20"]


def overrides_of(small_config, **changes):
    # The comparison sets the seed itself.
    return {key: value for key, value in {**small_config, **changes}.items() if key != "seed"}


def cli_args(config: dict) -> list[str]:
    return [f"--{key}={value}" for key, value in config.items()]


def checkpoints(small_config) -> list[str]:
    return sorted(p.name for p in Path(small_config["checkpoint_dir"]).glob("*.pth"))


def test_two_models_two_seeds_give_tables_plot_and_resume(small_config, tmp_path, capsys):
    out = tmp_path / "cmp"
    overrides = overrides_of(small_config, epochs=1)
    argv = ["--compare", "BSARec,SASRec", "--dataset=tiny", "--seeds", "11,12", "--out", str(out)]
    assert main([*argv, *cli_args(overrides)]) == 0
    printed = capsys.readouterr().out
    # The printed tables open with the protocol's label.
    assert printed.split("\nProtocol: recbole\n", 1)[1].lstrip().startswith("| Model |")

    run_files = sorted(p.name for p in (out / "runs").glob("*.json"))
    assert run_files == [f"{m}-seed{s}.json" for m in ("BSARec", "SASRec") for s in (11, 12)]
    record = json.loads((out / "runs" / "BSARec-seed12.json").read_text())
    assert record["summary"]["seed"] == 12 and record["summary"]["epochs_run"] == 1
    assert record["summary"]["config"]["hidden_size"] == 16
    assert set(METRICS) <= set(record["summary"]["test_result"])

    with open(out / "comparison.csv", newline="") as handle:
        rows = {row["model"]: row for row in csv.DictReader(handle)}
    assert set(rows) == {"BSARec", "SASRec"}
    assert rows["SASRec"]["role"] == "baseline" and rows["BSARec"]["role"] == "proposed"
    runs = {
        (m, s): json.loads((out / "runs" / f"{m}-seed{s}.json").read_text())["summary"]
        for m in ("BSARec", "SASRec")
        for s in (11, 12)
    }
    for metric in METRICS:
        values = [runs[("BSARec", s)]["test_result"][metric] for s in (11, 12)]
        base = [runs[("SASRec", s)]["test_result"][metric] for s in (11, 12)]
        assert float(rows["BSARec"][f"{metric}_mean"]) == pytest.approx(sum(values) / 2)
        assert rows["BSARec"][f"{metric}_best_baseline"] == "SASRec"
        if sum(base):
            expected = (sum(values) - sum(base)) / sum(base) * 100
            assert float(rows["BSARec"][f"{metric}_improv_pct"]) == pytest.approx(expected)
        assert rows["SASRec"][f"{metric}_improv_pct"] == ""
    assert int(rows["BSARec"]["parameters"]) == runs[("BSARec", 11)]["parameters"]
    assert float(rows["SASRec"]["train_seconds_per_epoch_mean"]) > 0

    markdown = (out / "comparison.md").read_text()
    for text in ("| Model |", "SASRec (baseline)", "Improv. BSARec", "p (paired t) BSARec", " ± "):
        assert text in markdown
    assert "Best baseline: SASRec for every metric." in markdown
    assert markdown in printed
    assert (out / "comparison.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with open(out / "runs.csv", newline="") as handle:
        assert len(list(csv.DictReader(handle))) == 4

    # Second invocation: every run is stored, so nothing trains and nothing is rewritten.
    stamps = {p: p.stat().st_mtime_ns for p in (out / "runs").glob("*.json")}
    saved = checkpoints(small_config)
    again = compare("BSARec,SASRec", "tiny", seeds=[11, 12], overrides=overrides, out=out)
    assert again["trained"] == [] and len(again["skipped"]) == 4
    assert {p: p.stat().st_mtime_ns for p in (out / "runs").glob("*.json")} == stamps
    assert checkpoints(small_config) == saved
    assert again["markdown"] == markdown

    # Interrupted comparison: only the missing run is trained.
    (out / "runs" / "SASRec-seed12.json").unlink()
    resumed = compare("BSARec,SASRec", "tiny", seeds=[11, 12], overrides=overrides, out=out)
    assert resumed["trained"] == [("SASRec", 12)]
    assert len(checkpoints(small_config)) == len(saved) + 1

    # Other settings in the same output folder: an error, nothing trained or changed.
    stamps = {p: p.stat().st_mtime_ns for p in (out / "runs").glob("*.json")}
    other = overrides_of(small_config, epochs=2)
    assert main([*argv, *cli_args(other)]) == 2
    err = capsys.readouterr().err
    assert "already holds runs made with other settings" in err and "--epochs: 1 vs 2" in err
    assert "Pick another --out" in err
    assert {p: p.stat().st_mtime_ns for p in (out / "runs").glob("*.json")} == stamps


def test_explicit_baselines_and_metrics_retabulate_without_training(small_config, tmp_path):
    out = tmp_path / "cmp"
    overrides = overrides_of(small_config, epochs=1)
    first = compare("SASRec,GRU4Rec", "tiny", seeds="5", overrides=overrides, out=out)
    assert len(first["trained"]) == 2
    # Both are RecBole built-ins: no proposed model, so no Improv. row.
    assert (
        "| Improv." not in first["markdown"] and "no baseline or no proposed" in first["markdown"]
    )
    table = compare(
        ["SASRec", "GRU4Rec"],
        "tiny",
        seeds=[5],
        overrides=overrides,
        out=out,
        baselines="GRU4Rec",
        metrics="ndcg@10,hit@10",
    )
    assert table["trained"] == [] and table["metrics"] == ["ndcg@10", "hit@10"]
    assert [row["model"] for row in table["rows"]] == ["GRU4Rec", "SASRec"]
    assert "Improv. SASRec" in table["markdown"] and "hit@20" not in table["markdown"]
    # One seed: no paired test.
    assert table["rows"][1]["ndcg@10_p_value"] is None
    assert "| p (paired t) SASRec |  | n/a | n/a |" in table["markdown"]
    # One seed: values without a spread.
    row_text = next(line for line in table["markdown"].splitlines() if line.startswith("| SASRec"))
    assert "±" not in row_text and "one seed (5)" in table["markdown"]


def test_a_comparison_prints_its_progress_not_every_runs_log(small_config, tmp_path, capsys):
    # Four one-epoch runs printed 747 lines, every run's config dump among them.
    # A process of its own: pytest's log capture would stand between the runs and their
    # log files.
    import subprocess
    import sys

    out = tmp_path / "cmp"
    argv = ["--compare", "SASRec,GRU4Rec", "--dataset=tiny", "--seeds", "1", "--out", str(out)]
    done = subprocess.run(
        [sys.executable, "-m", "recbole_freq", *argv,
         *cli_args(overrides_of(small_config, epochs=1, state="INFO"))],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    terminal = done.stdout + done.stderr
    assert done.returncode == 0, terminal[-2000:]
    assert "General Hyper Parameters" not in terminal and len(terminal.splitlines()) < 40
    run = json.loads(next((out / "runs").glob("SASRec-*.json")).read_text())
    assert "General Hyper Parameters" in Path(run["summary"]["log_file"]).read_text()


def test_the_users_own_metrics_reach_the_table(small_config, tmp_path):
    # metrics: [Hit, NDCG, Recall, MRR] in the user's settings: the table showed Hit and
    # NDCG only unless --metrics repeated the others.
    overrides = overrides_of(
        small_config,
        epochs=1,
        metrics=["Hit", "NDCG", "Recall", "MRR"],
        topk=[5, 10],
        valid_metric="NDCG@10",
    )
    table = compare("SASRec", "tiny", seeds="5", overrides=overrides, out=tmp_path / "cmp")
    assert table["metrics"] == [
        "hit@5", "hit@10", "ndcg@5", "ndcg@10", "recall@5", "recall@10", "mrr@5", "mrr@10",
    ]  # fmt: skip
    assert "mrr@10" in table["markdown"] and table["rows"][0]["mrr@10_mean"] is not None


def test_extra_test_modes_become_mode_prefixed_columns(small_config, tmp_path):
    out = tmp_path / "cmp"
    overrides = overrides_of(small_config, epochs=1, extra_test_modes=["uni100"])
    table = compare("BSARec,SASRec", "wide", seeds="5", overrides=overrides, out=out)
    assert table["metrics"] == [*METRICS, "uni100:hit@10", "uni100:ndcg@10"]
    runs = {
        m: json.loads((out / "runs" / f"{m}-seed5.json").read_text())["summary"]
        for m in ("BSARec", "SASRec")
    }
    for row in table["rows"]:
        sampled = runs[row["model"]]["extra_test_results"]["uni100"]
        assert row["uni100:hit@10_mean"] == sampled["hit@10"]
        assert row["uni100:ndcg@10_mean"] == sampled["ndcg@10"]
        assert row["hit@10_mean"] == runs[row["model"]]["test_result"]["hit@10"]
    assert "uni100:hit@10" in table["markdown"] and "extra test mode(s) uni100" in table["markdown"]
    with open(out / "runs.csv", newline="") as handle:
        header = next(csv.reader(handle))
    assert "uni100:ndcg@10" in header

    again = compare(
        "BSARec,SASRec", "wide", seeds="5", overrides=overrides, out=out,
        metrics="uni100:ndcg@20,ndcg@20",
    )  # fmt: skip
    assert again["trained"] == [] and again["metrics"] == ["uni100:ndcg@20", "ndcg@20"]
    with pytest.raises(ComparisonError, match="pop50:hit@10 are not evaluated"):
        compare(
            "BSARec,SASRec", "wide", seeds="5", overrides=overrides, out=out,
            metrics="pop50:hit@10",
        )  # fmt: skip


BAD_COMPARISONS = [
    (["--compare", "BSARec,NoSuchModel"], "unknown model 'NoSuchModel'"),
    (["--compare", "BSARec,BSARec"], "lists an entry twice"),
    (["--compare", "BSARec,SASRec", "--seeds", "1,x"], "seed 'x' is not an integer"),
    (["--compare", "BSARec,SASRec", "--seed=3"], "--seed cannot be an override"),
    (["--compare", "BSARec", "--baselines", "SASRec"], "baseline(s) SASRec are not among"),
    (["--compare", "BSARec", "--metrics", "mrr@10"], "mrr@10 are not evaluated"),
    (["--compare", "BSARec", "--dataset=not-there"], "dataset 'not-there' is not prepared"),
    (["--compare", "BSARec", "--cpus_per_run", "2"], "need --ray"),
    (["--compare", "BSARec", "--ray", "--nproc=2"], "nproc and world_size (data-parallel"),
    (["--compare", "BSARec", "--world_size=2", "--ip=127.0.0.1", "--port=29999"], "spans machines"),
]


@pytest.mark.parametrize("args,message", BAD_COMPARISONS, ids=[m for _, m in BAD_COMPARISONS])
def test_bad_comparison_input_is_a_clear_error_before_training(
    small_config, tmp_path, capsys, args, message
):
    base = ["--dataset=tiny"] if not any(a.startswith("--dataset") for a in args) else []
    code = main(
        [*args, *base, "--out", str(tmp_path / "cmp"), *cli_args(overrides_of(small_config))]
    )
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "cmp").exists()


def test_paired_test_is_undefined_without_seeds_or_variance():
    assert paired_p_value([0.3], [0.2]) is None
    # A constant difference: scipy reports p = 0, which is no evidence.
    assert paired_p_value([0.3, 0.4, 0.5], [0.2, 0.3, 0.4]) is None
    assert paired_p_value([0.2, 0.3], [0.2, 0.3]) is None
    values, reference = [0.31, 0.35, 0.30], [0.30, 0.31, 0.29]
    assert paired_p_value(values, reference) == pytest.approx(ttest_rel(values, reference).pvalue)


def test_improvement_is_positive_when_better():
    assert improvement(0.11, 0.10) == pytest.approx(10.0)
    assert improvement(0.09, 0.10) == pytest.approx(-10.0)
    assert improvement(90.0, 100.0, smaller_better=True) == pytest.approx(10.0)
    assert improvement(0.1, 0.0) is None


def fake_record(model, seed, ndcg, hit, parameters=100):
    return {
        "summary": {
            "model": model,
            "seed": seed,
            "test_result": {"ndcg@10": ndcg, "hit@10": hit},
            "train_seconds_per_epoch": 1.0 + seed,
            "epochs_run": 3,
            "parameters": parameters,
        }
    }


def test_best_baseline_is_chosen_per_metric():
    records = {}
    for seed, offset in ((1, 0.0), (2, 0.01), (3, 0.03)):
        records[("A", seed)] = fake_record("A", seed, 0.20 + offset, 0.50 + offset)
        records[("B", seed)] = fake_record("B", seed, 0.25 + offset, 0.40 + offset)
        records[("P", seed)] = fake_record("P", seed, 0.30 + offset * 2, 0.45 + offset)
    rows = summarise(records, ["A", "B", "P"], [1, 2, 3], ["ndcg@10", "hit@10"], {"A", "B"})
    proposed = rows[2]
    assert proposed["ndcg@10_best_baseline"] == "B" and proposed["hit@10_best_baseline"] == "A"
    assert proposed["ndcg@10_improv_pct"] == pytest.approx((0.3267 - 0.2633) / 0.2633 * 100, 1e-2)
    assert proposed["hit@10_improv_pct"] == pytest.approx((0.46333 - 0.51333) / 0.51333 * 100, 1e-3)
    assert proposed["ndcg@10_p_value"] == pytest.approx(
        ttest_rel([0.30, 0.32, 0.36], [0.25, 0.26, 0.28]).pvalue
    )
    assert proposed["hit@10_p_value"] is None  # constant difference across seeds
    assert rows[0]["ndcg@10_std"] == pytest.approx(0.01528, rel=1e-3)
    markdown = markdown_table(rows, ["ndcg@10", "hit@10"], "toy", [1, 2, 3])
    assert "| Improv. P |  | +24.05% | -9.74% |" in markdown
    assert "**0.3267 ± 0.0306**" in markdown
    assert "Best baseline: ndcg@10 B, hit@10 A." in markdown


def test_ray_mode_runs_the_trials_as_tasks_with_the_same_results(small_config, tmp_path):
    """A two-dataset grid as Ray tasks gives each run the numbers it gets in this
    process (the same thread count: the task's CPUs)."""
    pytest.importorskip("ray")
    threads = min(2, os.cpu_count() or 1)
    overrides = overrides_of(small_config, epochs=1)
    on_ray = compare(
        "SASRec",
        "tiny,wide",
        seeds=[3],
        overrides=overrides,
        out=tmp_path / "ray",
        # One worker process runs the tasks: a single torch/RecBole import keeps it fast.
        execution=Execution(ray=True, cpus_per_run=float(threads)),
    )
    grid = [(dataset, "SASRec", 3) for dataset in ("tiny", "wide")]
    assert sorted(on_ray["trained"]) == grid
    compare(
        "SASRec", "tiny,wide", seeds=[3], overrides=dict(overrides, torch_threads=threads),
        out=tmp_path / "local",
    )  # fmt: skip
    for dataset, _, seed in grid:
        stored = [
            json.loads(
                (tmp_path / where / dataset / "runs" / f"SASRec-seed{seed}.json").read_text()
            )
            for where in ("ray", "local")
        ]
        # Seeded runs are reproducible wherever they run.
        assert stored[0]["summary"]["test_result"] == stored[1]["summary"]["test_result"]
    assert (tmp_path / "ray" / "grid.csv").read_text() == (
        tmp_path / "local" / "grid.csv"
    ).read_text()


def test_ray_tasks_larger_than_a_local_instance_are_refused(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(ComparisonError, match="cpus_per_run=4 but the Ray cluster has 2 CPU"):
        _check_ray_resources({"CPU": 2.0}, Execution(cpus_per_run=4.0), True, print)
    with pytest.raises(ComparisonError, match="gpus_per_run=1 but the Ray cluster has 0 GPU"):
        _check_ray_resources({"CPU": 2.0}, Execution(gpus_per_run=1.0), True, print)
    warnings = []
    options = Execution(ray=True, cpus_per_run=4.0, ray_address="ray://head:10001")
    _check_ray_resources({"CPU": 2.0}, options, True, warnings.append)
    assert warnings and "unless the cluster grows" in warnings[0]


def test_protocols_side_by_side_and_mixed_protocols_refused(small_config, tmp_path):
    """``--protocols`` trains every model under each protocol: one table per protocol and
    a side-by-side one; runs of different protocols never share a table silently."""
    out = tmp_path / "protocols"
    overrides = overrides_of(small_config, epochs=1)
    result = compare(
        "BSARec,SASRec", "tiny", seeds="5", overrides=overrides, out=out,
        protocols="recbole,bsarec",
    )  # fmt: skip
    assert sorted(p.name for p in (out / "runs").glob("*.json")) == [
        "BSARec@bsarec-seed5.json",
        "BSARec@recbole-seed5.json",
        "SASRec@bsarec-seed5.json",
        "SASRec@recbole-seed5.json",
    ]
    rows = {(row["model"], row["protocol"]): row for row in result["rows"]}
    assert set(rows) == {(m, p) for m in ("BSARec", "SASRec") for p in ("recbole", "bsarec")}
    # Each protocol's Improv. row compares with the baseline of the same protocol.
    for protocol in ("recbole", "bsarec"):
        stored = json.loads((out / "runs" / f"SASRec@{protocol}-seed5.json").read_text())
        assert stored["summary"]["protocol"]["label"] == protocol
        proposed = rows[("BSARec", protocol)]
        baseline = stored["summary"]["test_result"]["ndcg@10"]
        assert proposed["ndcg@10_improv_pct"] == pytest.approx(
            improvement(proposed["ndcg@10_mean"], baseline)
        )
    markdown = result["markdown"]
    assert markdown.startswith("## Protocols side by side")
    assert "| Model | hit@5 recbole | hit@5 bsarec |" in markdown
    assert "## Protocol bsarec" in markdown and "Protocol bsarec (docs/protocols.md)" in markdown

    # Two folders of one protocol each, merged into one: refused, then allowed when asked.
    mixed = tmp_path / "mixed"
    for protocol, model in (("recbole", "SASRec"), ("bsarec", "BSARec")):
        source = out / "runs" / f"{model}@{protocol}-seed5.json"
        record = json.loads(source.read_text())
        record["settings"].pop("protocols")
        record["model"] = model  # as a one-protocol comparison stores it
        record["digest"] = record_digest(record)  # edited here, sealed again
        (mixed / "runs").mkdir(parents=True, exist_ok=True)
        (mixed / "runs" / f"{model}-seed5.json").write_text(json.dumps(record))
    with pytest.raises(ComparisonError, match="different protocols.*BSARec: bsarec.*--mixed"):
        compare("BSARec,SASRec", "tiny", seeds="5", overrides=overrides, out=mixed)
    table = compare(
        "BSARec,SASRec", "tiny", seeds="5", overrides=overrides, out=mixed, mixed_protocols=True
    )
    assert "BSARec [bsarec]" in table["markdown"] and "Mixed protocols" in table["markdown"]
    with pytest.raises(ComparisonError, match="give the protocol once"):
        compare("SASRec", "tiny", seeds="5", overrides=dict(overrides, protocol="bsarec"),
                out=tmp_path / "x", protocols="recbole")  # fmt: skip


def test_paper_settings_per_model_and_the_protocol_they_name(small_config, tmp_path):
    """``--paper`` gives each model that has paper settings for the dataset its own (BSARec
    Table 6 on lastfm), leaves the others at their defaults, and runs all under the
    protocol the paper files name."""
    from conftest import write_sequences
    from dataset_prep import convert_one_line

    root = tmp_path / "data"
    root.mkdir()
    raw = write_sequences(root / "lastfm.txt", n_items=150)  # uni100 needs over 100 items
    convert_one_line(raw, root, "lastfm", show_progress=False, check=False)
    overrides = overrides_of(small_config, epochs=1, data_path=str(root))
    overrides.pop("n_heads")  # an override would win over the paper file
    result = compare(
        "BSARec,SASRec", "lastfm", seeds="5", overrides=overrides, out=tmp_path / "p", paper=True
    )
    runs = {
        model: json.loads((tmp_path / "p" / "runs" / f"{model}-seed5.json").read_text())["summary"]
        for model in ("BSARec", "SASRec")
    }
    assert (runs["BSARec"]["config"]["alpha"], runs["BSARec"]["config"]["n_heads"]) == (0.9, 1)
    # SASRec has BSARec Table 2's settings too: the authors' BCE, 2 heads.
    assert runs["SASRec"]["config"]["n_heads"] == 2
    assert runs["BSARec"]["protocol"]["label"] == "bsarec"
    assert runs["SASRec"]["protocol"]["label"] == "bsarec+train_loss=bce"
    assert (
        "Protocol bsarec (docs/protocols.md), each model with its own training loss"
        in (result["markdown"])
    )
    with pytest.raises(ComparisonError, match="none of SASRec has paper settings"):
        compare("SASRec", "tiny", seeds="5", overrides=overrides, out=tmp_path / "q", paper=True)


def test_paper_files_of_different_protocols_run_mixed_only_when_asked(small_config, tmp_path):
    """BSARec's paper file names bsarec, RecDenoiser's sasrec: without a protocol the
    refusal names both ways out; with --mixed_protocols each runs under its own."""
    from conftest import write_sequences
    from dataset_prep import convert_one_line

    root = tmp_path / "data"
    root.mkdir()
    raw = write_sequences(root / "lastfm.txt", n_items=150)  # uni100 needs over 100 items
    convert_one_line(raw, root, "lastfm", show_progress=False, check=False)
    overrides = overrides_of(small_config, epochs=1, data_path=str(root))
    models = "BSARec,RecDenoiser"
    with pytest.raises(ComparisonError, match="choose one with --protocol, or add --mixed_prot"):
        compare(models, "lastfm", seeds="5", overrides=overrides, out=tmp_path / "p", paper=True)
    result = compare(
        models, "lastfm", seeds="5", overrides=overrides, out=tmp_path / "p", paper=True,
        mixed_protocols=True,
    )  # fmt: skip
    labels = {row["model"]: row["protocol"].split("+")[0] for row in result["rows"]}
    assert labels == {"BSARec": "bsarec", "RecDenoiser": "sasrec"}
    assert "Mixed protocols" in result["markdown"]


def test_paper_gives_a_denoisers_backbone_the_same_settings(small_config, tmp_path):
    """With ``--paper``, SASRec beside RecDenoiser gets every setting of RecDenoiser's paper
    file but the denoiser's own (not its own BSARec Table 2 file), so the pair differs only
    in the denoiser; a model that is no denoiser's backbone and has no paper file keeps its
    defaults, and one whose paper file names another protocol is refused."""
    from conftest import write_sequences
    from dataset_prep import convert_one_line

    root = tmp_path / "data"
    root.mkdir()
    raw = write_sequences(root / "lastfm.txt", n_items=150)  # uni100 needs over 100 items
    convert_one_line(raw, root, "lastfm", show_progress=False, check=False)
    overrides = overrides_of(small_config, epochs=1, data_path=str(root))
    for key in ("hidden_size", "inner_size", "MAX_ITEM_LIST_LENGTH", "train_batch_size"):
        overrides.pop(key)  # an override would win over the paper file
    out = tmp_path / "p"
    with pytest.raises(ComparisonError, match=r"different protocols \(bsarec, sasrec\)"):
        compare("RecDenoiser,SASRec,GRU4Rec", "lastfm", seeds="5", overrides=overrides, out=out,
                paper=True)  # fmt: skip
    result = compare(
        "RecDenoiser,SASRec,SSEPT", "lastfm", seeds="5", overrides=overrides, out=out,
        paper=True,
    )  # fmt: skip
    configs = {
        model: json.loads((out / "runs" / f"{model}-seed5.json").read_text())["summary"]["config"]
        for model in ("RecDenoiser", "SASRec", "SSEPT")
    }
    shared = ("hidden_size", "inner_size", "hidden_act", "hidden_dropout_prob",
              "MAX_ITEM_LIST_LENGTH", "train_batch_size", "layer_norm_eps")  # fmt: skip
    assert [configs["SASRec"][k] for k in shared] == [configs["RecDenoiser"][k] for k in shared]
    assert (configs["SASRec"]["hidden_size"], configs["SASRec"]["hidden_act"]) == (50, "relu")
    assert configs["SASRec"].get("sparsity_beta") is None  # not the denoiser's settings
    assert configs["SSEPT"]["hidden_size"] == 100  # its own default
    assert "Protocol sasrec" in result["markdown"]
    settings = json.loads((out / "runs" / "SSEPT-seed5.json").read_text())["settings"]
    assert set(settings["paper_references"]) == {"SASRec"}


def test_multiple_testing_corrections():
    from recbole_freq.jobs.compare.statistics import adjust_p_values

    raw = {"a": 0.01, "b": 0.04, "c": 0.03, "d": None}
    holm = adjust_p_values(raw, "holm")
    assert holm == pytest.approx({"a": 0.03, "b": 0.06, "c": 0.06, "d": None})
    bh = adjust_p_values(raw, "bh")
    assert bh == pytest.approx({"a": 0.03, "b": 0.04, "c": 0.04, "d": None})


def test_per_user_significance_against_the_best_baseline(small_config, tmp_path):
    """Beside the across-seed t-test, each proposed model is tested against the best
    baseline per user: paired Wilcoxon and t on per-user values, Holm across the table."""
    from scipy.stats import wilcoxon

    from recbole_freq.jobs.compare.statistics import adjust_p_values, per_user_values

    out = tmp_path / "users"
    overrides = overrides_of(small_config, epochs=1)
    result = compare("BSARec,SASRec", "tiny", seeds="5,6", overrides=overrides, out=out)
    bsarec = next(row for row in result["rows"] if row["model"] == "BSARec")
    summaries = {
        m: [json.loads(run_path.read_text())["summary"] for run_path in sorted((out / "runs").glob(f"{m}-*.json"))]
        for m in ("BSARec", "SASRec")
    }  # fmt: skip
    raw = {}
    for metric in METRICS:
        ours = per_user_values(summaries["BSARec"], metric)[1]
        theirs = per_user_values(summaries["SASRec"], metric)[1]
        raw[metric] = None if (ours == theirs).all() else float(wilcoxon(ours, theirs).pvalue)
    expected = adjust_p_values(raw, "holm")
    for metric in METRICS:
        assert bsarec[f"{metric}_p_wilcoxon_users"] == pytest.approx(expected[metric])
    assert "p (Wilcoxon, users, holm) BSARec" in result["markdown"]
    assert "Holm-corrected" in result["markdown"]


def test_published_figures_sit_beside_a_table_of_their_protocol_only():
    """``properties/reference/`` figures (the paper, the authors' code run here) are shown
    for a table of exactly their protocol, model pieces aside, and each row says how far
    ours is from them."""
    from recbole_freq.jobs.compare.tables import published_figures, published_section

    figures = published_figures("lastfm", ["bsarec", "bsarec+train_loss=bce"])
    # Table 2, the authors' code here, Table 7 (ablations), the FBSARec thesis, WEARec's
    # and TV-Rec's released logs
    assert [figure["name"] for figure in figures] == [
        "paper",
        "authors' code here",
        "paper, Table 7",
        "thesis",
        "authors' log, WEARec",
        "authors' log, TV-Rec",
    ]
    assert published_figures("lastfm", ["bsarec+sequence_layout=right"]) == []
    assert published_figures("lastfm", ["bsarec", "recbole"]) == []
    assert published_figures("tiny", ["bsarec"]) == []
    metrics = ["hit@10", "hit@20"]
    rows = [
        {"model": "SASRec", "hit@10_mean": 0.0633, "hit@20_mean": 0.1},
        {"model": "Unpublished", "hit@10_mean": 0.5, "hit@20_mean": 0.5},
    ]
    section = published_section(rows, metrics, figures, seeds=[1, 2])
    lines = section.splitlines()
    assert "| SASRec (paper) | 0.0633 | 0.0927 |" in lines
    assert "| difference from paper | +0.0% | +7.9% |" in lines
    assert "| SASRec (authors' code here) | n/a | 0.0853 |" in lines
    assert "| difference from authors' code here |  | +17.2% |" in lines
    assert "Unpublished" not in section and "mean of 2 seeds" in section
    assert published_section(rows[1:], metrics, figures, seeds=[1]) == ""


def test_every_reference_file_holds_plain_figures():
    import yaml

    from recbole_freq.config.configurator import properties_dir
    from recbole_freq.protocol import protocol_names

    files = sorted((properties_dir() / "reference").glob("*.yaml"))
    assert files
    for path in files:
        for protocol, figures in yaml.safe_load(path.read_text()).items():
            assert protocol in protocol_names(), path
            assert len({figure["name"] for figure in figures}) == len(figures)
            for figure in figures:
                assert figure["source"]
                for model, values in figure["rows"].items():
                    assert set(values) <= {
                        f"{m}@{k}" for m in ("hit", "ndcg") for k in (5, 10, 20)
                    }, (path, model)
                    assert all(0.0 < value < 1.0 for value in values.values()), (path, model)


@pytest.fixture
def one_stored_run(small_config, tmp_path):
    """A comparison folder holding one finished SASRec run, and a way to compare again."""
    out = tmp_path / "cmp"
    overrides = overrides_of(small_config, epochs=1)

    def again():
        return compare("SASRec", "tiny", seeds="5", overrides=overrides, out=out)

    again()
    return out / "runs" / "SASRec-seed5.json", again


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda r: r["summary"]["test_result"].update({"ndcg@10": 0.99}), "was changed after"),
        (lambda r: r["summary"]["test_result"].update({"ndcg@10": float("nan")}), "was changed"),
    ],
)
def test_a_hand_edited_run_file_is_refused_not_tabulated(one_stored_run, edit, message):
    path, again = one_stored_run
    record = json.loads(path.read_text())
    edit(record)
    path.write_text(json.dumps(record))
    with pytest.raises(ComparisonError, match=message):
        again()


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            lambda r: r["summary"]["test_result"].update({"ndcg@10": "abc"}),
            "is 'abc', not a number",
        ),
        (lambda r: r["summary"]["test_result"].update({"hit@5": float("inf")}), "not a finite"),
        (lambda r: r["summary"].pop("test_result"), "it holds no test_result"),
        (lambda r: r.update(summary=[1, 2]), "is not a comparison run file"),
    ],
)
def test_a_run_file_whose_values_cannot_be_metrics_is_refused(one_stored_run, edit, message):
    path, again = one_stored_run
    record = json.loads(path.read_text())
    edit(record)
    record["digest"] = record_digest(record)  # the values are checked, whatever the digest
    path.write_text(json.dumps(record))
    with pytest.raises(ComparisonError, match=message):
        again()


def test_two_comparisons_into_one_folder_at_once_are_refused(one_stored_run):
    from recbole_freq.jobs.compare.runs import lock_out_dir

    path, again = one_stored_run
    held = lock_out_dir(path.parent.parent)  # as a comparison running in another process
    try:
        with pytest.raises(ComparisonError, match="another comparison is writing"):
            again()
    finally:
        held.release()
    assert again()["trained"] == []


def test_a_run_capped_by_its_epochs_is_marked_beside_the_papers_figure():
    """Issue 69: runs stopped by --epochs before early stopping stood beside the paper's
    figures ("-38.7% from paper") with only a note; now the row says not comparable."""
    from recbole_freq.jobs.compare.tables import published_section, summarise

    def record(epochs_run, best_epoch):
        return {"summary": {
            "test_result": {"ndcg@10": 0.03}, "train_seconds_per_epoch": 1.0,
            "epochs_run": epochs_run, "best_epoch": best_epoch, "parameters": 10,
            "config": {"epochs": 20, "stopping_step": 10},
        }}  # fmt: skip

    records = {("SASRec", 1): record(20, 19), ("BSARec", 1): record(15, 4)}
    rows = summarise(records, ["SASRec", "BSARec"], [1], ["ndcg@10"], ["SASRec"])
    assert [row["capped_runs"] for row in rows] == [1, 0]  # BSARec stopped early at 15
    figures = [{"name": "paper", "source": "Table 2",
                "rows": {"SASRec": {"ndcg@10": 0.05}, "BSARec": {"ndcg@10": 0.05}}}]  # fmt: skip
    section = published_section(rows, ["ndcg@10"], figures, [1])
    assert "| SASRec (ours †) |" in section and "| BSARec (ours) |" in section
    assert section.count("(not comparable: †)") == 1 and "not comparable" in section.split("\n")[1]
