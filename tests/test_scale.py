"""The scale harness: tools/make_scale_lmdb.py writes a readable LMDB of real words, and
tools/scale_check.py measures what docs/data.md reports (at a small N here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import ALPHABET, REPO, run_command, run_env

from data.codec import CTCCodec
from data.label_index import usable_samples
from data.lmdb_dataset import LmdbDataset
from data.transforms import ImageTransform, Preprocessing

WORDS = set((REPO / "synthetic" / "words" / "english.txt").read_text().split())


def make_scale_lmdb(out, samples: int, *extra: str) -> subprocess.CompletedProcess:
    return run_command(
        sys.executable,
        "tools/make_scale_lmdb.py",
        "--out",
        out,
        "--samples",
        samples,
        "--variants",
        "3",
        *extra,
        timeout=120,
    )


def test_the_scale_lmdb_holds_real_words_and_decodable_images_in_the_field_s_format(tmp_path):
    result = make_scale_lmdb(tmp_path / "scale", 2500)
    assert result.returncode == 0, result.stderr
    assert "2,500 samples" in result.stdout
    dataset = LmdbDataset(
        tmp_path / "scale", CTCCodec(ALPHABET, fold_case=True), 26, ImageTransform(Preprocessing(32, 100))
    )
    assert dataset.report.total == dataset.report.present == 2500 and dataset.report.kept == 2500
    labels = [dataset[position][1] for position in (0, 1, 2, 2499)]
    assert all(label.lower() in {word.lower() for word in WORDS} for label in labels)
    assert len(set(labels)) == 4
    images = [dataset[position][0] for position in range(4)]
    assert images[0].shape == (1, 32, 100) and not images[0].equal(images[1]) and images[0].equal(images[3])


def test_the_scale_lmdb_is_not_written_over_without_overwrite(tmp_path):
    assert make_scale_lmdb(tmp_path / "scale", 10).returncode == 0
    refused = make_scale_lmdb(tmp_path / "scale", 20)
    assert refused.returncode != 0 and "--overwrite" in refused.stderr
    assert make_scale_lmdb(tmp_path / "scale", 20, "--overwrite").returncode == 0
    assert usable_samples(tmp_path / "scale", CTCCodec(ALPHABET, fold_case=True), 26)[1].total == 20


@pytest.mark.slow
def test_scale_check_measures_memory_sampling_and_reading(synth, tmp_path):
    for name, samples in (("big", 3000), ("small", 600)):
        assert make_scale_lmdb(tmp_path / name, samples).returncode == 0
    result = subprocess.run(
        [
            sys.executable,
            "tools/scale_check.py",
            "--big",
            str(tmp_path / "big"),
            "--small",
            str(tmp_path / "small"),
            "--val",
            str(synth / "val"),
            "--only",
            "memory",
            "sampler",
            "reading",
            "--memory-steps",
            "10",
            "20",
            "--read-batches",
            "4",
            "--json",
            str(tmp_path / "scale.json"),
        ],
        cwd=REPO,
        env=run_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    figures = json.loads((tmp_path / "scale.json").read_text())
    assert [snapshot["step"] >= wanted for snapshot, wanted in zip(figures["memory"], (10, 20))] == [True, True]
    roles = [process["role"] for process in figures["memory"][0]["processes"]]
    assert roles.count("trainer") == 2 and roles.count("worker") >= 4  # 2 training + 2 validation workers each
    assert all(process["private"] > 0 for process in figures["memory"][0]["processes"])
    ratios, shuffled = figures["sampler"]
    assert ratios["samples"] == shuffled["samples"] == 14_442_048 and ratios["per_batch_ms"] > 0
    assert figures["reading_images_per_s"]["big"] > 0 and figures["reading_images_per_s"]["small"] > 0


def test_the_scale_lmdb_gets_the_permissions_of_the_umask(tmp_path):
    """Like every LMDB the project writes (data.lmdb_writer.FILE_MODE): a group-writable umask gives
    group-writable files, not py-lmdb's 0644, and the folder is not mkdtemp's 0700."""
    result = subprocess.run(
        [
            sys.executable,
            "tools/make_scale_lmdb.py",
            "--out",
            str(tmp_path / "scale"),
            "--samples",
            "10",
            "--variants",
            "1",
        ],
        cwd=REPO,
        env=run_env(),
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: os.umask(0o002),
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "scale").stat().st_mode & 0o777 == 0o775
    assert (tmp_path / "scale" / "data.mdb").stat().st_mode & 0o777 == 0o664
