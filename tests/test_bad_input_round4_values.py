"""Bad input, round 4: values trusted because they are present (a GT file's paths, a checkpoint's recorded
facts, a cached label index), NaN that reached integer code (a checkpoint's weights, a model's output), and
errors told by the wrong layer (LMDB's words for a full disk, a typo in a name taken for something else).
Each test is a row of docs/bad-input.md; each failed on the code before its fix, as its comment says."""

from __future__ import annotations

import errno
import json
import os
import resource
import shutil
import sys
from pathlib import Path

import lmdb
import numpy as np
import pytest
import torch

from data.codec import CTCCodec
from data.label_index import index_cache_dir, scan_labels, usable_samples
from data.lmdb_writer import describe_write_failure
from data.transforms import PreprocessingError
from evaluation.evaluate import NonFiniteOutput, check_finite_outputs
from tests.conftest import ALPHABET, REPO, one_line_error, run_command, run_env, write_images
from training.checkpoint import CheckpointError, load_checkpoint, load_model
from training.run_folder import find_latest_checkpoint

CODEC = CTCCodec(ALPHABET, fold_case=True)


def forged(checkpoint: Path, folder: Path, name: str, **fields) -> Path:
    """A copy of `checkpoint` (written by train.py) with `fields` replaced, as someone editing it would."""
    record = torch.load(checkpoint, weights_only=True)
    path = folder / f"{name}.pt"
    torch.save({**record, **fields}, path)
    return path


def with_weights(checkpoint: Path, folder: Path, name: str, change) -> Path:
    """A copy of `checkpoint` whose state dict `change(weights)` has altered in place."""
    record = torch.load(checkpoint, weights_only=True)
    change(record["model"])
    path = folder / f"{name}.pt"
    torch.save(record, path)
    return path


def one_nan(weights: dict[str, torch.Tensor]) -> None:
    weights["sequence.0.rnn.weight_ih_l0"].view(-1)[3] = float("nan")


def too_large(weights: dict[str, torch.Tensor]) -> None:
    """Finite weights whose products pass float32's largest number: what a diverging run leaves."""
    weights["backbone.0.weight"] *= 1e30
    weights["backbone.3.weight"] *= 1e30


# --- Class 4: values trusted because they are present ------------------------------------------------------


@pytest.mark.slow
def test_create_lmdb_refuses_gt_paths_leading_out_of_images_and_writes_nothing(synth, tmp_path):
    # Before: exit 0 and `wrote 4 samples`, the three images from outside --images among them.
    images, elsewhere = tmp_path / "images", tmp_path / "private"
    write_images(synth, images, 1)
    secret = write_images(synth, elsewhere, 1, start=1)[0]
    (images / "link.jpg").symlink_to(secret)
    gt = tmp_path / "gt.txt"
    gt.write_text(f"val00.jpg\tcat\n../private/val01.jpg\tdog\n{secret}\tdog\nlink.jpg\tdog\n", encoding="utf-8")
    out = tmp_path / "out"
    result = run_command(sys.executable, "scripts/create_lmdb.py", "--images", images, "--gt", gt, "--out", out)
    line = one_line_error(
        result,
        f"  line 2: '../private/val01.jpg' is {secret}\n",
        f"  line 3: '{secret}' is {secret}\n",
        f"  line 4: 'link.jpg' is {secret}\n",
    )
    assert line == (
        f"error: --gt {gt}: 3 line(s) name images outside --images {images} (by ../, an absolute path or a symbolic"
        f" link), which would be stored in the LMDB: copy those images under {images}, or give --images a folder"
        f" that holds them all; nothing was written:"
    )
    assert not out.exists()


def test_a_checkpoint_of_forged_field_types_is_one_error_naming_the_file_and_the_field(checkpoint, tmp_path):
    # Before: a step or world size of text, a precision of 5, a format from the future loaded as if
    # right; an alphabet of 123 was `TypeError: 'int' object is not iterable`, a config of text
    # `AttributeError: 'str' object has no attribute 'items'`, keep_aspect 'no' read as true, a width of
    # 10**9 accepted (every image resized to it), an alphabet shorter than the classifier's rows the
    # strict-load error of every tensor.
    record = torch.load(checkpoint, weights_only=True)
    preprocessing = record["preprocessing"]
    cases = {
        "step": ({"step": "4"}, "its 'step' is '4' (str), not a count of steps (an integer, 0 or more)"),
        "world_size": ({"world_size": "two"}, "its 'world_size' is 'two' (str), not a number of processes"),
        "precision": ({"precision": 5}, "its 'precision' is 5 (int), not a precision (fp32, bf16, fp16)"),
        "accuracy": ({"accuracy": "high"}, "its 'accuracy' is 'high' (str), not an accuracy (a number, or none)"),
        "alphabet": ({"alphabet": 123}, "its 'alphabet' is 123 (int), not the characters, as text"),
        "config": ({"config": "crnn.yaml"}, "its 'config' is 'crnn.yaml' (str), not a mapping"),
        "format": ({"format": 99}, "its 'format' is 99, and this version reads up to 1: it was written by a newer"),
        "model": (
            {"model": {**record["model"], "backbone.0.weight": [1.0, 2.0]}},
            "its 'model' is not a state dict (names to tensors): its entry 'backbone.0.weight' is [1.0, 2.0] (list)",
        ),
        "section": ({"config": {**record["config"], "data": "x"}}, "its config is not usable: checkpoint config:"),
        "short_alphabet": (
            {"alphabet": ALPHABET[:-3]},
            "its alphabet has 33 characters, but its classifier (sequence.0.linear.weight) has 37 rows, for the"
            " blank and 36 characters: its weights were trained for another alphabet or architecture than it records",
        ),
        "width": (
            {"preprocessing": {**preprocessing, "width": 10**9}},
            "its preprocessing record is not usable: width=1000000000: must be at most 65535",
        ),
        "keep_aspect": (
            {"preprocessing": {**preprocessing, "keep_aspect": "no"}},
            "its preprocessing record is not usable: keep_aspect is 'no' (str), not true or false",
        ),
        "height": (
            {"preprocessing": {**preprocessing, "height": "32"}},
            "its preprocessing record is not usable: height is '32' (str), not an integer",
        ),
    }
    for name, (fields, message) in cases.items():
        path = forged(checkpoint, tmp_path, name, **fields)
        with pytest.raises((CheckpointError, PreprocessingError)) as raised:
            load_model(path)
        assert str(raised.value).startswith(f"{path}: {message}"), (name, str(raised.value))
        assert "\n" not in str(raised.value), name


@pytest.mark.slow
def test_eval_names_a_forged_field_of_the_checkpoint_in_one_line(checkpoint, synth, tmp_path):
    # Before: exit 0, the table printed; the step of text was never looked at.
    path = forged(checkpoint, tmp_path, "forged", step="4")
    result = run_command("bash", "scripts/eval.sh", path, synth / "val")
    one_line_error(result, f"error: {path}: its 'step' is '4' (str), not a count of steps")


def cached_entry(lmdb_path: Path, cache: Path) -> tuple[np.ndarray, Path]:
    kept, report = usable_samples(lmdb_path, CODEC, 26, cache_dir=cache)
    assert report.source.startswith("labels scanned")
    return np.array(kept), next(cache.glob("*.npy"))


def test_a_cached_label_index_that_is_not_what_it_says_is_built_again_with_a_line_saying_why(synth, tmp_path):
    # Before: any array of the right length was believed: indices past the LMDB's end (read as missing
    # samples, or an IndexError), out of order or repeated (the sampler's shards overlap), floats.
    lmdb_path = synth / "val"
    scanned = scan_labels(lmdb_path, CODEC, 26)[0].tolist()
    forgeries = {
        "range": (lambda kept: kept + 1000, "its indices run from 1001 to 1033, and the LMDB's from 1 to 33"),
        "order": (lambda kept: kept[::-1].copy(), "its indices are not in increasing order (position 1: 32)"),
        "repeats": (lambda kept: np.full_like(kept, 5), "its indices are not in increasing order (position 1: 5)"),
        "dtype": (lambda kept: kept.astype(np.float64), "its indices are a 1-D array of float64, not a list of"),
    }
    for name, (forge, why) in forgeries.items():
        cache = tmp_path / name
        kept, entry = cached_entry(lmdb_path, cache)
        np.save(entry, forge(kept), allow_pickle=False)
        again, report = usable_samples(lmdb_path, CODEC, 26, cache_dir=cache)
        assert again.tolist() == scanned, name
        assert report.source.startswith("labels scanned"), (name, report.source)
        assert f"(the cached index {entry} was not usable, so it was built again: {why}" in report.source, (
            name,
            report.source,
        )
        assert usable_samples(lmdb_path, CODEC, 26, cache_dir=cache)[1].source.startswith("index read"), name
    # A report whose counts are text: before, believed, and its summary line a TypeError.
    cache = tmp_path / "report"
    _, entry = cached_entry(lmdb_path, cache)
    record_path = entry.with_suffix(".json")
    record = json.loads(record_path.read_text())
    record["report"]["total"] = "33"
    record_path.write_text(json.dumps(record))
    again, report = usable_samples(lmdb_path, CODEC, 26, cache_dir=cache)
    assert again.tolist() == scanned and "built again: its report does not hold counts" in report.source


# --- Class 5: NaN reaches integer code ---------------------------------------------------------------------


@pytest.mark.slow
def test_a_nan_weight_is_named_by_every_command_that_reads_the_checkpoint(checkpoint, synth, tmp_path):
    # Before: eval.sh `error: cannot convert float NaN to integer`; predict.py an empty reading at confidence
    # 0.0000 and exit 0; export.py wrote a model of NaN.
    path = with_weights(checkpoint, tmp_path, "diverged", one_nan)
    message = (
        f"error: {path}: weight 'sequence.0.rnn.weight_ih_l0' holds NaN (1 value): the run that wrote it diverged;"
        f" pick an earlier checkpoint"
    )
    image = write_images(synth, tmp_path / "images", 1)[0]
    for command in (
        ("bash", "scripts/eval.sh", path, synth / "val"),
        (sys.executable, "scripts/predict.py", path, image),
        (sys.executable, "scripts/export.py", path, "--format", "pt2", "--out", tmp_path / "model.pt2"),
    ):
        result = run_command(*command)
        assert one_line_error(result) == message, command[1]
        assert not result.stdout.strip() or "\t" not in result.stdout, command[1]  # no reading printed
    assert not (tmp_path / "model.pt2").exists()


def test_load_checkpoint_counts_nan_and_infinity_and_a_run_folder_resumes_from_the_checkpoint_before(
    tiny_run, tmp_path
):
    # Before: a NaN checkpoint loaded (import_weights, train.init_from, resume); the run folder resumed from it.
    def nan_and_inf(weights: dict[str, torch.Tensor]) -> None:
        weights["backbone.0.weight"].view(-1)[:2] = float("nan")
        weights["backbone.0.weight"].view(-1)[2] = float("inf")
        weights["sequence.0.linear.bias"][0] = float("-inf")

    run = tmp_path / "run"
    run.mkdir()
    earlier = run / "ckpt-0000004.pt"
    shutil.copy(tiny_run / "last.pt", earlier)
    record = torch.load(earlier, weights_only=True)
    nan_and_inf(record["model"])
    record["step"] = 8
    torch.save(record, run / "ckpt-0000008.pt")
    with pytest.raises(CheckpointError) as raised:
        load_checkpoint(run / "ckpt-0000008.pt")
    assert str(raised.value) == (
        f"{run / 'ckpt-0000008.pt'}: weight 'backbone.0.weight' holds NaN (2 values) and infinity (1 value), as do 1"
        f" other tensor(s): the run that wrote it diverged; pick an earlier checkpoint"
    )
    warnings: list[str] = []
    path, resumed = find_latest_checkpoint(run, warnings.append)
    assert path == earlier and resumed["step"] == 4
    assert warnings == [f"warning: skipping {run / 'ckpt-0000008.pt'}: {raised.value}"]


@pytest.mark.slow
def test_a_model_whose_output_overflows_is_named_not_read_as_empty_text(checkpoint, synth, tmp_path):
    # Before: predict.py printed an empty reading at confidence 0.0000 and exited 0; eval.sh died with
    # `cannot convert float NaN to integer`. The weights are finite, so only the output can tell.
    path = with_weights(checkpoint, tmp_path, "overflowing", too_large)
    image = write_images(synth, tmp_path / "images", 1)[0]
    fragment = (
        "error: the model's output holds NaN or infinity for 1 of 1 images; its weights have grown past what the"
        " arithmetic holds, as in a run that diverges: use an earlier checkpoint"
    )
    result = run_command(sys.executable, "scripts/predict.py", path, image)
    one_line_error(result, fragment)
    assert "\t" not in result.stdout
    one_line_error(run_command("bash", "scripts/eval.sh", path, synth / "val"), "the model's output holds NaN")


def test_fp16_overflow_is_named_with_the_precision_to_use_instead():
    logits = torch.zeros(3, 5, 7)
    check_finite_outputs(logits, "fp16")  # finite: nothing to say
    logits[1, 2, 3] = float("inf")
    with pytest.raises(NonFiniteOutput, match=r"^the model's output holds NaN or infinity for 1 of 3 images; fp16's"):
        check_finite_outputs(logits, "fp16")


# --- Class 6: errors from the wrong layer ------------------------------------------------------------------


def limit_file_size(size: int):
    """What `ulimit -f` does: a file of this process grows no further than `size` bytes. Python ignores
    SIGXFSZ, so the write that passes it comes back short: as on a full disk."""
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))


@pytest.mark.slow
def test_a_write_that_fails_is_named_with_the_lmdb_the_free_space_and_what_to_do(tmp_path):
    # Before: `error: LMDB: mdb_txn_commit: Input/output error`: no folder, and it reads like a dying disk.
    import subprocess

    out = tmp_path / "synth"
    result = subprocess.run(
        [sys.executable, "scripts/make_synthetic.py", "--out", str(out), "--train", "150", "--val", "0", "--test", "0"]
        + ["--workers", "1"],
        cwd=REPO,
        env=run_env(),
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=limit_file_size(100 << 10),
    )
    line = one_line_error(
        result,
        f"error: LMDB {out / 'train'}: the write failed after ",
        " (mdb_txn_commit: Input/output error); ",
        " free on its disk; this process may write files of at most 100.0 KiB (ulimit -f): raise the limit, or"
        " write smaller LMDBs.",
        f" {out / 'train'} is as it was, and the part written is removed",
    )
    assert "LMDB: mdb_txn_commit" not in line
    assert not out.exists() or not any(out.iterdir())


def test_a_full_disk_is_named_as_full_whatever_lmdb_calls_it(tmp_path, monkeypatch):
    # LMDB's own error on the same folder, as the writer sees it: ENOSPC, or the EIO of a short write
    # on a disk with no room left.
    staging = tmp_path / ".out.staging"
    env = lmdb.open(str(staging), map_size=1 << 20)
    with env.begin(write=True) as txn:
        txn.put(b"key", b"value")
    env.close()
    no_space = lmdb.DiskError(f"mdb_txn_commit: {os.strerror(errno.ENOSPC)}")  # py-lmdb's own form
    full = describe_write_failure(no_space, tmp_path / "out", staging)
    assert full.startswith(f"LMDB {tmp_path / 'out'}: the write failed after ")
    assert "(mdb_txn_commit: No space left on device)" in full
    assert "; the disk is full (or your quota on it): free space there, or write the LMDB to another disk." in full
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage._replace(free=4096))
    short = describe_write_failure(lmdb.Error("mdb_txn_commit: Input/output error"), tmp_path / "out", staging)
    assert "4.0 KiB free on its disk; the disk is full" in short


@pytest.mark.slow
def test_a_typo_in_a_held_out_font_family_is_named_not_explained_as_a_single_family(tmp_path):
    # Before: exit 0, and `held out: none: a single family is installed, so test uses it too` with 71 installed.
    out = tmp_path / "synth"
    command = ("scripts/make_synthetic.py", "--out", out, "--train", "1", "--val", "0", "--test", "1", "--workers", "1")
    result = run_command(sys.executable, *command, "--held-out-fonts", "DejaVu Serif,Zzz Nonexistent Sans")
    one_line_error(
        result,
        "error: --held-out-fonts: unknown font family 'Zzz Nonexistent Sans'; choose among the families that can"
        " draw the alphabet here: ",
    )
    assert not out.exists()
    family = result.stderr.split("draw the alphabet here: ")[1].split(", ")[0].strip()  # one installed here
    typo = family[:-1].lower()
    result = run_command(sys.executable, *command, "--held-out-fonts", typo)
    one_line_error(result, f"unknown font family {typo!r} (did you mean {family!r}?); choose among")
    assert not out.exists()


def test_a_typo_in_the_index_cache_setting_is_not_a_new_folder(tmp_path, monkeypatch):
    # Before: `data.index_cache=of` (or eval.sh --index-cache of) made a folder `of` and cached there.
    monkeypatch.chdir(tmp_path)
    for typed, meant in (("of", "off"), ("Auto", "auto"), ("OFF", "off")):
        with pytest.raises(ValueError, match=rf"^index cache '{typed}': unknown setting \(did you mean '{meant}'\?\)"):
            index_cache_dir(typed)
    assert index_cache_dir("./of") == Path("of") and index_cache_dir("cache") == Path("cache")
    (tmp_path / "of").mkdir()
    assert index_cache_dir("of") == Path("of")  # a folder of that name is what it names


def test_a_typo_in_every_other_option_or_key_naming_a_choice_lists_the_choices(monkeypatch, capsys):
    # Good already (pinned): the scripts' choices are argparse's, the config's keys checked against their tables.
    import importlib

    from training.config import load_config, validate

    for script, arguments, option, typo in (
        ("eval", ["a.pt", "lmdb"], "--metric-mode", "benchmrk"),
        ("eval", ["a.pt", "lmdb"], "--decoder", "bem"),
        ("predict", ["a.pt", "a.png"], "--precision", "bf61"),
        ("export", ["a.pt", "--out", "m.onnx"], "--format", "onx"),
        ("import_weights", ["a.pth", "--out", "m.pt"], "--format", "dtbr"),
        ("export", ["a.pt", "--format", "onnx", "--out", "m.onnx"], "--int8", "dynamc"),
        ("eval", ["a.pt", "lmdb"], "--unknown-characters", "remov"),
    ):
        monkeypatch.setattr(sys, "argv", [f"{script}.py", *arguments, option, typo])
        with pytest.raises(SystemExit) as raised:
            importlib.import_module(f"scripts.{script}").parse_args()
        assert raised.value.code == 2
        assert f"argument {option}: invalid choice: '{typo}' (choose from " in capsys.readouterr().err, script
    for override, message in (
        ("model.arch=crn", "model.arch: unknown architecture 'crn'; choose one of ['crnn', "),
        ("optim.name=adm", "optim.name: 'adm' is not one of adam, adadelta"),
        ("optim.schedule=cosin", "optim.schedule: 'cosin' is not one of cosine, "),
        ("train.precision=bf61", "train.precision: 'bf61' is not one of auto, fp32, bf16, fp16"),
        ("data.augment=strnog", "data.augment: 'strnog' is not one of none, light, strong"),
        ("data.interpolation=bilinar", "data.interpolation: 'bilinar' is not one of nearest, bilinear, "),
        ("data.unknown_characters=remov", "data.unknown_characters: 'remov' is not one of drop, remove"),
        ("model.in_channels=2", "model.in_channels: 2 is not one of 1, 3"),
    ):
        with pytest.raises(ValueError) as raised:
            validate(load_config("crnn.yaml", [override, "data.train=[t]", "data.val=[v]"]))
        assert str(raised.value).startswith(message), override
