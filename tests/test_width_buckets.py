"""Evaluation batched by width where the aspect ratio is kept: each image is padded to the next multiple
of data.eval_width_step, batches hold one width, and the results do not depend on the batching."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from data.alphabet import load_alphabet
from data.codec import CTCCodec
from data.lmdb_dataset import LmdbDataset
from data.loaders import build_eval_loader
from data.samplers import width_batches
from data.transforms import ImageTransform, Preprocessing, build_transform, image_size
from tests.conftest import ALPHABET, REPO, read_lmdb, run_env
from training.checkpoint import load_checkpoint, load_model, save_checkpoint
from utils.distributed import DistEnv


def test_width_batches_hold_one_width_and_every_position_once():
    widths = np.array([100, 24, 48, 24, 100, 8, 24, 48, 100, 100, 24])
    per_rank = [width_batches(widths, 2, rank, 2) for rank in range(2)]
    batches = [batch for rank in per_rank for batch in rank]
    assert sorted(position for batch in batches for position in batch) == list(range(len(widths)))
    assert all(len({widths[p] for p in batch}) == 1 and len(batch) <= 2 for batch in batches)
    alone = width_batches(widths, 2, 0, 1)  # one process: narrowest first, dealt to ranks in turn
    assert [widths[batch[0]] for batch in alone] == [8, 24, 24, 48, 100, 100]
    assert per_rank[0] == alone[0::2] and per_rank[1] == alone[1::2]


def test_an_image_is_padded_to_the_next_step_and_reads_like_the_full_width_one(synth):
    image_bytes, _ = read_lmdb(synth / "val")[0]
    full = ImageTransform(Preprocessing(32, 100, keep_aspect=True))(image_bytes)
    stepped = ImageTransform(Preprocessing(32, 100, keep_aspect=True), width_step=8)(image_bytes)
    resized = ImageTransform(Preprocessing(32, 100, keep_aspect=True)).resized_width(*image_size(image_bytes))
    assert stepped.shape[-1] == min(100, -(-resized // 8) * 8) and full.shape[-1] == 100
    # The same pixels and the same repeated last column, only fewer of them.
    assert torch.equal(stepped, full[..., : stepped.shape[-1]])
    # Stretched images (keep_aspect false) are always img_width wide, whatever the step.
    assert ImageTransform(Preprocessing(32, 100), width_step=8)(image_bytes).shape[-1] == 100


def test_the_eval_loader_batches_by_width_and_keeps_every_sample(synth):
    codec = CTCCodec(load_alphabet(ALPHABET), fold_case=True)
    env = DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))
    stepped = LmdbDataset(
        synth / "val", codec, 26, ImageTransform(Preprocessing(32, 100, keep_aspect=True), width_step=8)
    )
    widths = []
    for batch in build_eval_loader(stepped, codec, 4, 0, env):
        assert len({image.shape[-1] for image in batch.images}) == 1
        widths += [batch.images.shape[-1]] * (len(batch.labels) + batch.num_dropped)
    assert len(widths) == len(stepped) and min(widths) < 100 and max(widths) <= 100
    assert widths == sorted(widths)  # narrowest first
    assert sorted(widths) == sorted(stepped.padded_widths().tolist())
    # eval_width_step 0: every image at img_width, as in training.
    full = LmdbDataset(synth / "val", codec, 26, ImageTransform(Preprocessing(32, 100, keep_aspect=True)))
    assert {batch.images.shape[-1] for batch in build_eval_loader(full, codec, 4, 0, env)} == {100}


@pytest.fixture(scope="module")
def keep_aspect_checkpoint(tiny_run, tmp_path_factory):
    """tiny_run's weights under a config and a preprocessing record that keep the aspect ratio, at
    most 100 pixels wide (the CRNN takes any width). The record is what eval.sh applies."""
    checkpoint = load_checkpoint(tiny_run / "best.pt")
    checkpoint["config"]["data"].update(keep_aspect=True, img_width=100)
    checkpoint["preprocessing"].update(keep_aspect=True, width=100)
    path = tmp_path_factory.mktemp("keep_aspect") / "best.pt"
    save_checkpoint(path, checkpoint)
    return path


@pytest.mark.slow
def test_eval_results_do_not_depend_on_batching_and_match_one_image_at_a_time(keep_aspect_checkpoint, synth, tmp_path):
    dumps, tables = [], []
    for nproc, batch_size in ((1, 7), (2, 3)):
        json_path, dump = tmp_path / f"{nproc}.json", tmp_path / f"{nproc}.tsv"
        result = subprocess.run(
            [
                "bash",
                "scripts/eval.sh",
                str(keep_aspect_checkpoint),
                str(synth / "val"),
                "--batch-size",
                str(batch_size),
                "--workers",
                "0",
                "--json",
                str(json_path),
                "--dump",
                str(dump),
                "--precision",
                "fp32",
            ],
            cwd=REPO,
            env={**run_env(), "NPROC": str(nproc), "PYTHON": sys.executable},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        assert "images/s" in result.stdout
        dumps.append(dump.read_text().splitlines())
        table = json.loads(json_path.read_text())["combined"]
        # float noise in their last digits (metrics.summarize; the confidences behind the calibration error)
        tables.append(
            {key: value for key, value in table.items() if key not in ("loss", "mean_confidence", "calibration")}
        )
    assert dumps[0] == dumps[1] and tables[0] == tables[1]

    # Each image alone, at its own padded width, reads as it did inside its batch.
    model, codec, config, preprocessing = load_model(keep_aspect_checkpoint)
    transform = build_transform(config, preprocessing)
    samples = read_lmdb(synth / "val")
    predictions = {int(line.split("\t")[1]): line.split("\t")[3] for line in dumps[0][1:]}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in the eval.sh processes: the same sums in the same order
    try:
        with torch.inference_mode():
            alone = {
                index: codec.decode(model(transform(samples[index - 1][0])[None]))[0].text for index in predictions
            }
    finally:
        torch.set_num_threads(threads)
    assert alone == predictions
