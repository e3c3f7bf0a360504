"""Run folders: the newest readable checkpoint, the newest K kept, and runs that never mix."""

from __future__ import annotations

import pytest
import torch
import yaml

from training.checkpoint import save_checkpoint
from training.config import Config, ConfigError, leaf_fields, resumable_keys, to_dict
from training.run_folder import (
    check_run_folder,
    checkpoint_path,
    clear_run_folder,
    find_latest_checkpoint,
    numbered_checkpoints,
    point_last_at,
    prune_checkpoints,
)


def training_checkpoint(step: int) -> dict:
    return {"model": {"w": torch.full((2,), float(step))}, "optimizer": {}, "step": step}


def test_a_truncated_newest_checkpoint_is_skipped_with_a_warning(tmp_path):
    for step in (4, 8, 12):
        save_checkpoint(checkpoint_path(tmp_path, step), training_checkpoint(step))
    data = checkpoint_path(tmp_path, 12).read_bytes()
    checkpoint_path(tmp_path, 12).write_bytes(data[: len(data) // 2])  # as if the disk filled up mid-write
    checkpoint_path(tmp_path, 16).write_bytes(b"")
    warnings = []
    path, checkpoint = find_latest_checkpoint(tmp_path, warn=warnings.append)
    assert path == checkpoint_path(tmp_path, 8) and checkpoint["step"] == 8
    assert len(warnings) == 2 and "ckpt-0000016.pt" in warnings[0] and "ckpt-0000012.pt" in warnings[1]


def test_nothing_to_resume_from(tmp_path):
    assert find_latest_checkpoint(tmp_path / "absent", warn=print) is None
    save_checkpoint(tmp_path / "best.pt", {"model": {"w": torch.zeros(1)}, "step": 3})  # weights only: not numbered
    assert find_latest_checkpoint(tmp_path, warn=print) is None


def test_the_newest_k_are_kept_and_last_is_the_newest(tmp_path):
    for step in (250, 500, 750, 1000):
        save_checkpoint(checkpoint_path(tmp_path, step), training_checkpoint(step))
        point_last_at(checkpoint_path(tmp_path, step))
        prune_checkpoints(tmp_path, keep=2)
    assert [step for step, _ in numbered_checkpoints(tmp_path)] == [1000, 750]
    assert torch.load(tmp_path / "last.pt", weights_only=True)["step"] == 1000
    assert (tmp_path / "last.pt").samefile(checkpoint_path(tmp_path, 1000))  # a link, not a second write


def used_folder(tmp_path, **changes) -> Config:
    """A folder holding a run of the default config with `changes` applied."""
    previous = Config()
    previous.train.out_dir = str(tmp_path)
    for key, value in changes.items():
        section, name = key.split("__")
        setattr(getattr(previous, section), name, value)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(to_dict(previous)))
    save_checkpoint(checkpoint_path(tmp_path, 250), training_checkpoint(250))
    current = Config()
    current.train.out_dir = str(tmp_path)
    return current


def test_a_run_continues_in_its_own_folder_with_a_longer_schedule(tmp_path):
    config = used_folder(tmp_path)
    config.train.max_steps, config.train.save_every, config.data.num_workers = 5000, 100, 8
    check_run_folder(config)  # resume=auto: continues; no error


def test_another_config_in_a_used_folder_is_an_error_naming_what_differs(tmp_path):
    config = used_folder(tmp_path, optim__lr=0.01)
    with pytest.raises(ConfigError, match=r"holds a run with another configuration:\n  optim.lr: 0.01 -> 0.001"):
        check_run_folder(config)
    config.train.resume = "none"
    with pytest.raises(ConfigError, match="holds another run; continue it"):
        check_run_folder(config)
    config.train.overwrite = True
    check_run_folder(config)  # explicitly allowed
    clear_run_folder(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_checkpoints_without_a_config_are_not_guessed_at(tmp_path):
    config = used_folder(tmp_path)
    (tmp_path / "config.yaml").unlink()
    with pytest.raises(ConfigError, match="no readable config.yaml"):
        check_run_folder(config)


def changed(value):
    """Another value of the same type (a probability for an unset `float | None`)."""
    if value is None:
        return 0.5
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + "x"
    return [*value, value[0] if value else 1]


@pytest.mark.parametrize("key", sorted(leaf_fields()))
def test_every_key_of_the_config_is_either_resumable_or_binds_the_run(tmp_path, key):
    """A continued run may change exactly the keys declared resumable where they are defined."""
    config = used_folder(tmp_path)
    *sections, name = key.split(".")
    node = config
    for section in sections:
        node = getattr(node, section)
    setattr(node, name, changed(getattr(node, name)))
    if key == "train.out_dir":  # the folder itself: a changed name is another folder, not this run's
        return
    if key in resumable_keys():
        check_run_folder(config)
    else:
        with pytest.raises(ConfigError, match=f"another configuration:\\n  {key}: "):
            check_run_folder(config)


def test_how_a_run_is_executed_may_change_and_what_it_computes_may_not():
    resumable = resumable_keys()
    assert {
        "train.compile",
        "train.channels_last",
        "data.eval_width_step",
        "train.max_steps",
        "data.num_workers",
        "train.precision",
        "device_ids",
    } <= resumable
    assert (
        not {
            "data.train",
            "data.alphabet",
            "data.img_height",
            "data.mean",
            "data.interpolation",
            "model.arch",
            "optim.lr",
            "train.batch_size",
            "train.seed",
        }
        & resumable
    )


def test_a_run_started_before_a_key_existed_continues_with_that_key_at_its_default(tmp_path):
    config = used_folder(tmp_path)
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    del saved["data"]["interpolation"], saved["data"]["mean"]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(saved))
    check_run_folder(config)
    config.data.interpolation = "bicubic"
    with pytest.raises(ConfigError, match="data.interpolation: 'bilinear' -> 'bicubic'"):
        check_run_folder(config)
