"""scripts/split_lmdb.py on real LMDB files: every sample lands in exactly one split, unchanged, drawn by
the seed; bad input is refused before anything is written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import lmdb
import pytest

from data.lmdb_writer import write_lmdb
from scripts import split_lmdb
from tests.conftest import read_lmdb

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "split_lmdb.py"


def make_source(path: Path, name: str, count: int) -> list[tuple[bytes, str, bytes]]:
    """An LMDB of `count` samples whose bytes say where they came from, each with a meta key."""
    samples = [(f"{name} image {i}".encode(), f"{name}{i}", f"{name} meta {i}".encode()) for i in range(count)]
    write_lmdb(path, samples)
    return samples


def read_meta(path: Path) -> list[bytes]:
    with lmdb.open(str(path), readonly=True, lock=False) as env, env.begin() as txn:
        count = int(txn.get(b"num-samples"))
        return [txn.get(b"meta-%09d" % i) for i in range(1, count + 1)]


@pytest.fixture
def sources(tmp_path) -> tuple[list[Path], list[tuple[bytes, str, bytes]]]:
    paths = [tmp_path / "first", tmp_path / "second"]
    return paths, make_source(paths[0], "a", 40) + make_source(paths[1], "b", 13)


def split(sources: list[Path], out: Path, *options: str) -> tuple[list, list]:
    split_lmdb.main([*map(str, sources), "--out", str(out), *options])
    return read_lmdb(out / "train"), read_lmdb(out / "val")


def test_every_sample_lands_in_one_split_unchanged_in_source_order(sources, tmp_path, capsys):
    paths, samples = sources
    train, val = split(paths, tmp_path / "out", "--val", "10", "--seed", "3")
    from_first = sum(label.startswith("a") for _, label in val)
    assert (
        f"wrote 10 samples to {tmp_path / 'out' / 'val'} ({from_first} from {paths[0]}, {10 - from_first} from"
        f" {paths[1]})" in capsys.readouterr().out
    )
    assert len(val) == 10 and len(train) == 43
    by_image = {image: (label, meta) for image, label, meta in samples}
    for folder, split_samples in (("train", train), ("val", val)):
        for (image, label), meta in zip(split_samples, read_meta(tmp_path / "out" / folder)):
            assert by_image[image] == (label, meta)  # label and meta copied with their image
    order = [image for image, _, _ in samples]
    assert sorted(image for image, _ in train + val) == sorted(order)
    for split_samples in (train, val):
        positions = [order.index(image) for image, _ in split_samples]
        assert positions == sorted(positions)
    assert {label[0] for _, label in val} == {"a", "b"}  # drawn from the pool, not from one source


def test_the_seed_decides_which_samples_are_held_out(sources, tmp_path):
    paths, _ = sources
    _, val = split(paths, tmp_path / "one", "--val", "10")
    _, again = split(paths, tmp_path / "again", "--val", "10")
    _, other = split(paths, tmp_path / "other", "--val", "10", "--seed", "1")
    assert val == again
    assert val != other


def test_a_share_holds_out_that_part_of_the_pool(sources, tmp_path):
    paths, _ = sources
    train, val = split(paths, tmp_path / "out", "--val", "10%")
    assert (len(train), len(val)) == (48, 5)  # 10 % of 53, rounded


def test_indexes_without_an_image_or_a_label_are_left_out_and_reported(tmp_path, capsys):
    source = tmp_path / "gappy"
    make_source(source, "a", 6)
    with lmdb.open(str(source)) as env, env.begin(write=True) as txn:
        txn.delete(b"image-000000002")
        txn.delete(b"label-000000005")
    train, val = split([source], tmp_path / "out", "--val", "1")
    assert sorted(label for _, label in train + val) == ["a0", "a2", "a3", "a5"]
    assert "left out 2 index(es) without both an image and a label" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--val", "53"], "--val takes 53 of the 53 labelled samples"),
        (["--val", "100%"], "give a count of samples (672) or a share between 0 and 100 % (10%)"),
        (["--val", "0"], "give a count of samples"),
        (["--val", "ten"], "give a count of samples"),
    ],
)
def test_a_held_out_count_that_leaves_a_split_empty_is_refused(sources, tmp_path, options, message, capsys):
    paths, _ = sources
    with pytest.raises((ValueError, SystemExit)) as raised:
        split(paths, tmp_path / "out", *options)
    assert message in (str(raised.value) if raised.type is ValueError else capsys.readouterr().err)
    assert not (tmp_path / "out").exists()


def test_a_label_that_is_not_utf8_is_named_and_nothing_is_written(sources, tmp_path):
    paths, _ = sources
    with lmdb.open(str(paths[1])) as env, env.begin(write=True) as txn:
        txn.put(b"label-000000004", b"caf\xe9")
    with pytest.raises(ValueError, match=r"second: label 4 is not valid UTF-8.*nothing was written"):
        split(paths, tmp_path / "out", "--val", "5")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_the_command_refuses_existing_splits_and_a_source_given_twice(sources, tmp_path):
    paths, _ = sources
    out = tmp_path / "out"
    split(paths, out, "--val", "5")
    before = read_lmdb(out / "val")

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=tmp_path)

    refused = run(*map(str, paths), "--out", str(out), "--val", "7")
    assert refused.returncode == 1
    assert f"error: {out / 'train'} already exists; remove it or pass --overwrite" in refused.stderr
    assert read_lmdb(out / "val") == before
    twice = run(str(paths[0]), str(paths[0]), "--out", str(tmp_path / "other"), "--val", "2")
    assert twice.returncode == 1 and "an LMDB is given twice" in twice.stderr
    into_a_source = run(str(tmp_path / "out" / "train"), "--out", str(out), "--val", "2", "--overwrite")
    assert into_a_source.returncode == 1 and "would write over" in into_a_source.stderr
    replaced = run(*map(str, paths), "--out", str(out), "--val", "7", "--overwrite")
    assert replaced.returncode == 0, replaced.stderr
    assert len(read_lmdb(out / "val")) == 7


def test_stopped_while_writing_train_the_splits_already_there_stay_a_matching_pair(sources, tmp_path, monkeypatch):
    """Written one after the other, a stop while writing train left a new val beside the old train,
    which held some of the new val's samples: the two are put in place together."""
    paths, _ = sources
    out = tmp_path / "out"
    before = split(paths, out, "--val", "10")
    real_copied = split_lmdb.copied_samples
    calls = []

    def stopped_in_the_second_split(*args):
        calls.append(args)
        for number, sample in enumerate(real_copied(*args)):
            if len(calls) == 2 and number == 3:
                raise KeyboardInterrupt  # Ctrl-C, three samples into the second split
            yield sample

    monkeypatch.setattr(split_lmdb, "copied_samples", stopped_in_the_second_split)
    with pytest.raises(KeyboardInterrupt):
        split(paths, out, "--val", "10", "--seed", "1", "--overwrite")
    assert len(calls) == 2
    assert (read_lmdb(out / "train"), read_lmdb(out / "val")) == before
    assert sorted(path.name for path in out.iterdir()) == ["train", "val"]  # no staging folder left
