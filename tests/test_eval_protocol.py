"""The evaluation protocol of scripts/eval.sh: metric modes, benchmark names and order, counts of what
was evaluated and dropped, --dump and --errors, and results that depend on neither the batch size nor
the number of processes. Real LMDBs, a real (tiny) checkpoint, real torchrun processes."""

from __future__ import annotations

import csv
import json
import math
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

from data.lmdb_writer import write_lmdb
from data.transforms import build_transform
from evaluation.metrics import compared_form, new_counts, summarize, update_counts
from evaluation.visualize import COLUMNS, IMAGE_BOX, LINE_HEIGHT, PAD
from tests.conftest import ALPHABET, calibration_errors, read_lmdb, run_command
from training.checkpoint import load_model

# Metric modes on hand-made examples ---------------------------------------------------------------


def test_each_mode_compares_what_it_says():
    assert compared_form("Hello, World!", "benchmark", ALPHABET + "! ") == "helloworld"
    assert compared_form("Hello, World!", "exact", ALPHABET) == "Hello, World!"
    assert compared_form("Hello, World!", "ignore_case", ALPHABET) == "hello, world!"
    assert compared_form("Hello, World!", "ignore_case_symbols", ALPHABET) == "helloworld"
    # A symbol (and the space) of the model's own alphabet is something it can read: never dropped.
    assert compared_form("Hello, World!", "ignore_case_symbols", ALPHABET + "! ") == "hello world!"


def test_ignore_case_symbols_keeps_letters_of_any_script():
    cyrillic_cjk = "привет中文"
    assert compared_form("Привет, 中文!", "ignore_case_symbols", cyrillic_cjk) == "привет中文"
    assert compared_form("ÉCOLE-42", "ignore_case_symbols", ALPHABET) == "école42"  # é is a letter, - is not


def test_metrics_under_each_mode_on_hand_computed_examples():
    counts = new_counts()
    update_counts(
        counts,
        ["Hello!", "wOrd", "abd", "中文", ""],
        ["hello", "word", "abcd", "中文!", "xy"],
        alphabet=ALPHABET + "中文",
    )
    exact, ignore_case, symbols = (summarize(counts, mode) for mode in ("exact", "ignore_case", "ignore_case_symbols"))
    # correct: exact none; ignore_case "wOrd"; ignore_case_symbols also "Hello!" and "中文" (! dropped)
    assert [exact["accuracy"], ignore_case["accuracy"], symbols["accuracy"]] == [0 / 5, 1 / 5, 3 / 5]
    assert symbols["accuracy_exact"] == 0 and symbols["accuracy_ignore_case"] == 1 / 5
    # ignore_case_symbols compares hello word abd 中文 "" (14 characters) with hello word abcd 中文 xy (17):
    # every predicted character is matched (LCS 5 + 4 + 3 + 2 + 0), 14 of the label's 17.
    assert symbols["char_precision"] == 14 / 14 and symbols["char_recall"] == 14 / 17
    assert symbols["cer"] == (0 + 0 + 1 + 0 + 2) / 17
    assert symbols["one_minus_ned"] == pytest.approx((1 + 1 + 0.75 + 1 + 0) / 5, abs=1e-9)
    # exact: Hello!/hello 2 edits, wOrd/word 1, abd/abcd 1, 中文/中文! 1, ""/xy 2
    assert exact["cer"] == (2 + 1 + 1 + 1 + 2) / 18
    assert exact["char_precision"] == (4 + 3 + 3 + 2) / (6 + 4 + 3 + 2)


def test_benchmark_mode_scores_a_symbol_emitting_model_as_dtrb_and_parseq_do():
    """Expected values written by hand from the peers' rule (deep-text-recognition-benchmark test.py, parseq
    CharsetAdapter): lowercase both, delete every character outside [0-9a-z] from both, exact match; a label
    empty after that is left out and counted."""
    alphabet = ALPHABET + ALPHABET.upper() + "_ '/.&é"  # a model that emits case, symbols and the space
    predictions = ["CHANNEL_", "41 KM", "it's", "12/12", "www.TopStockResearch.com", "cafe", "hello", "x"]
    labels = ["CHANNEL", "41KM", "its", "1212", "wwwTopStockResearchcom", "Café", "help", "&"]
    counts = new_counts()
    update_counts(counts, predictions, labels, alphabet=alphabet)
    benchmark = summarize(counts, "benchmark")
    # channel 41km its 1212 wwwtopstockresearchcom: right; "cafe" against "caf" (é deleted from the label too)
    # and "hello" against "help": wrong; "&" is empty after the deletion: left out, not scored.
    assert benchmark["samples"] == 8 and benchmark["scored"] == 7
    assert benchmark["accuracy"] == 5 / 7
    # label characters 7 + 4 + 3 + 4 + 22 + 3 + 4 = 47; edits: cafe/caf 1, hello/help 2
    assert benchmark["cer"] == 3 / 47
    # The mode that keeps the model's own symbols counts every one of those readings wrong.
    assert summarize(counts, "ignore_case_symbols")["accuracy"] == 0


# Real runs of scripts/eval.sh ----------------------------------------------------------------------


def eval_sh(*args: str, nproc: int = 1) -> str:
    env = {"NPROC": str(nproc), "PYTHON": sys.executable}
    return run_command(
        "bash", "scripts/eval.sh", *args, "--workers", "0", "--precision", "fp32", env=env, check=True
    ).stdout


def read_dump(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8", newline="") as file:
        return list(csv.DictReader(file, delimiter="\t"))


@pytest.fixture(scope="module")
def checkpoint(tiny_run) -> Path:
    """tiny_run's last.pt, the whole checkpoint (optimizer and raw weights beside the average), not conftest's
    best.pt."""
    return tiny_run / "last.pt"


def readings(checkpoint: Path, samples: list[tuple[bytes, str]]) -> list[str]:
    """The model's reading of each image, computed here the way scripts/eval.py computes it: each image
    padded to its own width (a multiple of data.eval_width_step where the model keeps the aspect ratio)."""
    model, codec, config, preprocessing = load_model(checkpoint)
    transform = build_transform(config, preprocessing)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in the eval.sh processes, and leaving the other core to them
    try:
        with torch.inference_mode():
            return [codec.decode(model(transform(image)[None]))[0].text for image, _ in samples]
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def benchmarks(synth, checkpoint, tmp_path_factory) -> Path:
    """OUT/SVT_647 (shown as SVT; 19 in the LMDB: 17 good, one undecodable image, one label with a character outside the
    alphabet, scored without it as the benchmarks' protocol does),
    OUT/iiit5k_3000 (16) and OUT/mine (5), from the synthetic val set. Every other SVT sample is
    relabelled with the model's own reading, so that some predictions are correct."""
    out = tmp_path_factory.mktemp("benchmarks")
    samples = read_lmdb(synth / "val")
    svt = [
        (image, reading if i % 2 == 0 and reading else label)
        for i, ((image, label), reading) in enumerate(zip(samples[:17], readings(checkpoint, samples[:17])))
    ]
    assert svt != samples[:17]
    write_lmdb(out / "SVT_647", svt + [(b"not an image", "cd"), (samples[0][0], "a!b")])
    write_lmdb(out / "iiit5k_3000", samples[17:])
    write_lmdb(out / "mine", samples[:5])
    return out


@pytest.fixture(scope="module")
def results(checkpoint, benchmarks, tmp_path_factory) -> dict[int, dict]:
    """The same evaluation with NPROC=1 (batch size 7) and NPROC=2 (batch size 5)."""
    out = tmp_path_factory.mktemp("eval")
    results = {}
    for nproc, batch_size in ((1, 7), (2, 5)):
        paths = {key: out / f"{key}{nproc}.{key}" for key in ("json", "tsv", "png")}
        paths["readings"] = out / f"readings{nproc}.png"
        stdout = eval_sh(
            checkpoint,
            benchmarks / "mine",
            benchmarks / "SVT_647",
            benchmarks / "iiit5k_3000",
            "--batch-size",
            batch_size,
            "--json",
            paths["json"],
            "--dump",
            paths["tsv"],
            "--errors",
            paths["png"],
            "--errors-count",
            5,
            "--readings",
            paths["readings"],
            "--readings-count",
            3,
            nproc=nproc,
        )
        results[nproc] = {
            "stdout": stdout,
            "json": json.loads(paths["json"].read_text()),
            "dump": paths["tsv"].read_bytes(),
            "rows": read_dump(paths["tsv"]),
            "png": paths["png"],
            "readings": paths["readings"],
        }
    return results


@pytest.mark.slow
def test_benchmarks_get_their_names_and_order_and_counts(results):
    lines = results[1]["stdout"].split("\n\n")[0].splitlines()  # the table, not the one by confidence below it
    assert lines[0].startswith("metric mode benchmark:") and "[0-9a-z]" in lines[0]
    assert lines[0].endswith("decoder greedy")
    rows = [
        line.rsplit(maxsplit=8) for line in lines if line.startswith(("IIIT5k_3000 ", "SVT ", "mine ", "combined "))
    ]
    assert [row[0] for row in rows] == [
        "IIIT5k_3000",
        "SVT",
        "mine",
        "combined (weighted by samples)",
    ]  # benchmarks first
    assert [row[1:3] for row in rows] == [["16", "16"], ["18", "19"], ["5", "5"], ["39", "40"]]  # evaluated, in LMDB
    svt = lines.index(next(line for line in lines if line.startswith("SVT ")))
    assert lines[svt + 1].strip() == "1 of 19 not evaluated: 1 undecodable image"
    assert lines[svt + 2].strip() == "1 labels scored without their characters outside the alphabet"
    sets = {row["name"]: row for row in results[1]["json"]["sets"]}
    assert sets["SVT"]["dropped"] == {} and sets["SVT"]["undecodable_images"] == 1
    assert sets["SVT"]["labels_shortened"] == 1
    assert sets["SVT"]["in_lmdb"] == 19 and results[1]["json"]["metric_mode"] == "benchmark"
    assert results[1]["json"]["decoder"] == "greedy"


@pytest.mark.slow
def test_dump_has_every_sample_once_and_agrees_with_the_metrics(results):
    rows = results[1]["rows"]
    columns = ["set", "index", "label", "prediction", "confidence", "correct", "char_probs", "metric_mode"]
    assert list(rows[0]) == columns
    keys = [(row["set"], int(row["index"])) for row in rows]
    expected = (
        [("IIIT5k_3000", i) for i in range(1, 17)]
        + [("SVT", i) for i in [*range(1, 18), 19]]
        + [("mine", i) for i in range(1, 6)]
    )
    assert keys == expected  # set order, then LMDB index; SVT's undecodable sample 18 is absent
    assert rows[keys.index(("SVT", 19))]["label"] == "ab"  # "a!b" without the "!" the model cannot read
    for row in rows:
        same = compared_form(row["prediction"], "benchmark", ALPHABET) == compared_form(
            row["label"], "benchmark", ALPHABET
        )
        assert row["correct"] == str(int(same)) and row["metric_mode"] == "benchmark"
        probs = [float(prob) for prob in row["char_probs"].split()]
        assert len(probs) == len(row["prediction"])
        expected = math.prod(probs) ** (2 / math.sqrt(len(probs))) if probs else 0.0
        assert float(row["confidence"]) == pytest.approx(expected, abs=1e-3)
    for row in results[1]["json"]["sets"]:
        correct = sum(int(line["correct"]) for line in rows if line["set"] == row["name"])
        assert correct == round(row["accuracy"] * row["scored"])
    svt = [row for row in rows if row["set"] == "SVT"]
    assert all(row["correct"] == "1" for row in svt[::2])  # relabelled with the model's own reading
    assert results[1]["dump"] == results[2]["dump"]  # NPROC=2 gathers to the same file


@pytest.mark.slow
def test_accuracy_of_the_most_confident_readings_is_what_the_dump_shows(results):
    rows = results[1]["rows"]
    for row in results[1]["json"]["sets"]:
        lines = [(-float(line["confidence"]), line["correct"] == "1") for line in rows if line["set"] == row["name"]]
        for share, accuracy in row["accuracy_by_confidence"].items():
            kept = max(1, round(int(share.rstrip("%")) / 100 * len(lines)))
            # Confidences tied at the dump's 4 decimals may be ordered either way: wrong ones first, or right ones.
            worst = sum(correct for _, correct in sorted(lines)[:kept]) / kept
            best = sum(correct for _, correct in sorted(lines, key=lambda line: (line[0], not line[1]))[:kept]) / kept
            assert worst - 1e-12 <= accuracy <= best + 1e-12
    lines = results[1]["stdout"].splitlines()
    header = lines.index(next(line for line in lines if line.startswith("accuracy % of the most confident readings")))
    assert lines[header + 1].split() == ["set", "top", "50%", "top", "80%", "top", "95%", "all"]
    assert [line.split()[0] for line in lines[header + 2 : header + 6]] == ["IIIT5k_3000", "SVT", "mine", "combined"]
    assert list(results[1]["json"]["combined"]["accuracy_by_confidence"]) == ["50%", "80%", "95%"]


def test_results_are_the_same_for_any_batch_size_and_process_count(results):
    tables = {}
    for nproc, result in results.items():
        data = result["json"]
        noisy = [row.pop(key) for row in [*data["sets"], data["combined"]] for key in ("mean_confidence", "loss")]
        noisy += calibration_errors(data)
        tables[nproc] = (data, noisy)
    assert tables[1][1] == pytest.approx(tables[2][1], rel=1e-5)
    assert tables[1][0] == tables[2][0]
    assert tables[1][0]["combined"]["accuracy"] > 0


def test_errors_grid_holds_the_most_confident_misreads(results):
    misreads = sum(row["correct"] == "0" for row in results[1]["rows"])
    shown = min(5, misreads)
    assert f"{shown} most confident misreads (benchmark)" in results[1]["stdout"]
    columns = min(COLUMNS, shown)
    cell = (IMAGE_BOX[0] + 2 * PAD, IMAGE_BOX[1] + 3 * LINE_HEIGHT + 3 * PAD)  # three caption lines
    with Image.open(results[1]["png"]) as image:
        assert image.format == "PNG"
        assert image.size == (columns * cell[0], math.ceil(shown / columns) * cell[1])
    assert results[1]["png"].read_bytes() == results[2]["png"].read_bytes()


@pytest.mark.slow
def test_readings_grid_holds_each_sets_first_images(results):
    """3 of each of the 3 sets, whatever the number of processes: the picture a user looks at first."""
    assert "9 readings: " in results[1]["stdout"]
    cell = (IMAGE_BOX[0] + 2 * PAD, IMAGE_BOX[1] + 3 * LINE_HEIGHT + 3 * PAD)  # three caption lines
    with Image.open(results[1]["readings"]) as image:
        assert image.format == "PNG" and image.size == (COLUMNS * cell[0], math.ceil(9 / COLUMNS) * cell[1])
    assert results[1]["readings"].read_bytes() == results[2]["readings"].read_bytes()


@pytest.mark.slow
def test_bad_arguments_are_clear_errors_naming_the_file_or_option(checkpoint, benchmarks, tmp_path):
    lmdb, missing = benchmarks / "mine", tmp_path / "missing"
    cases = [
        ([missing / "best.pt", lmdb], f"error: checkpoint {missing / 'best.pt'} does not exist"),
        ([checkpoint, lmdb, missing], f"error: LMDB folder {missing} does not exist"),
        (
            [checkpoint, lmdb, "--dump", missing / "p.tsv"],
            f"error: --dump {missing / 'p.tsv'}: folder {missing} does not exist",
        ),
        (
            [checkpoint, lmdb, "--errors", tmp_path / "e.jpg"],
            f"error: --errors {tmp_path / 'e.jpg'}: the grid is written as",
        ),
        (
            [checkpoint, lmdb, "--readings", tmp_path / "r.jpg"],
            f"error: --readings {tmp_path / 'r.jpg'}: the grid is written as",
        ),
    ]
    # One process runs the script's __main__ once per case (the checks come before any evaluation):
    # sys.exit("error: ...") prints that message and exits with status 1.
    code = """
import json, runpy, sys
for argv in json.loads(sys.argv[1]):
    sys.argv = ["scripts/eval.py", *argv]
    try:
        runpy.run_path("scripts/eval.py", run_name="__main__")
    except SystemExit as exit:
        print(json.dumps(exit.code))
"""
    argvs = json.dumps([[str(arg) for arg in args] for args, _ in cases])
    result = run_command(sys.executable, "-c", code, argvs, check=True)
    messages = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(messages) == len(cases), result.stdout
    for message, (_, expected) in zip(messages, cases):
        assert message.startswith(expected), message
