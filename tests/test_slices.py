"""eval.sh --slices: the slicings and the confusion alignment of evaluation/slices.py on hand-made samples,
then the command on real LMDBs and a real (tiny) checkpoint, with one process and two."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest
from PIL import Image

from data.lmdb_writer import write_lmdb
from evaluation.slices import (
    SLICINGS,
    TOP_CONFUSIONS,
    SliceSample,
    case_slice,
    confusions,
    format_slices,
    length_slice,
    shape_slice,
    slice_report,
    symbol_slice,
)
from tests.conftest import ALPHABET, read_lmdb, run_command

# The slicings and the alignment on hand-made samples ----------------------------------------------


def test_each_length_and_shape_falls_in_its_slice_at_the_bounds():
    lengths = {1: "1-3", 3: "1-3", 4: "4-6", 6: "4-6", 7: "7-10", 10: "7-10", 11: "11+", 40: "11+"}
    assert {length: length_slice(length) for length in lengths} == lengths
    shapes = {
        (19, 20): "tall (w/h < 1)",
        (20, 20): "square-ish (1-1.5)",
        (29, 20): "square-ish (1-1.5)",
        (30, 20): "wide (1.5-6)",
        (119, 20): "wide (1.5-6)",
        (120, 20): "very wide (>= 6)",
    }
    assert {size: shape_slice(*size) for size in shapes} == shapes


def test_case_and_symbols_of_the_raw_label():
    cases = {"abc": "lower", "ABC": "upper", "É1": "upper", "Abc": "mixed", "123!": "no letters", "中文": "no letters"}
    assert {label: case_slice(label) for label in cases} == cases
    symbols = {"abc123": False, "ABC": False, "a-b": True, "a b": True, "café": True}
    assert {label: symbol_slice(label) == "with symbols" for label in symbols} == symbols


def test_confusions_align_substitutions_deletions_and_insertions():
    assert confusions("hello", "hallo") == [("e", "a")]
    assert confusions("cat", "ct") == [("a", "")]
    assert confusions("ct", "cat") == [("", "a")]
    assert confusions("word", "word") == []
    assert confusions("ab", "") == [("a", ""), ("b", "")]
    assert confusions("rn", "m") == [("r", ""), ("n", "m")]  # a deletion and a substitution, not three edits


def sample(label: str, reading: str, width: int = 100, height: int = 32, raw_label: str | None = None) -> SliceSample:
    return SliceSample(label, label if raw_label is None else raw_label, reading, width, height)


def test_slice_report_counts_and_accuracy_under_the_metric_mode():
    samples = [
        sample("Hello", "hello"),  # right under benchmark: case is not compared
        sample("hello", "hallo", width=20, height=32),
        sample("cat", "ct"),
        sample("cat", "cat"),
        sample("A-B-C-D", "abcd"),  # length 4 once benchmark deletes the symbols
        sample("!!", "x"),  # empty under benchmark: left out, as the table leaves it out
        sample("cat", "ct", raw_label="Cat!"),  # raw label: the LMDB's, before normalisation
    ]
    report = slice_report(samples, "benchmark", ALPHABET)
    assert report["label_length"] == {
        "1-3": {"samples": 3, "correct": 1, "accuracy": 1 / 3},
        "4-6": {"samples": 3, "correct": 2, "accuracy": 2 / 3},
        "7-10": {"samples": 0, "correct": 0, "accuracy": None},
        "11+": {"samples": 0, "correct": 0, "accuracy": None},
    }
    assert report["crop_shape"]["tall (w/h < 1)"] == {"samples": 1, "correct": 0, "accuracy": 0.0}
    assert report["crop_shape"]["wide (1.5-6)"]["samples"] == 5
    assert {name: entry["samples"] for name, entry in report["label_case"].items()} == {
        "lower": 3,
        "upper": 1,
        "mixed": 2,
        "no letters": 0,
    }
    assert report["label_symbols"]["with symbols"] == {"samples": 2, "correct": 1, "accuracy": 0.5}
    assert report["confusions"] == [
        {"label": "a", "read": "", "count": 2},
        {"label": "e", "read": "a", "count": 1},
    ]
    exact = slice_report(samples, "exact", ALPHABET)
    assert exact["label_length"]["1-3"]["samples"] == 4  # "!!" is scored under exact
    case_only = slice_report([sample("Hello", "hello")], "exact", ALPHABET)["confusions"]
    assert case_only == [{"label": "H", "read": "h", "count": 1}]  # a confusion of exact, none of benchmark


def test_confusions_keep_the_most_frequent_ten():
    samples = [sample("abcdefghijkl", "mnopqrstuvwx")] + [sample("x", "y")] * 3  # 12 substitutions, then x->y
    report = slice_report(samples, "exact", ALPHABET)
    assert len(report["confusions"]) == TOP_CONFUSIONS
    assert report["confusions"][0] == {"label": "x", "read": "y", "count": 3}


def test_an_empty_set_and_an_empty_slice_print_as_such():
    report = slice_report([], "benchmark", ALPHABET)
    assert all(entry["samples"] == 0 for slicing in SLICINGS for entry in report[slicing].values())
    lines = format_slices("empty", report, "benchmark")
    assert lines[0] == "empty: accuracy % by slice under benchmark"
    assert "1-3: 0 samples" in lines[1]
    assert lines[-1].split() == ["confusions", "none"]
    lines = format_slices("one", slice_report([sample("hello", "hallo")], "benchmark", ALPHABET), "benchmark")
    assert "4-6: 0.00 of 1, 7-10: 0 samples" in lines[1]
    assert "'e'->'a' 1" in lines[-1]


# The command ------------------------------------------------------------------------------------


def eval_sh(*args: object, nproc: int = 1) -> str:
    env = {"NPROC": str(nproc), "PYTHON": sys.executable}
    return run_command(
        "bash", "scripts/eval.sh", *args, "--workers", "0", "--precision", "fp32", env=env, check=True
    ).stdout


@pytest.fixture(scope="module")
def varied(synth, tmp_path_factory) -> Path:
    """An LMDB of val images with labels of every case, symbols, one label empty under benchmark, and one
    tall crop."""
    samples = read_lmdb(synth / "val")[:8]
    tall = io.BytesIO()
    Image.new("L", (16, 40), 255).save(tall, format="PNG")
    labels = ["HELLO", "Hello", "a!b", "!!", "1234"]
    rows = [(image, labels[i] if i < len(labels) else label) for i, (image, label) in enumerate(samples)]
    out = tmp_path_factory.mktemp("slices") / "varied"
    write_lmdb(out, [*rows, (tall.getvalue(), "x")])
    return out


@pytest.mark.slow
def test_eval_slices_print_and_json_on_real_sets(checkpoint, synth, varied, tmp_path):
    runs = {}
    for nproc, slices in ((1, True), (2, True), (1, False)):
        out = tmp_path / f"{nproc}{slices}.json"
        options = ("--slices",) if slices else ()
        stdout = eval_sh(checkpoint, synth / "val", varied, "--batch-size", 5, "--json", out, *options, nproc=nproc)
        runs[nproc, slices] = stdout, json.loads(out.read_text())
    stdout, results = runs[1, True]
    rows = [*results["sets"], results["combined"]]
    for name in ("val", "varied", "combined (weighted by samples)"):
        assert f"{name}: accuracy % by slice under benchmark" in stdout
    for row in rows:
        for slicing in SLICINGS:
            assert sum(entry["samples"] for entry in row["slices"][slicing].values()) == row["scored"]
            assert sum(entry["correct"] for entry in row["slices"][slicing].values()) == pytest.approx(
                row["accuracy"] * row["scored"]
            )
    assert results["combined"]["scored"] == 33 + 8  # "!!" is dropped: empty without the symbols the alphabet lacks
    mine = results["sets"][1]["slices"]
    assert mine["crop_shape"]["tall (w/h < 1)"]["samples"] == 1
    assert mine["label_case"]["upper"]["samples"] == 1 and mine["label_case"]["mixed"]["samples"] == 1
    assert mine["label_symbols"]["with symbols"]["samples"] == 1
    # Two processes: the same slices; without --slices: the same run as before the option existed.
    assert [row["slices"] for row in runs[2, True][1]["sets"]] == [row["slices"] for row in results["sets"]]
    assert runs[2, True][1]["combined"]["slices"] == results["combined"]["slices"]
    plain_stdout, plain = runs[1, False]
    assert "by slice" not in plain_stdout
    for row in rows:
        del row["slices"]
    for row in [*plain["sets"], plain["combined"], *results["sets"], results["combined"]]:
        del row["mean_confidence"], row["loss"], row["calibration"]  # float noise between runs (metrics.summarize)
    assert plain == results
