from __future__ import annotations

import io
import os

import lmdb
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from data.codec import CTCCodec
from data.lmdb_dataset import CollateBatch, LmdbDataset
from data.lmdb_keys import LabelNotUtf8, read_label
from data.lmdb_writer import write_lmdb
from data.transforms import ImageTransform, Preprocessing

ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"


def png(width: int = 60, height: int = 20, color: int = 128) -> bytes:
    buffer = io.BytesIO()
    Image.new("L", (width, height), color).save(buffer, format="PNG")
    return buffer.getvalue()


def transform() -> ImageTransform:
    return ImageTransform(Preprocessing(32, 100))


def edit_lmdb(path, put: dict[bytes, bytes] | None = None, delete: list[bytes] = ()) -> None:
    """Damage a finished LMDB in place: overwrite or delete keys, as a bad converter or a cut copy would."""
    env = lmdb.open(str(path), map_size=1 << 30)
    with env.begin(write=True) as txn:
        for key, value in (put or {}).items():
            txn.put(key, value)
        for key in delete:
            assert txn.delete(key), key
    env.close()


@pytest.fixture
def messy_lmdb(tmp_path):
    samples = [
        (png(), "hello"),
        (png(), "WORLD"),  # folded to lowercase: kept
        (png(), ""),  # empty label
        (png(), "héllo"),  # é is outside the alphabet
        (png(), "a" * 14),  # 14 + 13 repeats = 27 frames > 26
        (png(), "b" * 13),  # 13 + 12 repeats = 25 frames: fits
        (b"not an image at all", "broken"),  # kept by the label filter, dropped when decoded
        (png(), "x" * 26),  # 26 + 25 repeats: too long
    ]
    path = tmp_path / "messy"
    write_lmdb(path, samples)
    return path


def test_filtering_counts_each_reason(messy_lmdb):
    dataset = LmdbDataset(messy_lmdb, CTCCodec(ALPHABET, fold_case=True), max_frames=26, transform=transform())
    report = dataset.report
    assert report.total == 8 and report.kept == len(dataset) == 4
    assert report.dropped == {"empty label": 1, "characters outside the alphabet": 1, "too long for CTC": 2}
    assert report.unknown_characters == {"é": 1}
    assert "kept 4 of 8" in report.summary() and "'é'" in report.summary()
    labels = [dataset[i][1] if dataset[i] else None for i in range(len(dataset))]
    assert labels == ["hello", "world", "b" * 13, None]  # the undecodable image comes back as None


def test_undecodable_images_are_dropped_from_the_batch_and_counted(messy_lmdb):
    dataset = LmdbDataset(messy_lmdb, CTCCodec(ALPHABET, fold_case=True), 26, transform())
    batch = CollateBatch(dataset.codec, (1, 32, 100))([dataset[i] for i in range(len(dataset))])
    assert batch.num_dropped == 1 and batch.labels == ["hello", "world", "b" * 13]
    assert batch.images.shape == (3, 1, 32, 100)
    assert batch.target_lengths.tolist() == [5, 5, 13] and batch.targets.numel() == 23
    empty = CollateBatch(dataset.codec, (1, 32, 100))([None, None])
    assert empty.images.shape == (0, 1, 32, 100) and empty.num_dropped == 2 and empty.labels == []


@pytest.mark.slow
def test_reading_with_two_spawned_workers(messy_lmdb):
    dataset = LmdbDataset(messy_lmdb, CTCCodec(ALPHABET, fold_case=True), 26, transform())
    loader = DataLoader(
        dataset,
        batch_size=2,
        num_workers=2,
        multiprocessing_context="spawn",
        collate_fn=CollateBatch(dataset.codec, (1, 32, 100)),
    )
    batches = list(loader)
    assert [label for batch in batches for label in batch.labels] == ["hello", "world", "b" * 13]
    assert sum(batch.num_dropped for batch in batches) == 1


def test_dataset_is_opened_read_only(messy_lmdb):
    before = (messy_lmdb / "data.mdb").read_bytes()
    os.chmod(messy_lmdb / "data.mdb", 0o444)
    dataset = LmdbDataset(messy_lmdb, CTCCodec(ALPHABET, fold_case=True), 26, transform())
    assert dataset[0][1] == "hello"
    assert (messy_lmdb / "data.mdb").read_bytes() == before


def test_images_are_normalised_to_minus_one_one_and_resized():
    image = ImageTransform(Preprocessing(32, 100))(png(color=255))
    assert image.shape == (1, 32, 100) and torch.allclose(image, torch.ones_like(image))
    rgb = ImageTransform(Preprocessing(32, 100, "RGB"))(png(color=0))
    assert rgb.shape == (3, 32, 100) and torch.allclose(rgb, -torch.ones_like(rgb))


def test_keep_aspect_pads_on_the_right_by_repeating_the_last_column():
    buffer = io.BytesIO()
    image = Image.new("L", (20, 32), 0)
    image.paste(255, (19, 0, 20, 32))  # a white last column
    image.save(buffer, format="PNG")
    tensor = ImageTransform(Preprocessing(32, 100, keep_aspect=True))(buffer.getvalue())
    assert tensor.shape == (1, 32, 100)
    assert tensor[0, :, 0].max() < 0 and torch.allclose(tensor[0, :, 30:], torch.ones(32, 70))


def test_missing_folder_and_bad_lmdbs_are_named(tmp_path):
    codec = CTCCodec(ALPHABET)
    with pytest.raises(FileNotFoundError, match=r"LMDB folder .*nope does not exist"):
        LmdbDataset(tmp_path / "nope", codec, 26, transform())
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"empty holds no data.mdb"):
        LmdbDataset(tmp_path / "empty", codec, 26, transform())
    env = lmdb.open(str(tmp_path / "nocount"), map_size=1 << 20)
    with env.begin(write=True) as txn:
        txn.put(b"image-000000001", png())
    env.close()
    with pytest.raises(ValueError, match=r"nocount: the LMDB has no 'num-samples' key"):
        LmdbDataset(tmp_path / "nocount", codec, 26, transform())


@pytest.mark.parametrize(
    "value, message",
    [
        (b"twelve", r"'num-samples' is b'twelve', not an integer"),
        (b"", r"'num-samples' is b'', not an integer"),
        (b"-3", r"'num-samples' is -3; it must count the samples"),
    ],
)
def test_a_num_samples_that_is_not_a_count_is_named_with_the_folder(tmp_path, value, message):
    write_lmdb(tmp_path / "badcount", [(png(), "a")])
    edit_lmdb(tmp_path / "badcount", put={b"num-samples": value})
    with pytest.raises(ValueError, match=r"badcount: " + message):
        LmdbDataset(tmp_path / "badcount", CTCCodec(ALPHABET), 26, transform())


def test_num_samples_larger_than_the_keys_drops_and_reports_the_missing_samples(tmp_path):
    """A copy cut short (num-samples 8, keys up to 5) and a sample whose image key is gone."""
    path = tmp_path / "short"
    write_lmdb(path, [(png(), word) for word in ["one", "two", "three", "four", "five"]])
    edit_lmdb(path, put={b"num-samples": b"8"}, delete=[b"image-000000002"])
    dataset = LmdbDataset(path, CTCCodec(ALPHABET), 26, transform())
    report = dataset.report
    assert report.total == 8 and report.present == 5 and report.kept == len(dataset) == 4
    assert report.dropped == {"missing label": 3, "missing image": 1}
    assert report.summary() == (
        f"{path}: kept 4 of 8; dropped: 3 missing label, 1 missing image\n"
        "  num-samples is 8 but only 5 samples exist: the LMDB was cut short or num-samples is"
        " wrong (scripts/create_lmdb.py writes it)"
    )
    assert [dataset[i][1] for i in range(len(dataset))] == ["one", "three", "four", "five"]


def test_a_complete_lmdb_reports_no_missing_samples(messy_lmdb):
    report = LmdbDataset(messy_lmdb, CTCCodec(ALPHABET, fold_case=True), 26, transform()).report
    assert report.present == report.total == 8 and "only" not in report.summary()


def test_write_lmdb_refuses_to_overwrite(tmp_path):
    write_lmdb(tmp_path / "set", [(png(), "a")])
    with pytest.raises(FileExistsError, match="--overwrite"):
        write_lmdb(tmp_path / "set", [(png(), "b")])


def test_one_lmdb_behind_two_datasets_in_one_process(messy_lmdb):
    """Train and val on the same folder: py-lmdb refuses a second environment for one file."""
    codec = CTCCodec(ALPHABET, fold_case=True)
    first, second = (LmdbDataset(messy_lmdb, codec, 26, transform()) for _ in range(2))
    assert first[0][1] == second[0][1] == "hello"


def test_a_label_that_is_not_utf8_reads_with_replacement_characters_everywhere(tmp_path):
    """One reader for every command: U+FFFD for the bad bytes, the same text for training and the strict
    reader inspect_lmdb.py uses to count such labels; no label key reads as None."""
    path = tmp_path / "latin1"
    write_lmdb(path, [(png(), "caf"), (png(), "abc")])
    edit_lmdb(path, put={b"label-000000001": "café".encode("latin-1")}, delete=[b"label-000000002"])
    with lmdb.open(str(path), readonly=True, lock=False) as env, env.begin(buffers=True) as txn:
        assert read_label(txn, 1) == "caf\ufffd" and read_label(txn, 2) is None
        with pytest.raises(LabelNotUtf8, match="label 1 is not valid UTF-8; training reads it with U\\+FFFD") as error:
            read_label(txn, 1, strict=True)
        assert error.value.text == "caf\ufffd"
    dataset = LmdbDataset(path, CTCCodec(ALPHABET + "\ufffd"), 26, transform())
    assert dataset.report.dropped == {"missing label": 1} and dataset[0][1] == "caf\ufffd"
