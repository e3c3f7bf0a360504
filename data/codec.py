"""The alphabet and the CTC codec: text <-> class indices, and greedy decoding of model outputs.

Class 0 is the CTC blank; the alphabet's characters are classes 1..N, in the order given.
"""

from __future__ import annotations

import math
import unicodedata
from dataclasses import dataclass

import torch
from torch import Tensor

from data.alphabet import check_alphabet


def ctc_min_frames(text: str) -> int:
    """Frames CTC needs to emit `text`: one per character plus a blank between each repeated pair."""
    repeats = sum(1 for a, b in zip(text, text[1:]) if a == b)
    return len(text) + repeats


def fold_case(text: str) -> str:
    """data.fold_case's rule, for whatever reads labels as training does (the codec, inspect_lmdb.py):
    lowercase. str.lower, not casefold, which turns `ß` into `ss` and so changes a label's length."""
    return text.lower()


def word_confidence(char_probs: tuple[float, ...]) -> float:
    """How sure a reading is: the product of its characters' probabilities, length-adjusted as EasyOCR
    does (`prod ** (2 / sqrt(n))`), so that a long word is not ranked below a short one for its length
    alone. Of the rules the peers use (docTR's minimum, mmocr's per-character scores, the plain product,
    the mean), it separated right readings from wrong ones best on the default model's readings of real
    training crops (docs/evaluation.md, "Confidence"). An empty reading gets 0, not the 1.0 of a product
    over no characters: a crop holds text, so reading none is a failure, never a certainty.
    """
    if not char_probs:
        return 0.0
    return math.prod(char_probs) ** (2 / math.sqrt(len(char_probs)))


@dataclass(frozen=True)
class Reading:
    """A decoded text, and the probability of each of its characters."""

    text: str
    char_probs: tuple[float, ...]

    @property
    def confidence(self) -> float:
        return word_confidence(self.char_probs)


class CTCCodec:
    """Maps labels to class indices (blank = 0) and decodes `[B, T, C]` model outputs to text."""

    def __init__(self, alphabet: str, fold_case: bool = False) -> None:
        check_alphabet(alphabet)
        self.alphabet = alphabet
        self.fold_case = fold_case
        self.index = {char: i + 1 for i, char in enumerate(alphabet)}
        # An alphabet that lists combining marks (U+0301 as a class of its own) reads an accented letter
        # as its parts; one without them reads the composed letter.
        self.lists_marks = any(unicodedata.combining(char) for char in alphabet)

    @property
    def num_classes(self) -> int:
        return len(self.alphabet) + 1  # + the blank

    def normalize(self, label: str) -> str:
        """The label as the model is trained to read it: lowercased when folding case, and in the
        composed form (NFC) the alphabet is in (data.alphabet.load_alphabet), whatever form the dataset
        stored: `e` + U+0301 is `é`. Where the alphabet lists `e` and U+0301 but not `é`, the parts.
        ASCII labels take no Unicode work: this runs for every sample the data loader reads."""
        label = fold_case(label) if self.fold_case else label
        if label.isascii():
            return label
        label = unicodedata.normalize("NFC", label)
        if not self.lists_marks:
            return label
        return "".join(char if char in self.index else self.parts(char) for char in label)

    def parts(self, char: str) -> str:
        """`char` decomposed (NFD) where the alphabet holds every part; otherwise `char` itself."""
        decomposed = unicodedata.normalize("NFD", char)
        return decomposed if all(part in self.index for part in decomposed) else char

    def case_folding_conflicts(self) -> list[str]:
        """The alphabet's characters that a lowercased label can never hold (`A` when folding case)."""
        return [char for char in self.alphabet if fold_case(char) != char] if self.fold_case else []

    def remove_unknown(self, label: str) -> str:
        """`label` without the characters the model cannot emit (the benchmarks' evaluation protocol)."""
        return "".join(char for char in label if char in self.index)

    def unknown_characters(self, label: str) -> set[str]:
        return {char for char in label if char not in self.index}

    def encode(self, labels: list[str]) -> tuple[Tensor, Tensor]:
        """Concatenated targets `[sum(L)]` and their lengths `[B]`, as `F.ctc_loss` takes them."""
        flat = [self.index[char] for label in labels for char in label]
        return torch.tensor(flat, dtype=torch.long), torch.tensor([len(label) for label in labels], dtype=torch.long)

    def decode(self, logits: Tensor) -> list[Reading]:
        """Greedy CTC decoding of `[B, T, C]` logits: collapse repeats, drop blanks.

        A character's probability is the highest one in the frames that emitted it.
        """
        probs, classes = logits.detach().float().softmax(-1).max(-1)  # [B, T] each
        probs, classes = probs.cpu().tolist(), classes.cpu().tolist()
        readings = []
        for frame_probs, frame_classes in zip(probs, classes):
            chars, char_probs, previous = [], [], 0
            for prob, cls in zip(frame_probs, frame_classes):
                if cls != 0 and cls != previous:
                    chars.append(self.alphabet[cls - 1])
                    char_probs.append(prob)
                elif cls != 0:
                    char_probs[-1] = max(char_probs[-1], prob)
                previous = cls
            readings.append(Reading("".join(chars), tuple(char_probs)))
        return readings
