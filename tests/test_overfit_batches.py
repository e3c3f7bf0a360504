"""train.overfit_batches=N: train.py fits its first N batches until it reads them, or says it cannot, and exits
0 or 1 alike on every rank."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.conftest import TORCHRUN_TWO, train_small
from training.config import ConfigError, load_config, validate

# One batch of 4, at the recipe's learning rate without its warm-up: read after 50 to 60 steps on a 2-core CPU
# (seeds 0 to 2, learning rates 0.002 to 0.005), on one process and on two.
FITS = ("train.overfit_batches=1", "train.batch_size=4", "optim.warmup_steps=0", "train.max_steps=300")
PASSED = re.compile(r"overfit check passed: the 1 batch \(4 samples\) read correctly after (\d+) steps")


def verdicts(result: subprocess.CompletedProcess) -> list[str]:
    """The check's lines in the log (rank 0's; the progress bar on stderr may share a line with them)."""
    return re.findall(r"overfit check (?:passed|failed): [^\n]*", result.stdout)


def passed_after(result: subprocess.CompletedProcess) -> int:
    """The steps the one `passed` line names; the command exited 0."""
    assert result.returncode == 0, result.stderr[-3000:]
    lines = verdicts(result)
    assert len(lines) == 1, result.stdout[-3000:]
    match = PASSED.fullmatch(lines[0])
    assert match, lines[0]
    return int(match[1])


@pytest.mark.slow
def test_a_batch_the_recipe_can_fit_passes_and_nothing_is_saved(synth, tmp_path):
    result = train_small(synth, tmp_path / "run", *FITS)
    assert passed_after(result) < 300
    assert not list((tmp_path / "run").glob("*.pt"))  # the check is no run to resume or keep


@pytest.mark.slow
def test_a_learning_rate_that_cannot_fit_fails_with_exit_code_1(synth, tmp_path):
    result = train_small(synth, tmp_path / "run", *FITS, "optim.lr=1e-9", "train.max_steps=20")
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "error:" not in result.stderr, result.stderr[-3000:]
    assert verdicts(result) == [
        "overfit check failed: after 20 steps 0 of 4 samples of the 1 batch read correctly; the recipe cannot "
        "fit even these: check the labels, the alphabet, the learning rate, the preprocessing"
    ]


@pytest.mark.slow
def test_two_processes_fit_their_shares_and_agree(synth, tmp_path):
    # Each rank holds 2 of the 4 samples: the line counts 4 only when the ranks' counts are summed, and
    # torchrun exits 0 only when both ranks do.
    result = train_small(synth, tmp_path / "run", *FITS, launcher=TORCHRUN_TWO)
    assert passed_after(result) < 300


def test_a_negative_count_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"^train\.overfit_batches=-1: must be at least 0$"):
        validate(load_config("crnn.yaml", ["train.overfit_batches=-1"]))
