"""The CTC loss, computed outside the model and after the parallel boundary."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def ctc_losses(
    logits: Tensor, targets: Tensor, target_lengths: Tensor, count_infinite: bool = True
) -> tuple[Tensor, Tensor | None]:
    """Per-sample CTC losses `[B]` of `[B, T, C]` logits against the concatenated `targets` (class
    indices, blank 0 excluded) of `target_lengths` each, and how many of the losses were infinite
    (None unless `count_infinite`: counting costs a second CTC pass, which evaluation skips).

    The loss runs in fp32 whatever the autocast precision: CTC sums probabilities over many
    alignments, and bf16/fp16 lose them. Time-first is made here, after the parallel boundary.
    Infinite losses (a label that cannot be aligned) are zeroed, with their NaN gradients.
    """
    log_probs = logits.float().log_softmax(2).transpose(0, 1)  # [T, B, C]
    frames, batch_size = log_probs.shape[:2]
    if batch_size == 0:
        # Every image of this process's batch was undecodable. F.ctc_loss rejects empty input; this
        # empty loss stays in the graph, so backward gives every parameter a zero gradient and DDP's
        # all-reduce still finds this rank.
        return log_probs.sum(dim=(0, 2)), torch.zeros((), dtype=torch.long, device=logits.device)
    input_lengths = torch.full((batch_size,), frames, dtype=torch.long)
    targets = targets.to(logits.device, non_blocking=True)
    target_lengths = target_lengths.to(logits.device, non_blocking=True)
    losses = F.ctc_loss(
        log_probs, targets, input_lengths, target_lengths, blank=0, reduction="none", zero_infinity=True
    )
    if not count_infinite:
        return losses, None
    with torch.no_grad():
        # zero_infinity hides infinite losses; count them from a pass without it (no backward).
        infinite = torch.isinf(F.ctc_loss(log_probs, targets, input_lengths, target_lengths, reduction="none")).sum()
    return losses, infinite
