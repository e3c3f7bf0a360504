"""The alphabet and the CTC codec: text <-> class indices, and greedy decoding of model outputs.

Class 0 is the CTC blank; the alphabet's characters are classes 1..N, in the order given.
"""
from __future__ import annotations

import torch
from torch import Tensor

from data.alphabet import check_alphabet


def ctc_min_frames(text: str) -> int:
    """Frames CTC needs to emit `text`: one per character plus a blank between each repeated pair."""
    repeats = sum(1 for a, b in zip(text, text[1:]) if a == b)
    return len(text) + repeats


class CTCCodec:
    """Maps labels to class indices (blank = 0) and decodes `[B, T, C]` model outputs to text."""

    def __init__(self, alphabet: str, fold_case: bool = False) -> None:
        check_alphabet(alphabet)
        self.alphabet = alphabet
        self.fold_case = fold_case
        self.index = {char: i + 1 for i, char in enumerate(alphabet)}

    @property
    def num_classes(self) -> int:
        return len(self.alphabet) + 1  # + the blank

    def normalize(self, label: str) -> str:
        """The label as the model is trained to read it (lowercased when folding case)."""
        return label.lower() if self.fold_case else label

    def remove_unknown(self, label: str) -> str:
        """`label` without the characters the model cannot emit (the benchmarks' evaluation protocol)."""
        return "".join(char for char in label if char in self.index)

    def unknown_characters(self, label: str) -> set[str]:
        return {char for char in label if char not in self.index}

    def encode(self, labels: list[str]) -> tuple[Tensor, Tensor]:
        """Concatenated targets `[sum(L)]` and their lengths `[B]`, as `F.ctc_loss` takes them."""
        flat = [self.index[char] for label in labels for char in label]
        return torch.tensor(flat, dtype=torch.long), torch.tensor([len(l) for l in labels], dtype=torch.long)

    def decode(self, logits: Tensor) -> list[tuple[str, float]]:
        """Greedy CTC decoding of `[B, T, C]` logits: collapse repeats, drop blanks.

        The confidence of a word is the product, over the characters emitted, of the highest
        probability in the frames that emitted each one (1.0 for an empty prediction).
        """
        probs, classes = logits.detach().float().softmax(-1).max(-1)  # [B, T] each
        probs, classes = probs.cpu().tolist(), classes.cpu().tolist()
        results = []
        for frame_probs, frame_classes in zip(probs, classes):
            chars, confidence, previous, run_prob = [], 1.0, 0, 0.0
            for prob, cls in zip(frame_probs, frame_classes):
                if cls != previous:
                    if previous != 0:
                        confidence *= run_prob
                    if cls != 0:
                        chars.append(self.alphabet[cls - 1])
                    run_prob = prob
                else:
                    run_prob = max(run_prob, prob)
                previous = cls
            if previous != 0:
                confidence *= run_prob
            results.append(("".join(chars), confidence))
        return results
