"""train.calibrate: at the end of a run, best.pt's temperature fitted on data.val and stored in best.pt
(evaluation/calibration.py fits it; scripts/calibrate.py does the same for any checkpoint and set)."""

from __future__ import annotations

import os
from pathlib import Path

from torch.utils.data import DataLoader

from evaluation.calibration import FrameCollector, calibrate, join_samples
from evaluation.evaluate import evaluate
from training.checkpoint import CheckpointError, check_foldable, load_checkpoint, save_checkpoint, with_calibration
from training.run import Run
from training.run_log import RunLog
from utils.distributed import broadcast_object, gather_objects

# What validation scores: the model is trained to read labels exactly as written.
METRIC_MODE = "exact"


def calibrate_best(run: Run, val_loaders: list[DataLoader], log: RunLog) -> None:
    """Fit best.pt's temperature on data.val and write it into best.pt. A collective: every rank reads its own
    shard with best.pt's weights (rank 0's, broadcast: other nodes may not see the run folder), rank 0 fits on
    every rank's readings and writes. The evaluated model is left holding best.pt's weights: the run is over."""
    config, env, setup = run.config, run.env, run.setup
    path = Path(config.train.out_dir) / "best.pt"
    # Rank 0's answer for all: no validation has written best.pt, or none in this folder (a run resumed from
    # another folder's checkpoint keeps that run's best score, which the validations here did not beat)
    if not broadcast_object(path.is_file() if env.is_main else None, env.cpu_group):
        log.info(f"not calibrated: no {path} (train.calibrate)")
        return
    model = setup.evaluated_model
    try:
        check_foldable(model, setup.codec.num_classes, setup.preprocessing, path)
    except CheckpointError as error:  # the same on every rank: the same architecture
        log.info(f"not calibrated (train.calibrate): {error}")
        return
    best = load_checkpoint(path) if env.is_main else None
    model.load_state_dict(broadcast_object(best["model"] if best else None, env.cpu_group))
    collector = FrameCollector(setup.codec, METRIC_MODE)
    for loader in val_loaders[: len(setup.val_sets)]:  # data.val's, not data.retain's
        evaluate(model, loader, setup.codec, env, setup.precision, config.train.channels_last, on_batch=collector)
    shards = gather_objects(collector.samples, env.cpu_group)
    if not env.is_main:
        return
    # Keys are positions in each rank's loaders: the rank keeps them apart.
    readings = join_samples([((rank, key), *rest) for rank, shard in enumerate(shards) for key, *rest in shard])
    if not len(readings):
        log.info("not calibrated: data.val has no label to score (train.calibrate)")
        return
    fitted = calibrate(readings)
    record = {
        "fitted_on": [os.path.abspath(root) for root in config.data.val],
        "readings": fitted.readings,
        "metric_mode": METRIC_MODE,
        "ece_before": fitted.ece_before,
        "ece_after": fitted.ece_after,
    }
    save_checkpoint(path, with_calibration(best, fitted.temperature, record))
    log.info(
        f"calibrated best.pt on data.val: temperature {fitted.temperature:.2f}, ECE {100 * fitted.ece_before:.1f} % "
        f"-> {100 * fitted.ece_after:.1f} % ({fitted.readings} crops)"
    )
