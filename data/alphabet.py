"""The alphabet: the characters a model reads, given inline or as a file with one per line.

Kept free of torch so that data tools start fast.
"""
from __future__ import annotations

from pathlib import Path


def load_alphabet(spec: str) -> str:
    """Return the alphabet named by `spec`: the characters themselves, or a file with one per line.

    A value that names an existing file, or that ends in `.txt`, is read as a file; anything else is
    the alphabet. Files are how large alphabets (thousands of CJK characters) are given.
    """
    path = Path(spec)
    if not (spec.endswith(".txt") or path.is_file()):
        check_alphabet(spec, source="data.alphabet")
        return spec
    if not path.is_file():
        raise FileNotFoundError(f"alphabet file {spec!r} does not exist (data.alphabet names a .txt file)")
    characters = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if len(line) != 1:
            raise ValueError(
                f"{spec}:{number}: expected exactly one character per line, got {line!r}"
                " (write a space as a line holding a single space)"
            )
        characters.append(line)
    alphabet = "".join(characters)
    check_alphabet(alphabet, source=spec)
    return alphabet


def check_alphabet(alphabet: str, source: str = "alphabet") -> None:
    if not alphabet:
        raise ValueError(f"{source}: the alphabet is empty")
    seen: dict[str, int] = {}
    for position, char in enumerate(alphabet):
        if char in seen:
            raise ValueError(
                f"{source}: character {char!r} appears twice (positions {seen[char]} and {position});"
                " every character must be listed once"
            )
        seen[char] = position
    if "\n" in seen or "\r" in seen:
        raise ValueError(f"{source}: line breaks cannot be alphabet characters")
