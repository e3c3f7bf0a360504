"""Bad input, round 2: no hang, no traceback, no poisoned run folder, no silently wrong value.

Real processes where the point is what a user sees (a one-line error, an exit code, a signal at
start-up); the config checks in-process.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import lmdb
import pytest
import torch

from data.alphabet import load_alphabet
from data.codec import CTCCodec
from data.label_index import scan_labels
from data.lmdb_env import open_lmdb
from data.lmdb_writer import write_lmdb
from tests.conftest import ALPHABET, REPO, SMALL_RUN, one_line_error, run_command, start_command, train_small
from tests.test_lmdb_dataset import edit_lmdb, png
from training.checkpoint import save_checkpoint
from training.config import ConfigError, load_config, validate
from training.run_folder import check_run_folder, checkpoint_path, prepare_run_folder
from training.run_log import RunLog
from utils.cli import describe


def train(synth: Path, out_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    """train_small's run (SMALL_RUN) logging every step, validating and saving every 2, then `overrides`."""
    return train_small(
        synth, out_dir, "train.log_every=1", "train.eval_every=2", "train.save_every=2", *overrides, timeout=180
    )


def holds_nothing(out_dir: Path) -> bool:
    return not out_dir.exists() or not any(out_dir.iterdir())


# --- hangs -----------------------------------------------------------------------------------------


@pytest.fixture
def absurd_count_lmdb(tmp_path) -> Path:
    """Three good samples under a num-samples of 10**12."""
    root = tmp_path / "absurd"
    write_lmdb(root, [(png(), "abc"), (png(), "def"), (png(), "ghi")])
    edit_lmdb(root, put={b"num-samples": b"1000000000000"})
    return root


def test_a_num_samples_of_a_trillion_is_scanned_in_a_moment(absurd_count_lmdb):
    kept, report = scan_labels(absurd_count_lmdb, CTCCodec(ALPHABET), max_frames=31)  # the old scan: hours
    assert kept.tolist() == [1, 2, 3]
    assert report.dropped["missing label"] == 10**12 - 3  # counted, not looked up one by one
    assert "num-samples is 1000000000000 but only 3 samples exist" in report.summary()


@pytest.mark.slow
def test_inspect_lmdb_on_a_num_samples_of_a_trillion_finishes(absurd_count_lmdb):
    result = run_command(sys.executable, "scripts/inspect_lmdb.py", absurd_count_lmdb, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "no sample beyond index 3" in result.stdout and "scanned: samples 1 to 3 (all)" in result.stdout


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.slow
def test_a_signal_during_start_up_ends_the_process_at_once(tmp_path, signum):
    # 400,000 labels: a start-up scan of seconds, so the signal lands in it.
    big = tmp_path / "big"
    write_lmdb(big, ((b"x", "a") for _ in range(400_000)))
    out_dir = tmp_path / "run"
    process = start_command(
        sys.executable,
        "train.py",
        "--config",
        "crnn.yaml",
        f"data.train=[{big}]",
        f"data.val=[{big}]",
        f"train.out_dir={out_dir}",
        *SMALL_RUN,
        "train.log_every=1",
        "train.eval_every=2",
        "train.save_every=2",
        env={"PYTHONUNBUFFERED": "1"},
    )
    for line in process.stdout:  # the config is printed just before the data is read
        if line.startswith("config:"):
            break
    process.send_signal(signum)
    try:
        _, stderr = process.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail("the signal was ignored")
    assert process.returncode == 128 + signum, stderr[-3000:]
    assert f"stopped by {signal.Signals(signum).name} before training started; nothing was saved" in stderr
    assert "Traceback" not in stderr
    assert holds_nothing(out_dir)


# --- the run folder --------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_failed_start_leaves_nothing_that_blocks_the_corrected_command(synth, tmp_path):
    out_dir = tmp_path / "run"
    one_line_error(
        train(synth, out_dir, f"data.train=[{synth / 'trian'}]"), f"LMDB folder {synth / 'trian'} does not exist"
    )
    one_line_error(
        train(synth, out_dir, "data.img_height=16"),
        "data.img_height=16, data.img_width=128",
        "CRNN reads images 32 pixels high",
    )
    assert holds_nothing(out_dir)
    result = train(synth, out_dir, "train.max_steps=2")
    assert result.returncode == 0, result.stderr[-3000:]
    assert (out_dir / "last.pt").is_file() and (out_dir / "config.yaml").is_file()


def test_a_config_without_a_checkpoint_binds_nothing(tmp_path):
    config = load_config("crnn.yaml", [f"train.out_dir={tmp_path}", "train.resume=none"])
    (tmp_path / "config.yaml").write_text("optim:\n  lr: 0.5\n")  # a failed start of an older version
    (tmp_path / "metrics.jsonl").write_text("")
    check_run_folder(config)
    save_checkpoint(tmp_path / "best.pt", {"model": {"w": torch.zeros(1)}})  # a checkpoint binds
    with pytest.raises(ConfigError, match="holds another run"):
        check_run_folder(config)


def test_a_torn_config_beside_checkpoints_is_named_not_parsed(tmp_path):
    config = load_config("crnn.yaml", [f"train.out_dir={tmp_path}"])
    save_checkpoint(checkpoint_path(tmp_path, 2), {"model": {"w": torch.zeros(1)}, "step": 2})
    (tmp_path / "config.yaml").write_text("data:\n  train: [datasets/syn")  # cut short by a crash
    with pytest.raises(ConfigError, match="holds checkpoints but no readable config.yaml"):
        check_run_folder(config)


@pytest.mark.parametrize("case", ["file", "unwritable"])
@pytest.mark.slow
def test_an_out_dir_that_cannot_hold_a_run_is_named_at_start_up(synth, tmp_path, case):
    if case == "file":
        out_dir = tmp_path / "notes.txt"
        out_dir.write_text("keep me")
        fragment = f"train.out_dir={out_dir} is a file"
    else:  # not even root may create a folder in /sys
        out_dir = Path("/sys/crnn-test-run")
        fragment = f"train.out_dir={out_dir}: cannot write there"
    one_line_error(train(synth, out_dir, "train.max_steps=2"), fragment)
    if case == "file":
        assert out_dir.read_text() == "keep me"


def test_a_read_only_folder_is_refused_before_any_work(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr("tempfile.mkstemp", refuse)
    with pytest.raises(ConfigError, match=r"train.out_dir=.*: cannot write there \(Read-only file system\)"):
        prepare_run_folder(tmp_path / "run")


def test_a_full_disk_is_one_line_and_leaves_the_previous_checkpoint_and_no_temporary_file(tmp_path, monkeypatch):
    path = checkpoint_path(tmp_path, 2)
    save_checkpoint(path, {"model": {"w": torch.ones(1)}, "step": 2})

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(OSError) as raised:
        save_checkpoint(path, {"model": {"w": torch.zeros(1)}, "step": 4})
    assert describe(raised.value) == (
        f"{path}: No space left on device; the disk is full: free space or write "
        f"elsewhere (files already in place were left intact)"
    )
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
    assert torch.load(path, weights_only=True)["step"] == 2


# --- crash leftovers -------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_torn_last_line_of_metrics_does_not_stop_the_resume(synth, tmp_path):
    out_dir = tmp_path / "run"
    assert train(synth, out_dir, "train.max_steps=2").returncode == 0
    with (out_dir / "metrics.jsonl").open("ab") as log:
        log.write(b'{"time": 1.0, "step": 3, "loss": 4.\xc3')  # cut mid-number and mid-character
    result = train(synth, out_dir, "train.max_steps=4")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "dropped 1 unreadable line(s)" in result.stdout + result.stderr
    steps = [json.loads(line)["step"] for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(steps) and steps[-1] == 4


def test_the_log_keeps_every_readable_line_before_the_resume_step(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1}\nnot json\n{"step": 2}\n{"step": 3}\n{"step": 4, "lo')
    RunLog(tmp_path).drop_records_after(2)
    assert path.read_text() == '{"step": 1}\n{"step": 2}\n'


# --- values that make no sense -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "override, message",
    [
        ("optim.min_lr_ratio=-1", r"optim.min_lr_ratio=-1.0: must be from 0 to 1"),
        ("optim.min_lr_ratio=5", r"optim.min_lr_ratio=5.0: must be from 0 to 1"),
        ("optim.decay_share=0", r"optim.decay_share=0.0: must be from 1e-06 to 1"),
        ("optim.warmup_steps=-5", r"optim.warmup_steps=-5: must be at least 0"),
        ("data.img_height=0", r"data.img_height=0: must be at least 1"),
        ("data.img_width=0", r"data.img_width=0: must be at least 1"),
        ("optim.lr=nan", r"optim.lr=nan: must be a finite number, at least 1e-12"),
        ("optim.lr=.inf", r"optim.lr=inf: must be a finite number, at least 1e-12"),
        ("optim.lr=0", r"optim.lr=0.0: must be at least 1e-12"),
        ("optim.grad_clip=-1", r"optim.grad_clip=-1.0: must be at least 0"),
        ("optim.weight_decay=-0.1", r"optim.weight_decay=-0.1: must be from 0 to 1000"),
        ("model.hidden_size=0", r"model.hidden_size=0: must be at least 1"),
        ("model.channels=[32,64,0,128,256,256,256]", r"model.channels\[2\]=0: must be at least 1"),
        ("train.seed=-1", r"train.seed=-1: must be from 0 to 4.29497e\+09"),
        ("train.threads=-2", r"train.threads=-2: must be at least 0"),
        ("train.max_minutes=0", r"train.max_minutes=0.0: must be at least 0.001"),
        ("train.max_minutes=.nan", r"train.max_minutes=nan: must be a finite number, at least 0.001"),
        ("data.std=[.nan]", r"data.std\[0\]=nan: must be a finite number, from 1e-06 to 1000"),
        ("data.train_ratios=[-1]", r"data.train_ratios\[0\]=-1.0: must be at least 0"),
    ],
)
def test_every_number_is_checked_against_its_range(override, message):
    with pytest.raises(ConfigError, match=message):
        validate(load_config("crnn.yaml", [override]))


@pytest.mark.parametrize(
    "height, width, message",
    [
        (16, 128, "CRNN reads images 32 pixels high and at least 4 wide, got 16 x 128"),
        (32, 1, "CRNN reads images 32 pixels high and at least 4 wide, got 32 x 1"),
    ],
)
@pytest.mark.slow
def test_a_size_the_model_cannot_read_names_both_keys(synth, tmp_path, height, width, message):
    one_line_error(
        train(synth, tmp_path / "run", f"data.img_height={height}", f"data.img_width={width}"),
        f"data.img_height={height}, data.img_width={width}: {message}",
    )


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "train:\n  batch_size: 8\noptim:\n  lr: 0.01\ntrain:\n  max_steps: 5\n",
            r":5: 'train' is given twice in the same section \(first at line 1\)",
        ),
        (
            "data:\n  img_width: 100\n  alphabet: abc\n  img_width: 128\n",
            r":4: 'img_width' is given twice in the same section \(first at line 2\)",
        ),
    ],
)
def test_a_key_given_twice_in_a_yaml_file_is_an_error(tmp_path, text, message):
    path = tmp_path / "twice.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_config(str(path), [])


def test_a_config_file_that_is_not_utf8_is_named(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes('data:\n  alphabet: "caf\xe9"\n'.encode("latin-1"))
    with pytest.raises(ConfigError, match="latin1.yaml: not UTF-8 text"):
        load_config(str(path), [])


@pytest.mark.parametrize("value", ["keys.dat", "alphabets/latin.txt", "chars.lst"])
def test_an_alphabet_that_names_a_missing_file_is_an_error_not_eight_characters(value):
    with pytest.raises(FileNotFoundError, match=f"alphabet file '{value}' does not exist"):
        load_alphabet(value)
    assert load_alphabet("0123456789.,-") == "0123456789.,-"  # characters, with a dot among them


# --- tracebacks where a sentence belongs -------------------------------------------------------------


def test_a_data_mdb_that_is_not_an_lmdb_or_cannot_be_read_is_named(tmp_path, monkeypatch):
    folder = tmp_path / "garbage"
    folder.mkdir()
    (folder / "data.mdb").write_bytes(b"this is not an LMDB" * 100)
    with pytest.raises(ValueError, match=f"{folder / 'data.mdb'} is not a readable LMDB"):
        open_lmdb(folder)
    with pytest.raises(
        FileNotFoundError,
        match=f"LMDB {folder / 'data.mdb'} is a file: an LMDB is a folder holding "
        f"data.mdb; give its folder, {folder}",
    ):
        open_lmdb(folder / "data.mdb")
    monkeypatch.setattr(os, "access", lambda path, mode: False)  # root reads every file: pretend it may not
    with pytest.raises(PermissionError, match=f"{folder / 'data.mdb'}: no permission to read it"):
        open_lmdb(folder)


@pytest.mark.slow
def test_training_on_a_folder_that_is_not_an_lmdb_is_one_line(synth, tmp_path):
    folder = tmp_path / "garbage"
    folder.mkdir()
    (folder / "data.mdb").write_bytes(b"")
    one_line_error(
        train(synth, tmp_path / "run", f"data.train=[{folder}]"), f"{folder / 'data.mdb'} is not a readable LMDB"
    )


@pytest.mark.slow
def test_eval_sh_given_a_run_folder_names_the_checkpoint_inside(synth, tiny_run):
    result = run_command("bash", "scripts/eval.sh", tiny_run, synth / "val", timeout=120)
    one_line_error(result, f"checkpoint {tiny_run} is a folder; give a .pt file, e.g. {tiny_run / 'best.pt'}")


@pytest.mark.parametrize(
    "command",
    [
        ["scripts/predict.py", "{run}", "{tmp}/gt.txt"],
        ["scripts/export.py", "{run}", "--format", "pt2"],
        ["scripts/inspect_lmdb.py", "{tmp}/missing"],
        ["scripts/plot.py", "{tmp}/missing"],
        ["scripts/create_lmdb.py", "--images", "{tmp}", "--gt", "{tmp}/gt.txt", "--out", "{tmp}"],
        ["scripts/split_lmdb.py", "{tmp}/missing", "--val", "1", "--out", "{tmp}/split"],
        ["scripts/make_synthetic.py", "--out", "{tmp}/notes.txt", "--train", "2", "--val", "0", "--test", "0"],
        ["train.py", "--config", "{tmp}/twice.yaml"],
    ],
)
@pytest.mark.slow
def test_every_entry_point_reports_bad_input_in_one_line(synth, tiny_run, tmp_path, command):
    (tmp_path / "gt.txt").write_text("a.png\tabc\n")
    (tmp_path / "notes.txt").mkdir()
    (tmp_path / "notes.txt" / "train").write_text("not an LMDB")
    (tmp_path / "twice.yaml").write_text("data:\n  img_width: 100\ndata:\n  img_width: 128\n")
    arguments = [part.format(run=tiny_run, tmp=tmp_path) for part in command]
    result = run_command(sys.executable, *arguments, timeout=120)
    one_line_error(result)


# --- data tools ---------------------------------------------------------------------------------------


def test_create_lmdb_stores_an_image_listed_twice_once_and_refuses_two_labels(tmp_path):
    from PIL import Image

    root = tmp_path / "images"
    root.mkdir()
    for name, color in (("a.png", "red"), ("b.png", "blue")):
        Image.new("RGB", (40, 16), color).save(root / name)
    (tmp_path / "gt.txt").write_text("a.png\tcat\n./a.png\tcat\nb.png\tdog\nsub/../b.png\tdog\n")
    script = [sys.executable, str(REPO / "scripts" / "create_lmdb.py"), "--images", str(root)]
    result = subprocess.run(
        [*script, "--gt", str(tmp_path / "gt.txt"), "--out", str(tmp_path / "lmdb")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "skipped 2: image listed again, with the same label (stored once)" in result.stdout
    assert "line 2: ./a.png (first at line 1)" in result.stdout
    with lmdb.open(str(tmp_path / "lmdb"), readonly=True, lock=False) as env, env.begin() as txn:
        assert txn.get(b"num-samples") == b"2"

    (tmp_path / "conflict.txt").write_text("a.png\tcat\nb.png\tdog\n./a.png\tcar\n")
    result = subprocess.run(
        [*script, "--gt", str(tmp_path / "conflict.txt"), "--out", str(tmp_path / "other")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    one_line_error(result, "gives 1 image(s) two different labels", "./a.png: line 1 says 'cat', line 3 says 'car'")
    assert not (tmp_path / "other").exists()


def test_overwrite_replaces_an_lmdb_and_never_another_folder(tmp_path):
    keep = tmp_path / "datasets"
    (keep / "mine").mkdir(parents=True)
    (keep / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="is not an LMDB folder"):
        write_lmdb(keep, [(png(), "abc")], overwrite=True)
    assert (keep / "mine" / "notes.txt").read_text() == "keep me"
    write_lmdb(tmp_path / "lmdb", [(png(), "abc")])
    assert write_lmdb(tmp_path / "lmdb", [(png(), "abc"), (png(), "def")], overwrite=True) == 2
