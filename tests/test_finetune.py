"""configs/finetune_real.yaml: a trained checkpoint fine-tuned on "real" crops whose labels carry
punctuation, half of each batch synthetic. The real crops here are generated ones relabelled the way
real datasets are labelled (capitals, marks, symbols), so the test needs no real images."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from data.lmdb_writer import write_lmdb
from tests.conftest import ALPHABET, SMALL_RUN, read_lmdb, run_command

pytestmark = pytest.mark.slow  # starts real processes: `pytest -m "not slow"` skips it

# How real datasets write labels the 36-character alphabet cannot hold all of.
RELABEL = (
    lambda label: label,
    lambda label: label.upper() + "!",
    lambda label: f'"{label}"',
    lambda label: "$" + label,
)


@pytest.fixture(scope="module")
def real_like(synth, tmp_path_factory):
    """33 relabelled crops in one LMDB, split as the docs say: scripts/split_lmdb.py holds 9 out."""
    folder = tmp_path_factory.mktemp("real")
    samples = [
        (image, RELABEL[index % len(RELABEL)](label)) for index, (image, label) in enumerate(read_lmdb(synth / "val"))
    ]
    write_lmdb(folder / "all", samples)
    run_command(sys.executable, "scripts/split_lmdb.py", folder / "all", "--val", "9", "--out", folder, check=True)
    return folder


def with_marks(lmdb) -> int:
    """How many labels of `lmdb` hold a character the 36-character alphabet lacks, case folded."""
    return sum(1 for _, label in read_lmdb(lmdb) if set(label.lower()) - set(ALPHABET))


def finetune(tiny_run, synth, real_like, out_dir, *overrides: str) -> subprocess.CompletedProcess:
    return run_command(
        sys.executable,
        "train.py",
        "--config",
        "finetune_real.yaml",
        f"train.init_from={tiny_run / 'best.pt'}",
        f"data.train=[{real_like / 'train'},{synth / 'train'}]",
        f"data.val=[{real_like / 'val'}]",
        f"train.out_dir={out_dir}",
        *SMALL_RUN,
        "train.max_steps=4",
        "train.eval_every=4",
        "train.log_every=4",
        *overrides,
        check=True,
    )


def test_finetunes_a_checkpoint_on_labels_with_marks_removed_not_dropped(tiny_run, synth, real_like, tmp_path):
    result = finetune(tiny_run, synth, real_like, tmp_path / "run")
    log = result.stdout + result.stderr
    initial = torch.load(tiny_run / "best.pt", map_location="cpu", weights_only=True)["model"]
    assert f"loaded {len(initial)} of {len(initial)} tensors" in log
    # Every relabelled crop is kept: those with marks and symbols lost them, none was dropped.
    marked = with_marks(real_like / "train")
    assert 10 < marked < 24
    assert f"{real_like / 'train'}: kept 24 of 24; dropped: none" in log
    assert f"{marked} labels lost characters outside the alphabet" in log
    assert f"{real_like / 'val'}: kept 9 of 9; dropped: none" in log
    tuned = torch.load(tmp_path / "run" / "last.pt", map_location="cpu", weights_only=True)["model"]
    assert tuned.keys() == initial.keys()
    assert any(not torch.equal(tuned[name], initial[name]) for name in initial if initial[name].is_floating_point())


def test_dropping_labels_with_unknown_characters_is_still_a_choice(tiny_run, synth, real_like, tmp_path):
    result = finetune(tiny_run, synth, real_like, tmp_path / "run", "data.unknown_characters=drop")
    log = result.stdout + result.stderr
    marked = with_marks(real_like / "train")
    assert f"{real_like / 'train'}: kept {24 - marked} of 24; dropped: {marked} characters outside the alphabet" in log
