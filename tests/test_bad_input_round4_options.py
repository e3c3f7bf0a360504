"""Bad input, round 4, the rough cases: options that would do nothing where they stand, a folder where a file is
meant (and a file where a folder is), a bare config name that means two files, a setting's typo, an output that
cannot be written found only after the work, warnings that buried a result, and weights or optimizer moments
that are not numbers on their way into (or out of) a checkpoint file.
Each test is a row of docs/bad-input.md; each failed on the code before its fix, as its comment says."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import pytest
import torch

from data.alphabet import load_alphabet
from data.codec import CTCCodec
from evaluation.decoders import build_decoder, read_lexicon
from interop.export import pytorch_warnings
from tests.conftest import ALPHABET, REPO, TORCHRUN_TWO, one_line_error, run_command, small_training, start_command
from training.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from training.config import ConfigError, load_config
from utils.atomic_write import check_writable, remove_leftovers, write_text_atomically

CODEC = CTCCodec(ALPHABET, fold_case=True)
EVAL = ("bash", "scripts/eval.sh")


def unwritable_folder() -> Path:
    """A folder no process here may create a file in, root included: sysfs refuses new files to everyone."""
    folder = Path("/sys")
    try:
        handle, probe = tempfile.mkstemp(dir=folder)
    except OSError:
        return folder
    os.close(handle)
    os.unlink(probe)
    pytest.skip("/sys takes new files on this machine")


# --- Options that do nothing in their context --------------------------------------------------------------


def test_a_beam_size_without_the_beam_decoder_is_refused():
    # Before: `eval.sh ... --beam-size 3` (greedy decoding) read greedily and said nothing.
    with pytest.raises(ValueError, match=r"^--beam-size 3 is for --decoder beam; --decoder greedy has no beam"):
        build_decoder("greedy", CODEC, beam_size=3)
    assert build_decoder("greedy", CODEC) == CODEC.decode  # not given: nothing to refuse


@pytest.mark.parametrize("option", ["--errors", "--readings"])
def test_a_picture_size_without_its_picture_is_refused(checkpoint, synth, option):
    # Before: `--errors-count 5` without `--errors` evaluated and drew nothing, without a word.
    result = run_command(*EVAL, checkpoint, synth / "val", f"{option}-count", "5")
    one_line_error(result, f"{option}-count 5 sizes the {option} picture; add {option} PATH.png")
    assert "accuracy" not in result.stdout  # refused before evaluating


def test_make_synthetic_refuses_words_with_no_words_and_a_folder_of_words(tmp_path):
    # Before: `--words mine.txt --no-words` rendered without words and ignored the file; `--words DIR` said
    # "DIR does not exist".
    words = tmp_path / "mine.txt"
    words.write_text("hello\n")
    script = (sys.executable, "scripts/make_synthetic.py", "--out", tmp_path / "out", "--train", "2")
    one_line_error(run_command(*script, "--words", words, "--no-words"), "--no-words contradict each other")
    one_line_error(run_command(*script, "--words", tmp_path), f"--words: {tmp_path} is a folder")
    assert not (tmp_path / "out").exists()


# --- A folder where a file is meant, a file where a folder is ----------------------------------------------


def test_a_folder_given_as_a_file_is_called_a_folder(tmp_path):
    # Before: `--config configs/` was "not found"; `data.alphabet=alphabets/` trained on the characters
    # "alphabets/"; `--lexicon words/` was "Is a directory" without the option.
    with pytest.raises(ConfigError, match=r"^--config .* is a folder; give a YAML file"):
        load_config(str(tmp_path), [])
    (tmp_path / "alphabets").mkdir()
    with pytest.raises(ValueError, match=r"alphabet file '.*alphabets' is a folder; give a file"):
        load_alphabet(str(tmp_path / "alphabets"))
    with pytest.raises(ValueError, match=r"^--lexicon .* is a folder; give a file of words"):
        read_lexicon(tmp_path, CODEC)


def test_create_lmdb_names_a_folder_given_as_gt_and_a_file_given_as_images(tmp_path):
    # Before: both were "does not exist or is not a file/folder": which of the two was not said.
    gt = tmp_path / "gt.txt"
    gt.write_text("a.png\tword\n")
    script = (sys.executable, "scripts/create_lmdb.py", "--out", tmp_path / "lmdb")
    one_line_error(run_command(*script, "--gt", tmp_path, "--images", tmp_path), f"--gt {tmp_path} is a folder")
    one_line_error(run_command(*script, "--gt", gt, "--images", gt), f"--images {gt} is a file")


# --- Which config file, which setting ---------------------------------------------------------------------


def test_a_bare_config_name_meaning_two_different_files_is_refused(tmp_path, monkeypatch):
    # Before: a crnn.yaml in the working folder won over configs/crnn.yaml without a word in the log.
    monkeypatch.chdir(tmp_path)
    shipped = REPO / "configs" / "crnn.yaml"
    shutil.copy(shipped, "crnn.yaml")
    assert load_config("crnn.yaml", []) == load_config(str(shipped), [])  # the same file twice: no doubt
    Path("crnn.yaml").write_text(shipped.read_text() + "\n# mine\n")
    with pytest.raises(ConfigError, match=r"names both \./crnn\.yaml and .*configs/crnn\.yaml, which differ; say"):
        load_config("crnn.yaml", [])
    load_config("./crnn.yaml", [])  # said which: read
    load_config(str(shipped), [])


TYPOS = [("train.resume=auot", "auto"), ("train.resume=None", "none"), ("data.index_cache=of", "off")]


@pytest.mark.parametrize(("override", "meant"), TYPOS)
def test_a_typo_of_a_setting_in_a_path_key_says_what_was_meant(tmp_path, monkeypatch, override, meant):
    # Before: `train.resume=auot` ended in "checkpoint auot does not exist", as if a file were missing.
    monkeypatch.chdir(tmp_path)
    said = rf"^{override}: no such file or folder, nor a setting; did you mean {meant}\?"
    with pytest.raises(ConfigError, match=said):
        load_config(str(REPO / "configs" / "crnn.yaml"), [override])
    Path(override.split("=")[1]).mkdir()  # a folder of that name: the value is a path after all
    load_config(str(REPO / "configs" / "crnn.yaml"), [override])


# --- Outputs that cannot be written, found before the work ------------------------------------------------


def test_an_unwritable_json_is_refused_before_evaluating(checkpoint, synth):
    # Before: the whole evaluation ran, then `error: /sys/.results.json.k2j4x_.tmp: Permission denied`.
    out = unwritable_folder() / "results.json"
    result = run_command(*EVAL, checkpoint, synth / "val", "--json", out)
    one_line_error(result, f"--json {out}: Permission denied")
    assert "accuracy" not in result.stdout and ".tmp" not in result.stderr


def test_an_unwritable_export_is_refused_before_exporting(checkpoint):
    # Before: the export ran for seconds to minutes, then failed naming the temporary file.
    out = unwritable_folder() / "crnn.pt2"
    result = run_command(sys.executable, "scripts/export.py", checkpoint, "--format", "pt2", "--out", out)
    one_line_error(result, f"--out {out}: Permission denied")
    assert "exported" not in result.stdout


def test_a_file_that_cannot_be_created_is_named_not_its_temporary_name(tmp_path):
    out = unwritable_folder() / "notes.txt"
    with pytest.raises(OSError) as raised:
        write_text_atomically(out, "text")
    assert raised.value.filename == str(out)  # was the hidden temporary name: /sys/.notes.txt.abc123.tmp
    with pytest.raises(OSError) as raised:
        check_writable(out, f"--json {out}")
    assert raised.value.filename == f"--json {out}"
    check_writable(tmp_path / "new" / "folders" / "out.json")  # folders the writer makes are no problem
    assert list(tmp_path.iterdir()) == []  # and the probe left nothing


def test_pytorch_warnings_are_counted_once_each():
    # Before: export.py's report sat under 28 FutureWarnings of torch.export, two lines each.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            warnings.warn("_check_is_size will be removed\n  detail", FutureWarning, stacklevel=1)
        warnings.warn("attributes were assigned", UserWarning, stacklevel=1)
    assert pytorch_warnings(caught) == [
        "FutureWarning: _check_is_size will be removed (x3)",
        "UserWarning: attributes were assigned (x1)",
    ]


def test_a_link_named_like_a_leftover_is_not_deleted(tmp_path):
    # Before: remove_leftovers unlinked `.best.pt.abc123.tmp -> notes.txt` with the killed writers' files.
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    link = tmp_path / ".best.pt.abc123.tmp"
    link.symlink_to(notes)
    leftover = tmp_path / ".last.pt.xyz789.tmp"
    leftover.write_bytes(b"half")
    assert remove_leftovers(tmp_path) == [leftover]
    assert link.is_symlink() and notes.read_text() == "mine"


# --- Weights and optimizer moments that are not numbers --------------------------------------------------


def test_a_checkpoint_of_non_finite_weights_is_not_written_over_a_good_one(checkpoint, tmp_path):
    # Before: written; only load_checkpoint refused it, and best.pt or last.pt was no longer a model.
    good = tmp_path / "last.pt"
    shutil.copy(checkpoint, good)
    record = torch.load(checkpoint, weights_only=True)
    record["model"]["backbone.0.weight"].view(-1)[0] = float("inf")
    with pytest.raises(CheckpointError, match=r"^not saving .*last\.pt: weight 'backbone\.0\.weight' holds infinity"):
        save_checkpoint(good, record)
    assert good.read_bytes() == checkpoint.read_bytes() and list(tmp_path.iterdir()) == [good]


def test_non_finite_optimizer_moments_are_refused_at_load(tiny_run, tmp_path):
    # Before: resumed, and the first step's Adam update made every weight it touched NaN.
    record = torch.load(tiny_run / "last.pt", weights_only=True)
    state = record["optimizer"]["state"]
    index = next(iter(state))
    state[index]["exp_avg_sq"].view(-1)[0] = float("nan")
    path = tmp_path / "ckpt.pt"
    torch.save(record, path)
    with pytest.raises(CheckpointError, match=rf"optimizer state '{index}\.exp_avg_sq' holds NaN \(1 value\)"):
        load_checkpoint(path)


# --- A rank that stops answering in the middle of training ------------------------------------------------


def worker_of_rank(rank: int, out_dir: Path) -> int | None:
    """The pid of this run's train.py process of `rank` (torchrun's child), from /proc."""
    for entry in Path("/proc").iterdir():
        try:
            command = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:  # not a process, or gone
            continue
        if f"train.out_dir={out_dir}".encode() in command and f"RANK={rank}".encode() in environ:
            return int(entry.name)
    return None


@pytest.mark.slow
def test_a_rank_stopped_mid_training_is_named_by_the_others(synth, tmp_path):
    # Before: the step's own gradient all-reduce (DDP's, not the project's) timed out with gloo's
    # `Timed out waiting 600000ms for recv operation to complete`, naming no rank.
    out_dir, output = tmp_path / "run", tmp_path / "output.txt"
    with output.open("w") as sink:
        process = start_command(
            *TORCHRUN_TWO,
            *small_training(synth, out_dir),
            "train.max_steps=100000",
            "train.eval_every=100000",
            "train.save_every=100000",
            "train.log_every=1",
            env={"CRNN_COLLECTIVE_TIMEOUT_MINUTES": "0.25", "OMP_NUM_THREADS": "1"},  # 15 s
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 240
        metrics = out_dir / "metrics.jsonl"
        while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 3):
            assert process.poll() is None and time.monotonic() < deadline, output.read_text()[-3000:]
            time.sleep(0.5)
        rank_one = worker_of_rank(1, out_dir)
        assert rank_one is not None
        os.kill(rank_one, signal.SIGSTOP)  # as Ctrl-Z, a hung network file system, a node gone
        while "did not answer" not in output.read_text():
            assert time.monotonic() < deadline, output.read_text()[-3000:]
            time.sleep(0.5)
        time.sleep(1)  # the rest of the line
        text = output.read_text()
        assert "rank 0, in " in text, text[-3000:]
        assert "rank 1 did not answer for 15 s: a process stopped or stuck" in text, text[-3000:]
        assert "Timed out waiting" not in text, text[-3000:]
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
