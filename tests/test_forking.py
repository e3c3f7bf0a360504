"""README's forking table, row by row: each test makes one row's change in a copy of the repository, as
a fork would (the files a fresh clone has, nothing else), trains a few steps there, and checks from what
the run left on disk that the change took effect.

A new row's test is a few lines: change the copy through `fork.root`, then `fork.train(...)`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import yaml

from tests.conftest import ALPHABET, REPO, SMALL_RUN, read_lmdb, run_command, write_images
from training.checkpoint import classifier_keys

pytestmark = pytest.mark.slow  # each test starts the project's commands in a copy of it


@dataclass(frozen=True)
class Fork:
    """A copy of the repository that a test changes as a fork would, and runs the project's commands in."""

    root: Path

    def run(self, script: str, *arguments: str) -> subprocess.CompletedProcess[str]:
        """`python SCRIPT ARGUMENTS` in the copy, importing the copy's code; its stdout and stderr shown if it fails."""
        env = {"PYTHONPATH": str(self.root)}
        return run_command(sys.executable, script, *arguments, cwd=self.root, env=env, check=True)

    def train(self, *overrides: str, config: str = "crnn.yaml", out_dir: str = "runs/fork") -> Path:
        """A run that only has to start, train and save (three steps of SMALL_RUN on one thread) of
        `train.py --config CONFIG`, then `overrides`; its run folder."""
        steps = ("train.max_steps=3", "train.eval_every=3", "train.log_every=3", "train.threads=1")
        self.run("train.py", "--config", config, *SMALL_RUN, *steps, f"train.out_dir={out_dir}", *overrides)
        return self.root / out_dir


def trained_on(lmdbs: Path) -> tuple[str, str]:
    """The overrides that train on `lmdbs`/train and validate on `lmdbs`/val."""
    return f"data.train=[{lmdbs / 'train'}]", f"data.val=[{lmdbs / 'val'}]"


def metrics(run_folder: Path) -> list[dict]:
    return [json.loads(line) for line in (run_folder / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture
def fork(tmp_path) -> Fork:
    """The repository as a fresh clone has it: what .gitignore leaves out (datasets, runs, the venv,
    caches) and git's own folder are not copied."""
    ignored = [
        line.strip().rstrip("/")
        for line in (REPO / ".gitignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    root = tmp_path / "fork"
    shutil.copytree(REPO, root, ignore=shutil.ignore_patterns(".git", ".ruff_cache", *ignored))
    return Fork(root)


def test_a_new_alphabet_file_generates_data_and_trains_a_model_that_reads_it(fork):
    # Capitals and letters the default alphabet lacks: with both cases, labels keep their case.
    alphabet = ALPHABET + "ABCDEFGHIJKLMNOPQRSTUVWXYZéüñß"
    (fork.root / "configs" / "alphabets" / "mine.txt").write_text("\n".join(alphabet) + "\n", encoding="utf-8")
    # Numbers and random strings only (--no-words): every character is as likely, so a few samples hold
    # the accented letters, which English words seldom have.
    fork.run(
        "scripts/make_synthetic.py",
        "--out",
        "datasets/mine",
        "--train",
        "48",
        "--val",
        "16",
        "--test",
        "0",
        "--workers",
        "1",
        "--no-words",
        "--alphabet",
        "configs/alphabets/mine.txt",
    )
    val_labels = [label for _, label in read_lmdb(fork.root / "datasets" / "mine" / "val")]
    assert set("".join(val_labels)) & set("éüñß")  # the generator drew characters only the new alphabet has

    run = fork.train(
        "data.alphabet=configs/alphabets/mine.txt", "data.fold_case=false", *trained_on(Path("datasets/mine"))
    )
    checkpoint = torch.load(run / "best.pt", weights_only=True)
    assert checkpoint["alphabet"] == alphabet
    assert classifier_keys(checkpoint["model"], len(alphabet) + 1)  # one output row per character, and the blank
    val = [record for record in metrics(run) if "val" in record]
    assert val[-1]["samples"] == len(val_labels)  # no label was dropped for a character outside the alphabet


def test_a_new_dataset_made_from_image_files_is_what_training_reads(fork, synth):
    images_root = fork.root / "my_images"
    labels = [label for _, label in read_lmdb(synth / "val")]
    for split, start, count in (("train", 0, 20), ("val", 20, 7)):
        images = write_images(synth, images_root / split, count=count, start=start)
        gt_lines = [f"{split}/{image.name}\t{labels[start + i]}" for i, image in enumerate(images)]
        (images_root / f"{split}.txt").write_text("\n".join(gt_lines) + "\n", encoding="utf-8")
        fork.run(
            "scripts/create_lmdb.py",
            "--images",
            "my_images",
            "--gt",
            f"my_images/{split}.txt",
            "--out",
            f"datasets/mine/{split}",
        )
        stored = read_lmdb(fork.root / "datasets" / "mine" / split)
        assert stored == [(image.read_bytes(), labels[start + i]) for i, image in enumerate(images)]

    run = fork.train(*trained_on(Path("datasets/mine")))
    records = metrics(run)
    drawn = [record["drawn"] for record in records if "drawn" in record]
    assert drawn and all(set(counts) == {"datasets/mine/train"} for counts in drawn)
    val = [record for record in records if "val" in record]
    assert val[-1]["val"] == "datasets/mine/val" and val[-1]["samples"] == 7


# What README's forking section shows: one module, registered by name, with a setting of its own.
MYNET = '''\
from torch import Tensor, nn

from models.registry import register_model


@register_model("mynet")
class MyNet(nn.Module):
    """`depth` convolutions (the first two halve the height and width), the height averaged away, one linear layer."""

    def __init__(self, num_classes: int, in_channels: int, hidden_size: int, depth: int = 4) -> None:
        super().__init__()
        layers = []
        for index in range(depth):
            stride = 2 if index < 2 else 1
            layers += [nn.Conv2d(in_channels if index == 0 else hidden_size, hidden_size, 3, stride=stride, padding=1),
                       nn.ReLU()]
        self.features = nn.Sequential(*layers)
        self.classify = nn.Linear(hidden_size, num_classes)

    def forward(self, images: Tensor) -> Tensor:
        features = self.features(images).mean(dim=2)  # [B, hidden, T]
        return self.classify(features.transpose(1, 2))  # [B, T, num_classes]
'''


def test_a_new_backbone_is_one_module_and_one_import_line(fork, synth):
    (fork.root / "models" / "mynet.py").write_text(MYNET)
    with (fork.root / "models" / "__init__.py").open("a") as init:
        init.write("from models.mynet import MyNet as MyNet\n")
    # A config that selects it, without crnn.yaml's CRNN settings (channels, lstm_layers, cnn_shortcut, ...).
    config = yaml.safe_load((fork.root / "configs" / "crnn.yaml").read_text())
    config["model"] = {"arch": "mynet", "in_channels": 1, "hidden_size": 32, "depth": 3}
    (fork.root / "configs" / "mynet.yaml").write_text(yaml.safe_dump(config))

    run = fork.train(*trained_on(synth), config="mynet.yaml")
    checkpoint = torch.load(run / "best.pt", weights_only=True)
    assert checkpoint["config"]["model"]["arch"] == "mynet" and checkpoint["config"]["model"]["depth"] == 3
    convolutions = {f"features.{2 * index}.{tensor}" for index in range(3) for tensor in ("weight", "bias")}
    assert set(checkpoint["model"]) == convolutions | {"classify.weight", "classify.bias"}
    assert checkpoint["model"]["features.0.weight"].shape == (32, 1, 3, 3)


def add_entry(path: Path, table_start: str, entry: str) -> None:
    """Put `entry` as the first item of the table whose opening line is `table_start`, as a fork edits it."""
    text = path.read_text()
    assert text.count(table_start) == 1, f"{path} has no single line {table_start!r}: the README row is out of date"
    path.write_text(text.replace(table_start, f"{table_start}\n{entry}"))


def test_a_new_optimizer_and_schedule_are_one_entry_each(fork, synth):
    optim = fork.root / "training" / "optim.py"
    add_entry(
        optim,
        "OPTIMIZERS: dict[str, Callable[[Iterable[nn.Parameter], OptimSection], torch.optim.Optimizer]] = {",
        '    "sgd": lambda parameters, optim: torch.optim.SGD(parameters, lr=optim.lr, momentum=0.9),',
    )
    add_entry(
        optim,
        "SCHEDULES: dict[str, Callable[[float, OptimSection], float]] = {",
        '    "step": lambda progress, optim: 1.0 if progress < 0.5 else 0.1,',
    )

    run = fork.train(
        *trained_on(synth),
        "optim.name=sgd",
        "optim.schedule=step",
        "optim.warmup_steps=0",
        "optim.lr=0.01",
        "train.save_every=3",
    )
    checkpoint = torch.load(run / "last.pt", weights_only=True)
    assert checkpoint["config"]["optim"]["name"] == "sgd"
    group = checkpoint["optimizer"]["param_groups"][0]
    assert group["momentum"] == 0.9 and "betas" not in group  # SGD's state, not Adam's
    assert all("momentum_buffer" in state for state in checkpoint["optimizer"]["state"].values())
    # After 3 of 3 steps the step schedule is at 0.1 of optim.lr (cosine would end at min_lr_ratio, 0.05).
    assert group["lr"] == pytest.approx(0.001)
    assert [record["lr"] for record in metrics(run) if "lr" in record][-1] == pytest.approx(0.001)


def test_a_new_augmentation_is_one_entry_and_its_config_key_comes_with_it(fork, synth):
    # Erase a patch of every image: a run with it trains on other pixels than one without.
    add_entry(
        fork.root / "data" / "augment.py",
        "AUGMENTATIONS = (",
        '    AugmentationStep("erase", probability={"none": 0.0, "light": 0.1, "strong": 0.2},\n'
        "                     apply=lambda pixels, widths, strength, random: pixels.index_fill(\n"
        "                         3, torch.arange(8, device=pixels.device), 0)),",
    )
    plain = fork.train(*trained_on(synth), "data.augment=none", out_dir="runs/plain")
    erased = fork.train(*trained_on(synth), "data.augment=none", "augment.erase=1.0", out_dir="runs/erased")

    assert torch.load(erased / "best.pt", weights_only=True)["config"]["augment"]["erase"] == 1.0
    losses = [[record["loss"] for record in metrics(run) if "loss" in record] for run in (plain, erased)]
    assert losses[0] and losses[1] and losses[0] != losses[1]
    # Same seed, one thread, fp32: without the new key the run repeats itself exactly, so the difference
    # above is the augmentation's.
    again = fork.train(*trained_on(synth), "data.augment=none", out_dir="runs/again")
    assert [record["loss"] for record in metrics(again) if "loss" in record] == losses[0]
