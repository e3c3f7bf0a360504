"""What a synthetic sample says: a real word, a number as numbers occur in print, or a random string;
in lower, Capitalised or UPPER case where the alphabet folds case.

A case-folding alphabet (lowercase letters, no capitals: labels are lowercased before training)
still gets capitals drawn, with the label folded; a case-sensitive alphabet gets what the label says.
"""

from __future__ import annotations

import random
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

WORDS_FILE = Path(__file__).resolve().parent / "words" / "english.txt"
SCOWL_NOTICE = "its copyright and permission notice: synthetic/words/LICENSE-SCOWL.txt"
# Shares of the three kinds of text, when the alphabet allows each. Single characters come only from
# short numbers and random strings (0.9 %): a fourth kind drawing them 4 % of the time read IIIT5K's
# single characters far better and IC15's crops worse, as one or two characters
# (docs/real-text.md#why-the-recipe-is-what-it-is).
KIND_WEIGHTS = {"word": 0.75, "number": 0.15, "random": 0.10}
# As real crops are cased: of the real training crops' labels with letters (IIIT5K, SVT, IC15 train),
# 55 % are UPPER, 26 % Capitalised, 17 % lower. Drawn 25 % UPPER before, the model read real UPPER
# words worst; these shares read real training crops 2.1 points better
# (docs/real-text.md#why-the-recipe-is-what-it-is).
CASE_WEIGHTS = {"lower": 0.2, "capitalised": 0.25, "upper": 0.55}
# Punctuation beside words, as on signs and in print ("Direction?", "PROF.", "HERE!"). A mark the
# alphabet lacks is drawn but left out of the label, as the benchmarks' protocol scores it, so the
# model learns to pass over it instead of reading it as the letter or digit it looks most like
# ("station?" read "station2" on real crops).
MARKS = ".,:;!?'\"-()&"
MARK_SHARE = 0.15
# How long a word or a random string is: roughly how word lengths fall in running English text. A
# dictionary's words, drawn uniformly, would be 8 or 9 letters long on average, not 4 or 5.
LENGTH_WEIGHTS = {1: 3, 2: 12, 3: 16, 4: 16, 5: 13, 6: 11, 7: 9, 8: 7, 9: 5, 10: 4, 11: 2, 12: 2}


def check_left_to_right(alphabet: str) -> None:
    """Refuse an alphabet with right-to-left letters (Hebrew, Arabic, ...) for a dataset: one label
    order would be drawn in two visual orders, right to left where a text is laid out whole (Pillow's
    bidi layout) and left to right where it is drawn a character at a time (letter spacing, curved
    baselines); and CTC reads an image left to right, so a label in reading order would not even
    match the first. (Export's check images need no such order: they only feed two runtimes alike.)"""
    right_to_left = [char for char in alphabet if unicodedata.bidirectional(char) in ("R", "AL")]
    if right_to_left:
        first = right_to_left[0]
        raise ValueError(
            f"it has {len(right_to_left)} right-to-left characters ({first!r}, U+{ord(first):04X}"
            f" {unicodedata.name(first, '?')}, ...), which the generator cannot draw in one visual"
            f" order: give a left-to-right alphabet"
        )


def unlabelled_marks(alphabet: str) -> str:
    """The MARKS `alphabet` lacks: drawn beside words, left out of labels."""
    return "".join(mark for mark in MARKS if mark not in alphabet)


def folds_case(alphabet: str) -> bool:
    """Lowercase letters and no capitals: a model for it reads capitals as their lowercase."""
    return any(char.islower() for char in alphabet) and not any(char.isupper() for char in alphabet)


def capital(char: str) -> str:
    """`char`'s capital where lowercasing the capital gives `char` back (so a folded label still reads
    `char`: not so for titlecase 'ǅ', whose capital 'Ǆ' lowercases to 'ǆ'); else `char` itself."""
    upper = char.upper()
    return upper if len(upper) == 1 and upper.lower() == char else char


def digits(rng: random.Random, count: int) -> str:
    return "".join(rng.choices("0123456789", k=count))


def letters(rng: random.Random, count: int) -> str:
    return "".join(rng.choices("ABCDEFGHJKLMNPQRSTUVWXYZ", k=count))


def ordinal(number: int) -> str:
    """1st, 2nd, 3rd, 4th, ..., 11th, 12th, 13th, ..., 21st."""
    suffix = "th" if 10 <= number % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")
    return f"{number}{suffix}"


# Numbers as they occur in print. Each is drawn only where the alphabet has its characters.
NUMBER_FORMS: dict[str, Callable[[random.Random], str]] = {
    "digit run": lambda rng: digits(rng, rng.choice((1, 1, 2, 2, 3, 3, 4, 5, 6, 7, 8))),
    "year": lambda rng: str(rng.randint(1900, 2035)),
    "amount": lambda rng: str(rng.choice((rng.randint(1, 99), rng.randint(100, 9999), rng.randint(10, 999) * 10))),
    "code": lambda rng: rng.choice(
        (
            letters(rng, 1) + digits(rng, rng.randint(1, 4)),
            letters(rng, 2) + digits(rng, rng.randint(2, 4)),
            digits(rng, rng.randint(1, 3)) + letters(rng, rng.randint(1, 2)),
            letters(rng, 1) + digits(rng, 2) + letters(rng, 1) + digits(rng, 1),
        )
    ),
    "price": lambda rng: f"{rng.randint(0, 999)}.{digits(rng, 2)}",
    "price with currency": lambda rng: (
        rng.choice("$€£") + f"{rng.randint(1, 999)}" + rng.choice(("", f".{digits(rng, 2)}"))
    ),
    "thousands": lambda rng: f"{rng.randint(1, 99)},{digits(rng, 3)}",
    "date": lambda rng: rng.choice(
        (
            f"{rng.randint(1, 28):02d}/{rng.randint(1, 12):02d}/{rng.randint(1970, 2035)}",
            f"{rng.randint(1970, 2035)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
            f"{rng.randint(1, 28):02d}.{rng.randint(1, 12):02d}.{rng.randint(0, 99):02d}",
        )
    ),
    "time": lambda rng: f"{rng.randint(0, 23)}:{rng.randint(0, 59):02d}",
    "percentage": lambda rng: f"{rng.randint(1, 100)}%",
    "phone": lambda rng: f"{digits(rng, 3)}-{digits(rng, 4)}",
    "ordinal": lambda rng: ordinal(rng.randint(1, 120)),
    "hyphenated code": lambda rng: f"{letters(rng, rng.randint(1, 3))}-{digits(rng, rng.randint(2, 4))}",
}


@dataclass(frozen=True)
class TextSampler:
    """Draws (what is drawn, its label) pairs from the characters some font can draw."""

    alphabet: str  # the characters that can be drawn (every one in some training font)
    words: tuple[str, ...]  # usable words, as the list spells them
    max_length: int
    marks: str = ""  # the MARKS outside the alphabet: drawn, not labelled

    @cached_property  # asked for every label
    def fold(self) -> bool:
        return folds_case(self.alphabet)

    @cached_property
    def characters(self) -> frozenset[str]:
        return frozenset(self.alphabet)

    def label(self, text: str) -> str:
        """What `text` is labelled: folded to lowercase where the alphabet folds case (a character whose
        lowercase is not in the alphabet, e.g. titlecase 'ǅ', stays as it is)."""
        text = "".join(char for char in text if char not in self.marks)
        if not self.fold:
            return text
        return "".join(lower if (lower := char.lower()) in self.characters else char for char in text)

    def drawable(self, text: str) -> bool:
        # Marks come from `punctuate` alone, which knows the font: a price or a date is drawn only
        # where the alphabet has its "." or ":".
        return set(self.label(text)) <= self.characters and not set(text) & set(self.marks)

    @cached_property
    def words_by_length(self) -> dict[int, tuple[str, ...]]:
        lengths: dict[int, list[str]] = {}
        for word in self.words:
            lengths.setdefault(len(word), []).append(word)
        return {length: tuple(words) for length, words in sorted(lengths.items())}

    def length(self, rng: random.Random, lengths: list[int]) -> int:
        """A length among `lengths`, drawn by LENGTH_WEIGHTS (longer ones than it lists: as its last)."""
        weights = [LENGTH_WEIGHTS.get(length, LENGTH_WEIGHTS[max(LENGTH_WEIGHTS)]) for length in lengths]
        return rng.choices(lengths, weights=weights)[0]

    @cached_property
    def kinds(self) -> dict[str, float]:
        kinds = dict(KIND_WEIGHTS)
        if not self.words:
            del kinds["word"]
        if not self.number_forms:
            del kinds["number"]
        return kinds

    @cached_property
    def number_forms(self) -> list[str]:
        """The number forms this alphabet can write (a probe of each, with its characters)."""
        probe = random.Random(0)
        return [name for name, form in NUMBER_FORMS.items() if all(self.drawable(form(probe)) for _ in range(20))]

    def sample(self, rng: random.Random) -> str:
        """The text to draw (its label is `self.label(text)`)."""
        kinds = self.kinds
        kind = rng.choices(list(kinds), weights=list(kinds.values()))[0]
        if kind == "word":
            by_length = self.words_by_length
            text = self.cased(rng, rng.choice(by_length[self.length(rng, list(by_length))]))
        elif kind == "number":
            text = NUMBER_FORMS[rng.choice(self.number_forms)](rng)
        else:
            text = self.random_string(rng)
        return text

    def punctuate(self, rng: random.Random, text: str, marks: str) -> str:
        """`text`, now and then with one of `marks` (those the font draws) after it, around it or before it."""
        if not marks or rng.random() >= MARK_SHARE:
            return text
        closing = [mark for mark in ".,:;!?" if mark in marks]
        pairs = [pair for pair in ("()", '""', "''") if set(pair) <= set(marks)]
        where = rng.random()
        if where < 0.6 and closing:
            return text + rng.choice(closing)
        if where < 0.8 and pairs:
            pair = rng.choice(pairs)
            return pair[0] + text + pair[1]
        return rng.choice(marks) + text

    def cased(self, rng: random.Random, word: str) -> str:
        """`word` in a case drawn for it: as listed, lower, Capitalised or UPPER, where drawable."""
        case = rng.choices(list(CASE_WEIGHTS), weights=list(CASE_WEIGHTS.values()))[0]
        forms = {"lower": word.lower(), "capitalised": word[:1].upper() + word[1:].lower(), "upper": word.upper()}
        cased = forms[case] if (self.fold or rng.random() < 0.5) else word
        return cased if self.drawable(cased) else word

    def random_string(self, rng: random.Random) -> str:
        # Whitespace at either end would be invisible in the image but present in the label.
        visible = [char for char in self.alphabet if not char.isspace()]
        length = self.length(rng, list(range(1, self.max_length + 1)))
        middle = rng.choices(self.alphabet, k=max(0, length - 2))
        chars = [rng.choice(visible), *middle, rng.choice(visible)][:length]
        text = "".join(chars)
        if self.fold:  # a case drawn for the whole string, or one per character
            case = rng.random()
            text = (
                "".join(capital(char) for char in text)
                if case < 0.25
                else text
                if case < 0.6
                else "".join(capital(char) if rng.random() < 0.5 else char for char in text)
            )
        return text


def load_words(path: Path, alphabet: str, max_length: int, fold: bool) -> tuple[tuple[str, ...], int]:
    """The words of `path` (one per line, UTF-8) that the alphabet can spell and that fit `max_length`,
    and how many were skipped. A word listed twice is drawn twice as often."""
    known = set(alphabet)
    words, skipped = [], 0
    for line in path.read_text(encoding="utf-8-sig").splitlines():
        word = line.strip()
        if not word:
            continue
        if len(word) <= max_length and set(word.lower() if fold else word) <= known:
            words.append(word)
        else:
            skipped += 1
    return tuple(words), skipped
