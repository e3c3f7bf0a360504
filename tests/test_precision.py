from __future__ import annotations

import pytest
import torch

from utils.precision import autocast, resolve_precision


def test_auto_picks_a_precision_this_machine_runs_natively():
    assert resolve_precision("auto", torch.device("cpu")) in ("bf16", "fp32")
    assert resolve_precision("fp32", torch.device("cpu")) == "fp32"


def test_fp16_needs_cuda():
    with pytest.raises(ValueError, match="fp16 needs a CUDA device"):
        resolve_precision("fp16", torch.device("cpu"))


def test_bf16_autocast_runs_the_forward_in_bf16_on_the_cpu():
    layer = torch.nn.Linear(4, 4)
    with autocast(torch.device("cpu"), "bf16"):
        assert layer(torch.randn(2, 4)).dtype == torch.bfloat16
    with autocast(torch.device("cpu"), "fp32"):
        assert layer(torch.randn(2, 4)).dtype == torch.float32
