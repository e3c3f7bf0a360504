"""Bad input, round 4: small inputs that expand without bound (docs/bad-input.md)."""

from __future__ import annotations

import io
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from PIL import Image
from torch import nn

from data.transforms import Preprocessing
from models import model_from_config
from tests.conftest import REPO, run_env
from training.checkpoint import save_checkpoint, weights_checkpoint
from training.config import ConfigError, load_config
from training.run_folder import check_run_folder


def laughs(levels: int) -> str:
    """A "billion laughs": each level an anchored list of ten aliases of the level before."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


# --- (a) YAML aliases ------------------------------------------------------------------------------


def test_a_config_file_of_nested_yaml_aliases_is_refused_at_the_first_alias(tmp_path):
    path = tmp_path / "laughs.yaml"
    path.write_text("model:\n  settings_that_expand:\n" + textwrap.indent(laughs(3), "    "))
    expected = f"{path}:4: YAML aliases (*a0) are not read: write the values out"
    with pytest.raises(ConfigError, match=re.escape(expected)):
        load_config(str(path), [])


def test_a_billion_laughs_config_is_refused_at_once_not_expanded(tmp_path):
    """The 10-level file (~500 bytes, 10^10 nodes): the old reader grew past gigabytes; now one line, at once."""
    path = tmp_path / "laughs.yaml"
    path.write_text("model:\n" + textwrap.indent(laughs(10), "  "))  # an architecture's own keys: each is read
    assert len(path.read_bytes()) < 700
    code = f"from training.config import load_config; load_config({str(path)!r}, [])"
    try:
        result = subprocess.run(
            [sys.executable, "-c", code], cwd=REPO, env=run_env(), capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired:
        pytest.fail("reading a 10-level billion-laughs config did not end within 60 s")
    assert result.returncode != 0
    assert "YAML aliases (*a0) are not read" in result.stderr


def test_an_override_holding_yaml_aliases_is_refused():
    with pytest.raises(ConfigError, match="cannot parse the value of 'model.wide'"):
        load_config("crnn.yaml", ["model.wide=[&a [x, x, x], *a, *a]"])


def test_a_run_folders_config_yaml_with_aliases_is_refused_on_resume(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "last.pt").write_bytes(b"")  # the folder holds a run: its config.yaml is read to compare
    (out / "config.yaml").write_text(laughs(3))
    config = load_config("crnn.yaml", [f"train.out_dir={out}", "train.resume=auto"])
    with pytest.raises(ConfigError, match=re.escape(f"{out / 'config.yaml'}:2: YAML aliases (*a0) are not read")):
        check_run_folder(config)


def test_a_config_file_of_megabytes_is_not_read(tmp_path):
    path = tmp_path / "huge.yaml"
    path.write_text("# padding\n" * 200_000 + "train:\n  max_steps: 10\n")
    with pytest.raises(ConfigError, match=re.escape(f"{path}: 2,000,023 bytes is not a config")):
        load_config(str(path), [])


# --- (b) predict.py: the work of a batch is bounded by pieces, not images --------------------------


class Counting(nn.Module):
    """The model, recording how many inputs each forward pass is given."""

    def __init__(self, model: nn.Module, seen: list[int]) -> None:
        super().__init__()
        self.inner, self.seen = model, seen

    def forward(self, images):
        self.seen.append(len(images))
        return self.inner(images)


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory) -> Path:
    config = load_config("crnn.yaml", ["model.hidden_size=1", "model.channels=[1,1,1,1,1,1,1]"])
    model = model_from_config(config.model, len(config.data.alphabet) + 1)
    path = tmp_path_factory.mktemp("tiny") / "best.pt"
    checkpoint = weights_checkpoint(
        model, config, config.data.alphabet, Preprocessing.from_config(config), step=0, accuracy=None, world_size=1
    )
    save_checkpoint(path, checkpoint)
    return path


@pytest.mark.parametrize("batch_size, expected", [(64, [63, 63, 63, 63]), (200, [189, 63])])
def test_predict_bounds_each_forward_pass_by_pieces_whatever_the_images_aspect(
    tiny_checkpoint, tmp_path, monkeypatch, capsys, batch_size, expected
):
    """Four slivers of 1 x 100000 pixels are 63 pieces each: a batch of 64 images was 252 inputs at once
    (64 such images: 4,032, 7.6 GB); now at most `batch_size` inputs, or one crop alone."""
    import scripts.predict as predict_script
    from evaluation.long_crops import PiecewiseModel

    seen: list[int] = []

    class Recording(PiecewiseModel):
        def __init__(self, model, preprocessing):
            super().__init__(model, preprocessing)
            self.model = Counting(model, seen)

    monkeypatch.setattr(predict_script, "PiecewiseModel", Recording)
    buffer = io.BytesIO()
    Image.new("L", (100_000, 1), 255).save(buffer, format="PNG")
    paths = []
    for i in range(4):
        path = tmp_path / f"sliver{i}.png"
        path.write_bytes(buffer.getvalue())
        paths.append(str(path))
    undecodable = predict_script.predict(paths, str(tiny_checkpoint), torch.device("cpu"), batch_size, precision="fp32")
    assert undecodable == 0
    assert len(capsys.readouterr().out.splitlines()) == 4
    assert seen == expected


# --- (c) a frozen rank: the others stop after the collective timeout, naming it --------------------

FROZEN_RANK = """
import os, signal, sys
from utils.distributed import all_reduce_sum, setup_distributed
import torch
env = setup_distributed([])
all_reduce_sum(torch.ones(1))  # both are there
if env.rank == 1:
    os.kill(os.getpid(), signal.SIGSTOP)  # stopped, as by Ctrl-Z or a hung network file system
try:
    all_reduce_sum(torch.ones(1))
except TimeoutError as error:
    print(error, flush=True)
    sys.exit(3)
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_a_stopped_rank_ends_the_others_wait_after_the_collective_timeout_naming_it():
    port = free_port()
    base = {
        **run_env(),
        "TORCHELASTIC_RUN_ID": "test",
        "WORLD_SIZE": "2",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "OMP_NUM_THREADS": "1",
        "CRNN_COLLECTIVE_TIMEOUT_MINUTES": "0.05",  # 3 s
    }
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", FROZEN_RANK],
            cwd=REPO,
            env={**base, "RANK": str(rank), "LOCAL_RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    try:
        try:
            out, err = processes[0].communicate(timeout=90)
        except subprocess.TimeoutExpired:
            pytest.fail("rank 0 still waited for the stopped rank 1 after 90 s (torch's default: 30 minutes)")
        assert processes[0].returncode == 3, err
        assert "rank 0, in a sum over the processes: rank 1 did not answer for 3 s: a process stopped or stuck" in out
        assert "CRNN_COLLECTIVE_TIMEOUT_MINUTES" in out
    finally:
        for process in processes:
            if process.poll() is None:
                os.kill(process.pid, signal.SIGKILL)
            process.communicate()


def test_the_collective_timeout_is_ten_minutes_and_the_variable_is_checked(monkeypatch):
    from datetime import timedelta

    from utils.distributed import collective_timeout

    monkeypatch.delenv("CRNN_COLLECTIVE_TIMEOUT_MINUTES", raising=False)
    assert collective_timeout() == timedelta(minutes=10)
    monkeypatch.setenv("CRNN_COLLECTIVE_TIMEOUT_MINUTES", "30")
    assert collective_timeout() == timedelta(minutes=30)
    monkeypatch.setenv("CRNN_COLLECTIVE_TIMEOUT_MINUTES", "soon")
    with pytest.raises(ValueError, match="CRNN_COLLECTIVE_TIMEOUT_MINUTES='soon': give the minutes"):
        collective_timeout()
