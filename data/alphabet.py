"""The alphabet: the characters a model reads, given inline or as a file with one per line.

Kept free of torch so that data tools start fast.
"""

from __future__ import annotations

import os
import re
import unicodedata
from pathlib import Path

# Names other toolkits give the CTC blank or padding (compared lowercased, without <>, [] or {}).
BLANK_TOKEN_NAMES = {"blank", "pad", "ctc", "ctc_blank", "ctc-blank", "ctcblank", "eps", "epsilon"}
BLANK_IS_IMPLICIT = "the CTC blank is class 0, added by the codec, and must not be listed"
# A value that looks like a file name: something, a dot, then 1-5 ASCII letters or digits starting with
# a letter. An alphabet of characters ends so only if it lists letters after a '.', in ASCII order, rare.
FILE_NAME = re.compile(r".+\.[A-Za-z][A-Za-z0-9]{0,4}")


def load_alphabet(spec: str) -> str:
    """Return the alphabet named by `spec`: the characters themselves, or a file with one per line
    (`~/` is the home folder).

    A value that names an existing file, or that looks like a file name (ends in `.` and a few
    letters: `keys.txt`, `chars.dat`), is read as a file; anything else is the alphabet. Files are how
    large alphabets (thousands of CJK characters) are given. Characters come back composed (NFC), the
    form CTCCodec.normalize gives labels: `é` typed as `e` + U+0301 on a line of its own is one character.
    """
    path = Path(os.path.expanduser(spec) if spec.startswith("~/") else spec)
    if not (FILE_NAME.fullmatch(spec) or path.exists()):  # a folder is a file name gone wrong, not characters
        alphabet = composed(spec)
        check_alphabet(alphabet, source="data.alphabet")
        return alphabet
    if path.is_dir():
        raise ValueError(f"alphabet file {spec!r} is a folder; give a file with one character per line")
    if not path.is_file():
        raise FileNotFoundError(
            f"alphabet file {spec!r} does not exist (a value ending in '{path.suffix}' names a file,"
            f" one character per line; check the path, relative to the working directory; to mean these characters,"
            f" move the '.' elsewhere in the alphabet)"
        )
    characters = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        line = unicodedata.normalize("NFC", line)
        if not line:
            raise ValueError(
                f"{spec}:{number}: empty line; {BLANK_IS_IMPLICIT}: delete the line"
                " (write a space as a line holding a single space)"
            )
        if line.strip().strip("<>[]{}").lower() in BLANK_TOKEN_NAMES:
            raise ValueError(
                f"{spec}:{number}: {line!r} looks like a blank token; {BLANK_IS_IMPLICIT}: delete the line"
            )
        if len(line) != 1:
            raise ValueError(
                f"{spec}:{number}: expected exactly one character per line, got {line!r}"
                " (write a space as a line holding a single space)"
            )
        characters.append(line)
    alphabet = "".join(characters)
    check_alphabet(alphabet, source=spec, lines=True)
    return alphabet


def composed(alphabet: str) -> str:
    """Each character in its composed (NFC) form, where that is one character (U+212B ANGSTROM SIGN is
    U+00C5). Characters are not joined: a letter followed by a combining accent stays two classes, for
    alphabets that list accents on their own."""
    return "".join(form if len(form := unicodedata.normalize("NFC", char)) == 1 else char for char in alphabet)


def check_alphabet(alphabet: str, source: str = "alphabet", lines: bool = False) -> None:
    """Reject an empty alphabet, repeated characters and control characters, naming where they are.

    `lines`: the alphabet came from a file, one character per line, so positions are named as lines.
    """

    def where(position: int) -> str:
        return f"{source}:{position + 1}" if lines else f"{source}: position {position}"

    if not alphabet:
        raise ValueError(f"{source}: the alphabet is empty")
    seen: dict[str, int] = {}
    for position, char in enumerate(alphabet):
        if char in seen:
            first = f"line {seen[char] + 1}" if lines else f"position {seen[char]}"
            raise ValueError(
                f"{where(position)}: character {char!r} appears twice (first at {first});"
                " every character must be listed once"
            )
        # Control characters never appear in rendered text; "\x00" is a common stand-in for the blank.
        if unicodedata.category(char) == "Cc":
            raise ValueError(
                f"{where(position)}: control character {char!r} (U+{ord(char):04X}) cannot be an alphabet"
                " character; remove it (if it stood for the CTC blank: the blank is class 0 and added"
                " by the codec)"
            )
        seen[char] = position


# What prints nothing: control characters (Cc), format characters (Cf: U+200B ZERO WIDTH SPACE, U+00AD SOFT
# HYPHEN, U+FEFF, the bidi controls, ...) and the line and paragraph separators. A label holding one looks
# right and is not; a script that writes one (U+200C ZERO WIDTH NON-JOINER in Persian) lists it in its alphabet.
INVISIBLE_CATEGORIES = ("Cc", "Cf", "Zl", "Zp")


def invisible_characters(text: str) -> list[str]:
    """The characters of `text` that print nothing, each once, in order of appearance."""
    if text.isprintable():  # every one of them is unprintable: most labels take this one call
        return []
    return list(dict.fromkeys(char for char in text if unicodedata.category(char) in INVISIBLE_CATEGORIES))


def describe_character(char: str) -> str:
    """`char` as a message shows it: quoted, and with its code point and name where it does not print."""
    if char.isprintable():
        return repr(char)
    name = unicodedata.name(char, "<control>" if unicodedata.category(char) == "Cc" else "<no name>")
    return f"{char!r} (U+{ord(char):04X} {name})"
