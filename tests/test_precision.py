from __future__ import annotations

import pytest
import torch

import utils.precision
from utils.precision import autocast, resolve_precision


def test_auto_picks_a_precision_this_machine_runs_natively():
    assert resolve_precision("auto", torch.device("cpu")) in ("bf16", "fp32")
    assert resolve_precision("fp32", torch.device("cpu")) == "fp32"


def test_auto_wants_bf16_instructions_not_just_avx512(monkeypatch):
    """oneDNN reports bf16 "supported" on any AVX-512 CPU but emulates it there, 3.3x slower than fp32
    (measured on an Ice Lake Xeon): auto must read the CPU's flags."""
    monkeypatch.setattr(utils.precision.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(utils.precision, "cpu_flags", lambda: {"avx2", "avx512f", "avx512bw", "avx512vl", "avx512dq"})
    assert resolve_precision("auto", torch.device("cpu")) == "fp32"
    monkeypatch.setattr(utils.precision, "cpu_flags", lambda: {"avx512f", "avx512_bf16"})
    expected = "bf16" if torch.ops.mkldnn._is_mkldnn_bf16_supported() else "fp32"  # and oneDNN can use them
    assert resolve_precision("auto", torch.device("cpu")) == expected


def test_fp16_needs_cuda():
    with pytest.raises(ValueError, match="fp16 needs a CUDA device"):
        resolve_precision("fp16", torch.device("cpu"))


def test_bf16_autocast_runs_the_forward_in_bf16_on_the_cpu():
    layer = torch.nn.Linear(4, 4)
    with autocast(torch.device("cpu"), "bf16"):
        assert layer(torch.randn(2, 4)).dtype == torch.bfloat16
    with autocast(torch.device("cpu"), "fp32"):
        assert layer(torch.randn(2, 4)).dtype == torch.float32
