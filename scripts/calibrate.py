"""Fit a checkpoint's confidence to a labelled set: one temperature, stored in a copy of the checkpoint.

    python scripts/calibrate.py runs/crnn/best.pt datasets/real/val --out runs/crnn/calibrated.pt
    python scripts/calibrate.py pretrained/english_g2.pt my_crops/val more_crops/ --out english_g2_calibrated.pt

Any checkpoint eval.sh reads works (trained, or imported by scripts/import_weights.py). The temperature T
divides the logits before the softmax: the readings stay the same, their confidence changes so that, on
the sets given, a confidence of 0.8 is right about 80 % of the time (evaluation/calibration.py). eval.sh,
predict.py and scripts/export.py then apply it. The fit starts from the raw weights, also where the
checkpoint is already calibrated: the new temperature replaces the old one. --out may name the input itself
(its weights are kept as they are); it is written atomically. Prints T, the expected calibration error
before and after, and how many readings it was fitted on.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch

from data.label_index import index_cache_dir
from data.lmdb_dataset import LmdbDataset
from data.lmdb_env import open_lmdb
from data.loaders import build_eval_loader
from data.transforms import build_transform
from evaluation.calibration import FrameCollector, calibrate, join_samples
from evaluation.evaluate import evaluate
from evaluation.metrics import METRIC_MODES
from models import output_frames
from training.checkpoint import (
    check_checkpoint_path,
    check_foldable,
    load_checkpoint,
    load_model,
    save_checkpoint,
    with_calibration,
)
from utils import cli
from utils.atomic_write import check_writable
from utils.distributed import cleanup_distributed, setup_distributed


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=Path, help="a checkpoint of train.py or scripts/import_weights.py")
    parser.add_argument("lmdbs", nargs="+", help="labelled LMDB folders to fit on")
    parser.add_argument("--out", type=Path, required=True, help="the calibrated checkpoint to write (.pt)")
    parser.add_argument(
        "--metric-mode",
        default="benchmark",
        choices=METRIC_MODES,
        help="what counts as a correct reading (default benchmark, eval.sh's default)",
    )
    parser.add_argument("--batch-size", type=int, default=256, metavar="N", help="images per batch (default 256)")
    parser.add_argument("--workers", type=int, default=2, help="data-loader workers (default 2)")
    return parser.parse_args()


def check_args(args: argparse.Namespace) -> None:
    """What the command line alone shows to be wrong, before any set is read."""
    check_checkpoint_path(args.checkpoint)
    for root in args.lmdbs:
        open_lmdb(root).close()  # the dataset's own error for a missing folder or one that is no LMDB
        if os.path.realpath(args.out).startswith(os.path.realpath(root) + os.sep):
            raise ValueError(f"--out {args.out} is inside LMDB {root}; write it elsewhere")
    if args.out.is_dir():
        raise ValueError(f"--out {args.out} is a folder; give a file, e.g. --out {args.out / 'calibrated.pt'}")
    if args.batch_size < 1:
        raise ValueError(f"--batch-size {args.batch_size}: give a number of images, 1 or more")
    if args.workers < 0:
        raise ValueError(f"--workers {args.workers}: give a number of loader processes, 0 or more")
    check_writable(args.out, f"--out {args.out}")


def main() -> int:
    args = parse_args()
    check_args(args)
    env = setup_distributed(device_ids=[])
    try:
        model, codec, config, preprocessing = load_model(args.checkpoint, env.device, calibrated=False)
        check_foldable(model, codec.num_classes, preprocessing, args.checkpoint)
        transform = build_transform(config, preprocessing)
        frames = output_frames(model, preprocessing.channels, preprocessing.height, preprocessing.width)
        collectors = []
        for root in args.lmdbs:
            dataset = LmdbDataset(
                root, codec, frames, transform, remove_unknown=True, index_cache=index_cache_dir("auto")
            )
            collectors.append(FrameCollector(codec, args.metric_mode))
            loader = build_eval_loader(dataset, codec, args.batch_size, args.workers, env)
            evaluate(model, loader, codec, env, "fp32", on_batch=collectors[-1])
    finally:
        cleanup_distributed()
    # Each set's keys start at 0: a set's position keeps them apart.
    samples = [(position, *sample) for position, collector in enumerate(collectors) for sample in collector.samples]
    readings = join_samples([((position, key), *rest) for position, key, *rest in samples])
    if not len(readings):
        raise ValueError(f"{', '.join(args.lmdbs)}: no sample to fit on (no label scored under {args.metric_mode})")
    fitted = calibrate(readings)
    record = {
        "fitted_on": [os.path.abspath(root) for root in args.lmdbs],
        "readings": fitted.readings,
        "metric_mode": args.metric_mode,
        "ece_before": fitted.ece_before,
        "ece_after": fitted.ece_after,
    }
    save_checkpoint(args.out, with_calibration(load_checkpoint(args.checkpoint), fitted.temperature, record))
    print(
        f"temperature {fitted.temperature:.3f}, fitted on {fitted.readings} readings ({args.metric_mode}): expected "
        f"calibration error {100 * fitted.ece_before:.2f} % -> {100 * fitted.ece_after:.2f} %"
    )
    print(f"wrote {args.out}. Next: scripts/eval.sh {args.out} LMDB ... --reliability reliability.png")
    return 0


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    cli.run(main)
