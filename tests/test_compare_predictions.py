"""scripts/compare_predictions.py: two models' --dump files compared sample by sample. The statistics on
hand-computed examples; the command on real eval.sh dumps of a real (tiny) checkpoint; its errors."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from evaluation.paired import compare_paired, mcnemar_exact
from evaluation.prediction_dump import DUMP_COLUMNS
from tests.conftest import run_command

# The statistics --------------------------------------------------------------------------------------


def test_mcnemar_exact_on_hand_computed_counts():
    # 10 words read by the first model alone, 2 by the second: 2 * P(X <= 2), X ~ Binomial(12, 1/2).
    assert mcnemar_exact(10, 2) == pytest.approx(2 * (1 + 12 + 66) / 4096, rel=1e-12)
    assert mcnemar_exact(2, 10) == mcnemar_exact(10, 2)
    assert mcnemar_exact(6, 0) == pytest.approx(2 / 64, rel=1e-12)
    assert mcnemar_exact(0, 0) == 1.0 and mcnemar_exact(5, 5) == 1.0  # no evidence either way
    # Thousands of discordant words: exact integers, no overflow. The value is scipy's
    # (scipy.stats.binomtest(900, 2000, 0.5).pvalue, scipy 1.17).
    assert mcnemar_exact(1100, 900) == pytest.approx(8.45708953550381e-06, rel=1e-9)


def test_paired_comparison_counts_only_the_words_one_model_alone_reads():
    first = [True] * 50 + [True] * 8 + [False] * 3 + [False] * 39
    second = [True] * 50 + [False] * 8 + [True] * 3 + [False] * 39
    comparison = compare_paired(first, second)
    assert (comparison.samples, comparison.first_correct, comparison.second_correct) == (100, 58, 53)
    assert (comparison.first_only, comparison.second_only) == (8, 3)
    assert comparison.first_accuracy == 58.0 and comparison.second_accuracy == 53.0
    assert comparison.difference == pytest.approx(-5.0)
    # Var = (8 + 3 - 5**2 / 100) / 100**2; half width 1.96 * sqrt(Var) in points.
    half = 100 * 1.959963984540054 * math.sqrt((11 - 0.25) / 10_000)
    low, high = comparison.interval
    assert (low, high) == (pytest.approx(-5.0 - half), pytest.approx(-5.0 + half))
    assert comparison.p_value == pytest.approx(mcnemar_exact(8, 3))
    with pytest.raises(ValueError, match="read 3 and 2 samples"):
        compare_paired([True, False, True], [True, False])


# The command -----------------------------------------------------------------------------------------


def compare(*args: object) -> subprocess.CompletedProcess:
    return run_command(sys.executable, "scripts/compare_predictions.py", *args, timeout=120)


@pytest.fixture(scope="module")
def dump(checkpoint, synth, tmp_path_factory) -> Path:
    """A real eval.sh --dump of the tiny run's best.pt on the synthetic val and test sets."""
    path = tmp_path_factory.mktemp("compare") / "model.tsv"
    eval_sh = ("bash", "scripts/eval.sh", checkpoint, synth / "val", synth / "test")
    run_command(
        *eval_sh, "--dump", path, "--workers", "0", "--precision", "fp32", env={"PYTHON": sys.executable}, check=True
    )
    return path


def read_rows(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8", newline="") as file:
        return list(csv.DictReader(file, delimiter="\t"))


def write_rows(path: Path, rows: list[dict[str, str]], columns: tuple[str, ...] = DUMP_COLUMNS) -> Path:
    with path.open("w", encoding="utf-8", newline="") as file:
        writer = csv.DictWriter(file, columns, delimiter="\t", lineterminator="\n", extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return path


def test_a_model_against_itself_differs_by_nothing(dump, tmp_path):
    result = compare(dump, dump, "--json", tmp_path / "same.json")
    assert result.returncode == 0, result.stderr
    record = json.loads((tmp_path / "same.json").read_text())
    sets = record["sets"]
    assert list(sets) == ["val", "test", "all (weighted by words)"]
    rows = read_rows(dump)
    for name in ("val", "test"):
        scored = [row for row in rows if row["set"] == name and row["correct"] != ""]
        right = 100 * sum(row["correct"] == "1" for row in scored) / len(scored)
        assert sets[name]["words"] == len(scored)
        assert sets[name]["first_accuracy"] == sets[name]["second_accuracy"] == pytest.approx(right, abs=1e-4)
    assert sets["all (weighted by words)"]["words"] == sets["val"]["words"] + sets["test"]["words"]
    assert all(entry["difference"] == 0 and entry["p_value"] == 1.0 for entry in sets.values())
    assert "within chance" in result.stdout and "second - first" in result.stdout


def test_a_better_reading_of_some_words_is_found_and_placed(dump, tmp_path):
    """The second file reads 7 more val words right: the command finds exactly those words, in that set,
    and says which model reads more; against 7 others read right instead, it says neither does."""
    rows = read_rows(dump)
    wrong = [(row["set"], row["index"]) for row in rows if row["set"] == "val" and row["correct"] == "0"]
    assert len(wrong) >= 14, "the tiny model should misread at least 14 val words"

    def reading_right(samples: set[tuple[str, str]], name: str) -> Path:
        changed = [{**row, "correct": "1"} if (row["set"], row["index"]) in samples else row for row in rows]
        return write_rows(tmp_path / name, changed)

    better = reading_right(set(wrong[:7]), "better.tsv")
    result = compare(dump, better, "--json", tmp_path / "better.json")
    assert result.returncode == 0, result.stderr
    sets = json.loads((tmp_path / "better.json").read_text())["sets"]
    val = sets["val"]
    assert (val["first_only"], val["second_only"]) == (0, 7)
    assert val["difference"] == pytest.approx(700 / val["words"], abs=1e-4)
    assert val["p_value"] == pytest.approx(2 / 2**7) and val["verdict"] == "second reads more"
    low, high = val["interval_95"]
    assert 0 < low < val["difference"] < high
    assert sets["test"]["difference"] == 0 and sets["test"]["verdict"] == "within chance"
    assert "second reads more" in result.stdout
    # Against a file that reads 7 other words right instead: as many each way, within chance.
    result = compare(reading_right(set(wrong[7:14]), "other.tsv"), better, "--json", tmp_path / "other.json")
    val = json.loads((tmp_path / "other.json").read_text())["sets"]["val"]
    assert (val["first_only"], val["second_only"], val["p_value"], val["difference"]) == (7, 7, 1.0, 0)


def test_files_that_do_not_hold_the_same_samples_are_refused(dump, tmp_path):
    rows = read_rows(dump)

    def refused(second: Path, message: str) -> None:
        result = compare(dump, second)
        assert result.returncode == 1, result.stdout
        assert result.stderr.startswith("error: ") and message in result.stderr, result.stderr
        assert "Traceback" not in result.stderr

    refused(write_rows(tmp_path / "one_set.tsv", [row for row in rows if row["set"] == "val"]), "on the same LMDBs")
    missing = rows[:3] + rows[4:]
    refused(write_rows(tmp_path / "missing.tsv", missing), f"sample {rows[3]['index']} is in {dump} only")
    relabelled = [dict(row) for row in rows]
    label = rows[0]["label"]
    relabelled[0]["label"] = ("b" if label[0] == "a" else "a") + label[1:]  # one letter changed
    refused(write_rows(tmp_path / "relabelled.tsv", relabelled), f"sample {rows[0]['index']}: labelled")
    # A model writes a label as it compares it: in capitals here, with a mark there that the other's alphabet
    # lacks, or without a letter its own alphabet lacks. Still one label.
    others = [{**row, "label": row["label"].upper() + "!"} for row in rows]
    others[1]["label"] = others[1]["label"][1:]
    assert compare(dump, write_rows(tmp_path / "others.tsv", others)).returncode == 0
    swapped = [dict(row) for row in rows]
    swapped[0]["label"], swapped[1]["label"] = rows[1]["label"], rows[0]["label"]
    assert rows[0]["label"] != rows[1]["label"]
    refused(write_rows(tmp_path / "swapped.tsv", swapped), f"sample {rows[0]['index']}: labelled")
    refused(write_rows(tmp_path / "header.tsv", rows, ("set", "index", "label", "prediction")), "no correct column")
    bad = [dict(row) for row in rows]
    bad[1]["correct"] = "yes"
    refused(write_rows(tmp_path / "bad.tsv", bad), "line 3: index")
    refused(write_rows(tmp_path / "twice.tsv", rows + rows[:1]), f"index {rows[0]['index']} is in the file twice")
    refused(tmp_path / "absent.tsv", "absent.tsv: no such file; write one with scripts/eval.sh")
    result = compare(dump, dump, "--json", tmp_path / "out.txt")
    assert result.returncode == 1 and "give a path ending in .json" in result.stderr


def test_files_scored_under_different_metric_modes_are_refused(dump, tmp_path):
    """`correct` means what the file's --metric-mode made it mean: two modes compare nothing."""
    rows = read_rows(dump)
    assert {row["metric_mode"] for row in rows} == {"benchmark"}  # eval.sh's default, on every line
    exact = write_rows(tmp_path / "exact.tsv", [{**row, "metric_mode": "exact"} for row in rows])
    result = compare(dump, exact)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert f"{dump} was scored under --metric-mode benchmark and {exact} under exact" in result.stderr
    mixed = write_rows(tmp_path / "mixed.tsv", [rows[0], {**rows[1], "metric_mode": "exact"}, *rows[2:]])
    result = compare(dump, mixed)
    assert result.returncode == 1 and "line 3: metric modes benchmark and exact in one file" in result.stderr
    # A file written before the mode was recorded has no such column: compared as it is.
    unrecorded = write_rows(tmp_path / "unrecorded.tsv", rows, DUMP_COLUMNS[:-1])
    assert compare(dump, unrecorded).returncode == 0
