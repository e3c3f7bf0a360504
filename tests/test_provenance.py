"""Where the data came from: each LMDB's meta.json, written by the commands that make LMDBs, carried by training
into the run folder and every checkpoint, and printed by eval.py and predict.py --provenance."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

from data.provenance import MetaError, read_meta, resumed_record, run_record
from tests.conftest import one_line_error, read_lmdb, run_command, train_small
from tests.test_peer_weights import crnn_pytorch_state_dict

STEPS = ("train.max_steps=2", "train.eval_every=2", "train.log_every=2")


def create_lmdb(synth: Path, tmp_path: Path, *options: str, count: int = 6) -> Path:
    """An LMDB of `count` of synth's val images, made by create_lmdb.py with `options`."""
    images = tmp_path / "images"
    images.mkdir(parents=True)
    lines = []
    for index, (image_bytes, label) in enumerate(read_lmdb(synth / "val")[:count]):
        (images / f"{index}.jpg").write_bytes(image_bytes)
        lines.append(f"{index}.jpg\t{label}")
    (tmp_path / "gt.txt").write_text("\n".join(lines) + "\n")
    out = tmp_path / "crops"
    command = ("scripts/create_lmdb.py", "--images", images, "--gt", tmp_path / "gt.txt", "--out", out, *options)
    run_command(sys.executable, *command, check=True)
    return out


def test_create_lmdb_records_the_given_source_and_licence_and_says_what_was_not_given(synth, tmp_path):
    given = create_lmdb(synth, tmp_path / "given", "--source", "https://example.org/crops", "--licence", "CC-BY-4.0")
    bare = create_lmdb(synth, tmp_path / "bare")

    meta = read_meta(given)
    assert (meta["name"], meta["source"], meta["licence"], meta["samples"]) == (
        "crops",
        "https://example.org/crops",
        "CC-BY-4.0",
        6,
    )
    assert "create_lmdb.py" in meta["created_by"] and meta["created"].endswith("Z")
    assert (read_meta(bare)["source"], read_meta(bare)["licence"]) == ("not given", "not given")


def test_make_synthetic_records_each_split_with_its_generator_settings(synth):
    meta = read_meta(synth / "train")

    assert (meta["name"], meta["samples"]) == ("synthetic train", 96)
    assert meta["generator"]["seed"] == 0 and "LICENSE-SCOWL" in meta["generator"]["words"]
    assert meta["generator"]["fonts"]
    assert read_meta(synth / "test")["samples"] == 20


def test_split_lmdb_says_what_it_split_and_carries_the_sources_records(synth, tmp_path):
    crops = create_lmdb(synth, tmp_path, "--source", "my scans", "--licence", "mine")
    out = tmp_path / "split"
    run_command(sys.executable, "scripts/split_lmdb.py", synth / "test", crops, "--val", "5", "--out", out, check=True)

    val = read_meta(out / "val")
    assert val["samples"] == 5 and val["source"].startswith(f"split of {synth / 'test'}, {crops} (seed 0, 5 of 26")
    assert [(source["path"], source["name"]) for source in val["sources"]] == [
        (str(synth / "test"), "synthetic test"),
        (str(crops), "crops"),
    ]
    assert "mine" in val["licence"] and read_meta(out / "train")["samples"] == 21


@pytest.mark.parametrize(
    "text, problem",
    [("{not json", "not JSON"), ("[1, 2]", "not a mapping"), ('{"samples": "many"}', "its 'samples' is 'many'")],
)
def test_a_bad_meta_json_is_named_by_file_and_field(tmp_path, text, problem):
    (tmp_path / "meta.json").write_text(text)

    with pytest.raises(MetaError, match=problem) as error:
        read_meta(tmp_path)
    assert str(tmp_path / "meta.json") in str(error.value) and "\n" not in str(error.value)


def test_training_refuses_a_bad_meta_json_at_start_in_one_line(synth, tmp_path):
    val = tmp_path / "val"
    shutil.copytree(synth / "val", val)
    (val / "meta.json").write_text('{"licence": 4}')

    result = train_small(synth, tmp_path / "run", *STEPS, f"data.val=[{val}]")

    one_line_error(result, str(val / "meta.json"), "'licence'")
    assert not (tmp_path / "run" / "best.pt").exists()


def test_a_run_records_its_data_in_its_folder_and_checkpoints(tiny_run, synth):
    record = json.loads((tiny_run / "data_provenance.json").read_text())

    assert [(dataset["role"], dataset["path"], dataset["meta"]["name"]) for dataset in record["datasets"]] == [
        ("train", str(synth / "train"), "synthetic train"),
        ("val", str(synth / "val"), "synthetic val"),
    ]
    assert record["started_from"] is None
    for name in ("best.pt", "last.pt"):
        assert torch.load(tiny_run / name, weights_only=True)["provenance"] == record


def test_a_fine_tune_records_its_start_checkpoints_data_too(synth, checkpoint, tmp_path):
    crops = create_lmdb(synth, tmp_path, "--source", "my scans", "--licence", "mine", count=16)
    out = tmp_path / "tuned"
    train_small(synth, out, *STEPS, f"data.train=[{crops}]", f"train.init_from={checkpoint}", check=True)

    record = torch.load(out / "best.pt", weights_only=True)["provenance"]
    assert record["datasets"][0]["meta"]["source"] == "my scans"
    assert record["started_from"] == {
        "checkpoint": str(checkpoint),
        "provenance": torch.load(checkpoint, weights_only=True)["provenance"],
    }

    shown = run_command(sys.executable, "scripts/predict.py", out / "best.pt", "--provenance", check=True).stdout
    assert "source my scans, licence mine" in shown
    assert f"started from {checkpoint}, which was" in shown and "synthetic train, 96 samples" in shown


def test_a_resume_keeps_the_record_and_adds_new_datasets(synth, tmp_path):
    kept = run_record([str(synth / "train")], [str(synth / "val")], "start.pt", None)
    current = run_record([str(synth / "train"), str(synth / "test")], [str(synth / "val")])

    resumed = resumed_record(current, kept)

    assert [dataset["path"] for dataset in resumed["datasets"]] == [
        str(synth / "train"),
        str(synth / "val"),
        str(synth / "test"),
    ]
    assert resumed["started_from"] == {"checkpoint": "start.pt", "provenance": None}


def test_a_resumed_run_keeps_its_checkpoints_record(tiny_run, synth, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    last = torch.load(run / "last.pt", weights_only=True)
    last["provenance"]["datasets"][0]["meta"]["notes"] = "as the run began"
    (run / "last.pt").unlink()  # a hard link to ckpt-*.pt: replaced, not written through
    torch.save(last, run / "last.pt")

    resumed = ("train.max_steps=6", "train.eval_every=4", "train.log_every=4", "data.augment=strong")
    train_small(synth, run, *resumed, "train.tensorboard=true", "train.resume=" + str(run / "last.pt"), check=True)

    record = json.loads((run / "data_provenance.json").read_text())
    assert record["datasets"][0]["meta"]["notes"] == "as the run began"
    assert torch.load(run / "ckpt-0000006.pt", weights_only=True)["provenance"] == record


def test_eval_and_predict_print_what_the_checkpoint_was_trained_on(checkpoint, synth):
    evaluated = run_command("scripts/eval.sh", checkpoint, "--provenance", env={"PYTHON": sys.executable}, check=True)
    with_table = run_command(sys.executable, "scripts/eval.py", checkpoint, synth / "test", "--provenance", check=True)
    predicted = run_command(sys.executable, "scripts/predict.py", checkpoint, "--provenance", check=True)

    line = f"  train {synth / 'train'}: synthetic train, 96 samples, source rendered by scripts/make_synthetic.py"
    assert evaluated.stdout.startswith("trained on:\n") and line in evaluated.stdout
    assert line in predicted.stdout
    assert with_table.stdout.index(line) < with_table.stdout.index("test")


def test_an_imported_or_bare_checkpoint_says_none_is_recorded_unless_the_import_was_told(checkpoint, tmp_path):
    torch.save(crnn_pytorch_state_dict(hidden=16, classes=37), tmp_path / "crnn.pth")
    command = (sys.executable, "scripts/import_weights.py", tmp_path / "crnn.pth")
    run_command(*command, "--out", tmp_path / "imported.pt", check=True)
    told = ("--trained-on", "MJSynth, by its authors", "--licence", "research only")
    run_command(*command, "--out", tmp_path / "told.pt", *told, check=True)
    torch.save(torch.load(checkpoint, weights_only=True)["model"], tmp_path / "bare.pt")

    def shown(name: str) -> str:
        return run_command(sys.executable, "scripts/predict.py", tmp_path / name, "--provenance", check=True).stdout

    assert shown("imported.pt").startswith("no provenance recorded (imported from crnn.pth by scripts/import_weights")
    assert shown("bare.pt").startswith("no provenance recorded: the checkpoint does not say")
    assert "imported crnn.pth: crnn.pth, samples not given, source MJSynth, by its authors, licence research only" in (
        shown("told.pt")
    )


def test_a_checkpoint_whose_record_was_edited_is_named(checkpoint, tmp_path):
    edited = torch.load(checkpoint, weights_only=True)
    edited["provenance"] = {"datasets": "synth"}
    torch.save(edited, tmp_path / "edited.pt")

    result = run_command(sys.executable, "scripts/predict.py", tmp_path / "edited.pt", "--provenance")

    one_line_error(result, "edited.pt: its 'provenance' is")
