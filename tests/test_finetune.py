"""configs/finetune_real.yaml: a trained checkpoint fine-tuned on "real" crops whose labels carry
punctuation, half of each batch synthetic. The real crops here are generated ones relabelled the way
real datasets are labelled (capitals, marks, symbols), so the test needs no real images."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from data.lmdb_writer import write_lmdb
from tests.conftest import ALPHABET, SMALL_RUN, TORCHRUN_TWO, read_lmdb, run_command

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
        f"data.retain=[{synth / 'val'}]",
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


@pytest.fixture(scope="module")
def reading_start(tmp_path_factory):
    """A model that reads: 200 steps on one-letter crops of `a` and `b` (about 40 s), and its data."""
    data = tmp_path_factory.mktemp("ab")
    make = (sys.executable, "scripts/make_synthetic.py", "--out", data, "--train", "200", "--val", "20", "--test", "0")
    run_command(*make, "--alphabet", "ab", "--no-words", "--max-length", "1", "--workers", "1", check=True)
    out_dir = tmp_path_factory.mktemp("runs") / "start"
    run_command(
        sys.executable,
        "train.py",
        "--config",
        "crnn.yaml",
        *ab_run(data, out_dir),
        "train.max_steps=200",
        "train.eval_every=200",
        "data.augment=none",
        "optim.lr=3e-3",
        check=True,
    )
    return data, out_dir / "best.pt"


def ab_run(data, out_dir) -> tuple[str, ...]:
    return (
        *SMALL_RUN,
        "train.batch_size=16",
        "train.max_minutes=null",
        "data.alphabet=ab",
        f"data.train=[{data / 'train'}]",
        f"data.val=[{data / 'val'}]",
        f"train.out_dir={out_dir}",
    )


def test_a_finetune_that_only_does_harm_ends_with_its_start_as_best(reading_start, tmp_path):
    # Before: best.pt was the first validated step's model, however much worse than the start (here the
    # start reads 0.65 of data.val; 2 steps at optim.lr=5 leave 0.55, then 0.45), and the weight average
    # validated before any step was the model as built, not the start.
    data, start = reading_start
    recorded = torch.load(start, weights_only=True)
    assert recorded["accuracy"] > 0  # a start worth keeping
    out_dir = tmp_path / "wrecked"
    result = run_command(
        sys.executable,
        "train.py",
        "--config",
        "crnn.yaml",
        *ab_run(data, out_dir),
        f"train.init_from={start}",
        f"data.retain=[{data / 'train'}]",
        "optim.lr=5",  # wrecks it
        "optim.warmup_steps=0",
        "train.max_steps=4",
        "train.eval_every=2",
        "train.log_every=2",
        check=True,
    )
    said = f"the start (train.init_from {start}) reads data.val at {recorded['accuracy']:.4f} before the first step"
    assert said in result.stdout + result.stderr
    best = torch.load(out_dir / "best.pt", weights_only=True)
    assert best["step"] == 0 and best["accuracy"] == recorded["accuracy"]
    assert all(torch.equal(best["model"][key], tensor) for key, tensor in recorded["model"].items())
    # The run's end compares the start with best.pt on data.val and data.retain: here the same weights.
    val, retain = str(data / "val"), str(data / "train")
    assert best["start_readings"] == best["readings"] and best["readings"][val] == recorded["accuracy"]
    lines = (result.stdout + result.stderr).splitlines()
    report = lines.index(
        f"the start (train.init_from {start}) against best.pt, word accuracy on each set it read: best.pt is the "
        f"start, no step read data.val better"
    )
    retained = 100 * best["readings"][retain]
    assert lines[report + 2].split() == [
        "data.retain",
        retain,
        f"{retained:.2f}",
        "%",
        "->",
        f"{retained:.2f}",
        "%",
        "(+0.00)",
    ]


def test_the_start_is_compared_with_best_after_a_resume_and_a_retained_set_never_picks_best(reading_start, tmp_path):
    data, start = reading_start
    out_dir = tmp_path / "tuned"
    common = (*ab_run(data, out_dir), f"train.init_from={start}", f"data.retain=[{data / 'train'}]")
    train = (sys.executable, "train.py", "--config", "crnn.yaml", *common, "train.eval_every=2", "train.save_every=2")
    run_command(*train, "train.max_steps=2", check=True)
    first = torch.load(out_dir / "last.pt", weights_only=True)
    resumed = run_command(*train, "train.max_steps=4", check=True)  # train.resume=auto: from step 2
    log = resumed.stdout + resumed.stderr
    assert "resumed from" in log and "reads data.val at" not in log  # the start is not read again...
    best = torch.load(out_dir / "best.pt", weights_only=True)
    assert best["start_readings"] == first["start_readings"]  # ...its readings travel in the checkpoints
    assert set(best["start_readings"]) == {str(data / "val"), str(data / "train")}
    assert f"the start (train.init_from {start}) against best.pt" in log
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    retained = [record for record in records if record.get("retain") == str(data / "train")]
    assert [record["step"] for record in retained] == [0, 2, 4]
    # best.pt is chosen on data.val alone: its accuracy is data.val's at its step.
    chosen = [r for r in records if r.get("val") == str(data / "val") and r["step"] == best["step"]]
    assert best["accuracy"] == chosen[0]["accuracy"]


def test_a_frozen_backbone_is_left_as_the_start_had_it_under_ddp(reading_start, tmp_path):
    data, start = reading_start
    out_dir = tmp_path / "frozen"
    run_command(
        *TORCHRUN_TWO,
        "train.py",
        "--config",
        "crnn.yaml",
        *ab_run(data, out_dir),
        f"train.init_from={start}",
        "train.freeze_backbone_steps=2",
        "optim.warmup_steps=0",
        "train.max_steps=3",
        "train.save_every=1",
        "train.keep_checkpoints=3",
        check=True,
    )
    initial = torch.load(start, weights_only=True)["model"]
    frozen, thawed = (torch.load(out_dir / f"ckpt-{step:07d}.pt", weights_only=True)["raw_model"] for step in (2, 3))
    backbone = [key for key in initial if key.startswith("backbone.")]
    assert any("running_mean" in key for key in backbone)  # BatchNorm statistics are held too
    assert all(torch.equal(frozen[key], initial[key]) for key in backbone)
    assert not all(torch.equal(frozen[key], initial[key]) for key in initial if key.startswith("sequence."))
    assert not all(torch.equal(thawed[key], initial[key]) for key in backbone if key.endswith("weight"))


def test_freezing_the_backbone_without_a_start_is_refused(synth, tmp_path):
    result = run_command(
        sys.executable,
        "train.py",
        "--config",
        "crnn.yaml",
        *ab_run(synth, tmp_path / "run"),
        "train.freeze_backbone_steps=5",
    )
    assert result.returncode == 1
    assert "train.freeze_backbone_steps=5 without train.init_from" in result.stderr
