"""What a fine-tune keeps of its start: the backbone held for its first steps (train.freeze_backbone_steps),
and the start's word accuracy against best.pt's on each set it read (data.val and data.retain), reported at
the run's end."""

from __future__ import annotations

from torch import nn

from training.config import DataConfig
from training.state import TrainState


def backbone_frozen(model: nn.Module, freeze_steps: int, step: int) -> list[nn.Parameter]:
    """The parameters the step after `step` must leave as they are: the backbone's for the first `freeze_steps`
    (train.freeze_backbone_steps), else none. Its BatchNorm layers then normalise with the start's statistics
    and do not move them (eval mode), as kraken's --freeze-backbone does; called every step, since validation
    puts the whole model back in training mode."""
    if not freeze_steps:
        return []
    backbone = getattr(model, "backbone", None)  # the registered architectures name their CNN so (models/)
    if not isinstance(backbone, nn.Module):
        raise ValueError(
            f"train.freeze_backbone_steps={freeze_steps}: {type(model).__name__} has no `backbone` module to "
            f"freeze; name its convolutional part self.backbone, or leave the key at 0"
        )
    frozen = step < freeze_steps
    backbone.train(not frozen and model.training)
    return list(backbone.parameters()) if frozen else []


def start_against_best(state: TrainState, data: DataConfig, init_from: str) -> str:
    """The run's closing report of a fine-tune: each set's word accuracy before the first step and in best.pt,
    and the change; "" when the run has no start readings (no train.init_from, or resumed from a checkpoint
    written before they were recorded)."""
    start, best = state.start_readings, state.best_readings
    if not start or not best:
        return ""
    kinds = {**{root: "data.val" for root in data.val}, **{root: "data.retain" for root in data.retain}}
    width = max(len(root) for root in kinds)
    lines = [
        f"the start (train.init_from {init_from}) against best.pt, word accuracy on each set it read"
        + (": best.pt is the start, no step read data.val better" if best == start else ":")
    ]
    for root, kind in kinds.items():
        if root in start and root in best:
            before, after = 100 * start[root], 100 * best[root]
            lines.append(f"  {kind:<11} {root:<{width}}  {before:6.2f} % -> {after:6.2f} %  ({after - before:+.2f})")
        else:  # a set added on resume was not read before the first step
            lines.append(f"  {kind:<11} {root:<{width}}  not read at the start")
    return "\n".join(lines)
