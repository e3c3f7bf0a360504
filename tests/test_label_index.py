"""The usable-sample index's cache: hit, miss, stale after a change, one builder among many, a
read-only dataset folder, a cache folder that cannot be written, an entry cut short."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import time
from pathlib import Path

import lmdb
import numpy as np
import pytest
from conftest import ALPHABET, SMALL_RUN, TORCHRUN_TWO, run_command

from data import label_index
from data.codec import CTCCodec
from data.label_index import index_cache_dir, usable_samples

CODEC = CTCCodec(ALPHABET, fold_case=True)


@pytest.fixture
def dataset(synth, tmp_path) -> Path:
    """A private copy of the synthetic val set, free to change."""
    copy = tmp_path / "val"
    shutil.copytree(synth / "val", copy)
    return copy


def test_a_second_open_reads_the_cache_and_gets_what_the_scan_got(dataset, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    scanned, scan_report = usable_samples(dataset, CODEC, 26, cache_dir=cache)
    assert scan_report.source.startswith("labels scanned in ") and "cached in" in scan_report.source
    monkeypatch.setattr(label_index, "scan_labels", lambda *args: pytest.fail("the cache was not used"))
    cached, cache_report = usable_samples(dataset, CODEC, 26, cache_dir=cache)
    assert cache_report.source.startswith("index read from ")
    assert isinstance(cached, np.memmap) and cached.dtype == np.int32
    assert cached.tolist() == scanned.tolist()
    assert cache_report.to_json() == scan_report.to_json() and cache_report.summary() == scan_report.summary()


def test_the_cache_gives_what_an_uncached_scan_gives(synth, tmp_path):
    uncached, uncached_report = usable_samples(synth / "train", CODEC, 26)
    for _ in range(2):  # built, then read
        cached, cached_report = usable_samples(synth / "train", CODEC, 26, cache_dir=tmp_path)
        assert cached.tolist() == uncached.tolist() and cached_report.to_json() == uncached_report.to_json()


def test_other_scan_settings_are_other_entries(dataset, tmp_path):
    cache = tmp_path / "cache"
    usable_samples(dataset, CODEC, 26, cache_dir=cache)
    for codec, frames in (
        (CTCCodec(ALPHABET, fold_case=True), 4),
        (CTCCodec("0123456789"), 26),
        (CTCCodec(ALPHABET, fold_case=False), 26),
    ):
        kept, report = usable_samples(dataset, codec, frames, cache_dir=cache)
        assert report.source.startswith("labels scanned"), (codec.alphabet, frames)
        assert kept.tolist() == usable_samples(dataset, codec, frames)[0].tolist()
    assert len(list(cache.glob("*.npy"))) == 4


def test_a_changed_lmdb_is_scanned_again_not_read_from_a_stale_entry(dataset, tmp_path):
    cache = tmp_path / "cache"
    before, _ = usable_samples(dataset, CODEC, 26, cache_dir=cache)
    with lmdb.open(str(dataset)) as env, env.begin(write=True) as txn:  # one more sample, as create_lmdb appends
        count = int(txn.get(b"num-samples"))
        txn.put(b"image-%09d" % (count + 1), txn.get(b"image-000000001"))
        txn.put(b"label-%09d" % (count + 1), b"added")
        txn.put(b"num-samples", str(count + 1).encode())
    after, report = usable_samples(dataset, CODEC, 26, cache_dir=cache)
    assert report.source.startswith("labels scanned")
    assert after.tolist() == [*before.tolist(), count + 1]


def _open_at_once(barrier, results, dataset: str, cache: str) -> None:
    barrier.wait()
    kept, report = usable_samples(dataset, CODEC, 26, cache_dir=Path(cache))
    results.put((report.source, kept.tolist()))


def test_processes_starting_together_scan_once_and_the_others_wait_for_it(dataset, tmp_path, monkeypatch):
    real_scan = label_index.scan_labels

    def slow_scan(*args):  # wide enough that every process finds no entry before the first one is done
        time.sleep(1.0)
        return real_scan(*args)

    monkeypatch.setattr(label_index, "scan_labels", slow_scan)
    context = multiprocessing.get_context("fork")  # the children inherit the slow scan
    barrier, results = context.Barrier(4), context.Queue()
    workers = [
        context.Process(target=_open_at_once, args=(barrier, results, str(dataset), str(tmp_path / "cache")))
        for _ in range(4)
    ]
    for worker in workers:
        worker.start()
    answers = [results.get(timeout=60) for _ in workers]
    for worker in workers:
        worker.join(timeout=60)
    sources = sorted(" ".join(source.split(" ")[:2]) for source, _ in answers)
    assert sources == ["index built", "index built", "index built", "labels scanned"], [source for source, _ in answers]
    assert all(kept == answers[0][1] for _, kept in answers) and answers[0][1]


def test_a_read_only_dataset_folder_is_cached_elsewhere_and_left_untouched(dataset, tmp_path):
    listing = sorted(path.name for path in dataset.iterdir())
    os.chmod(dataset / "data.mdb", 0o444)
    os.chmod(dataset, 0o555)
    try:
        cache = tmp_path / "cache"
        for expected in ("labels scanned", "index read"):
            kept, report = usable_samples(dataset, CODEC, 26, cache_dir=cache)
            assert report.source.startswith(expected) and len(kept) == report.kept > 0
        assert sorted(path.name for path in dataset.iterdir()) == listing
        assert len(list(cache.glob("*.npy"))) == 1
    finally:
        os.chmod(dataset, 0o755)


def test_a_cache_folder_that_cannot_be_written_falls_back_to_scanning_and_says_how_to_fix_it(dataset, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    kept, report = usable_samples(dataset, CODEC, 26, cache_dir=blocker / "cache")
    assert kept.tolist() == usable_samples(dataset, CODEC, 26)[0].tolist()
    assert "not cached" in report.source and str(blocker / "cache") in report.source
    assert "data.index_cache" in report.source


def test_an_entry_cut_short_is_built_again(dataset, tmp_path):
    cache = tmp_path / "cache"
    kept = usable_samples(dataset, CODEC, 26, cache_dir=cache)[0].tolist()
    entry = next(cache.glob("*.npy"))
    entry.write_bytes(entry.read_bytes()[:100])
    again, report = usable_samples(dataset, CODEC, 26, cache_dir=cache)
    assert report.source.startswith("labels scanned") and again.tolist() == kept


def test_the_cache_folder_setting(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert index_cache_dir("auto") == tmp_path / "crnn-ocr" / "lmdb-index"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert index_cache_dir("auto") == Path.home() / ".cache" / "crnn-ocr" / "lmdb-index"
    assert index_cache_dir("off") is None
    assert index_cache_dir(str(tmp_path / "x")) == tmp_path / "x"


@pytest.mark.slow
def test_a_restarted_ddp_run_reads_its_index_from_the_cache(synth, dataset, tmp_path):
    cache = tmp_path / "cache"

    def train(out_dir: Path) -> str:
        return run_command(
            *TORCHRUN_TWO,
            "train.py",
            "--config",
            "crnn.yaml",
            f"data.train=[{dataset}]",
            f"data.val=[{synth / 'val'}]",
            f"data.index_cache={cache}",
            f"train.out_dir={out_dir}",
            *SMALL_RUN,
            "train.max_steps=1",
            check=True,
        ).stdout

    # The first run's two processes build the two entries (data.train, data.val) between them, each
    # built by whichever came first; the restart reads both.
    assert "sample index: " in train(tmp_path / "first") and len(list(cache.glob("*.npy"))) == 2
    assert train(tmp_path / "second").count("sample index: index read from") == 2
