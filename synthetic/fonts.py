"""Typefaces for the renderer: where they come from, which characters each can draw, and which
families are held out of training.

Fonts come from three places: fontconfig (every font installed on the system, e.g. Debian's
fonts-dejavu-core or fonts-liberation), Python packages that ship font files and register them
under the `fontpkg.family` entry point (PyPI's `fontpkg-*` Google Fonts families, see
requirements-synthetic.txt), and `--fonts DIR`. A font is used for a text only if it has a glyph for
every character of it.
"""

from __future__ import annotations

import json
import subprocess
import unicodedata
from dataclasses import dataclass
from functools import cached_property, lru_cache
from importlib.metadata import entry_points
from importlib.util import find_spec
from pathlib import Path

from PIL import ImageFont

from synthetic.text import capital, unlabelled_marks

FONT_SUFFIXES = (".ttf", ".otf", ".ttc")
FONT_PACKAGE_GROUP = "fontpkg.family"
# Symbol coverage only / strokes too thin to read at 32 px.
EXCLUDED_NAMES = ("Math", "ExtraLight", "Thin", "Hairline")
NOT_A_CHARACTER = "\U0010ffff"  # no font maps it: drawing it shows the font's "missing glyph" box
# Held out of train and val, rendered only in test, when present: one each of the kinds of typeface
# train has (sans, serif, monospace, condensed, slab), and DejaVu Serif, so a machine with DejaVu
# alone still has an unseen family to test on.
HELD_OUT_FAMILIES = ("DejaVu Serif", "Lato", "PT Serif", "IBM Plex Mono", "Roboto Condensed", "Zilla Slab")


@dataclass(frozen=True)
class Font:
    path: str | None  # None: Pillow's built-in font
    family: str
    origin: str  # "fontconfig", "package fontpkg-lato (OFL-1.1)", "--fonts DIR"


SYSTEM_FONT_FOLDERS = (Path("/usr/share/fonts"), Path("/usr/local/share/fonts"), Path.home() / ".fonts")


def system_fonts() -> list[Font]:
    """Every font file `fc-list` knows, with its first family name; without fontconfig, the fonts in
    the usual folders."""
    try:
        listing = subprocess.run(["fc-list", ":", "file", "family"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return [font for folder in SYSTEM_FONT_FOLDERS if folder.is_dir() for font in folder_fonts(folder)]
    fonts = []
    for line in listing.splitlines():
        path, _, families = line.partition(": ")
        path = path.rstrip(":")
        if path.lower().endswith(FONT_SUFFIXES) and families:
            fonts.append(Font(path, families.split(",")[0].strip(), "fontconfig"))
    return fonts


def package_fonts() -> list[Font]:
    """The fonts of installed font packages (the `fontpkg.family` entry point: a module holding
    metadata.json and its font files)."""
    fonts = []
    for entry in entry_points(group=FONT_PACKAGE_GROUP):
        spec = find_spec(entry.value.split(":")[0])
        if spec is None or not spec.submodule_search_locations:
            continue
        root = Path(next(iter(spec.submodule_search_locations)))
        try:
            metadata = json.loads((root / "metadata.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        origin = f"package {entry.dist.name if entry.dist else entry.name} ({metadata.get('license', '?')})"
        for item in metadata.get("files", []):
            fonts.append(Font(str(root / item["path"]), metadata["family"], origin))
    return fonts


def folder_fonts(folder: Path) -> list[Font]:
    """Every .ttf, .otf and .ttc under `folder` (a .ttc through its first face), with the family it names."""
    if not folder.is_dir():
        raise FileNotFoundError(f"font folder {folder} does not exist")
    paths = sorted(path for path in folder.rglob("*") if path.suffix.lower() in FONT_SUFFIXES and path.is_file())
    if not paths:
        raise FileNotFoundError(f"font folder {folder} holds no .ttf, .otf or .ttc file")
    fonts = []
    for path in paths:
        try:
            family = ImageFont.truetype(str(path), 12).getname()[0] or path.stem
        except OSError:
            family = path.stem  # unreadable: the coverage check reports it
        fonts.append(Font(str(path), family, f"--fonts {folder}"))
    return fonts


def find_fonts(folder: Path | None = None, installed: bool = True) -> list[Font]:
    """The machine's fonts and its font packages' (unless not `installed`) and `folder`'s, one entry per
    file, sorted by path so a seed picks the same font on every run. [] means Pillow's built-in font only."""
    found = (system_fonts() + package_fonts() if installed else []) + (folder_fonts(folder) if folder else [])
    unique = {font.path: font for font in found if not any(word in Path(font.path).name for word in EXCLUDED_NAMES)}
    return sorted(unique.values(), key=lambda font: font.path)


@lru_cache(maxsize=4096)  # per process: parsing a .ttf costs more than drawing a word with it
def load_font(path: str | None, size: int) -> ImageFont.FreeTypeFont:
    if path is None:
        return ImageFont.load_default(size=size)
    return ImageFont.truetype(path, size)


def covered_characters(path: str | None, alphabet: str) -> str:
    """The characters of `alphabet` the font at `path` has a glyph for, in alphabet order.

    A character the font has no glyph for is drawn as the font's "missing glyph" (usually a box), so a
    character drawn exactly like one no font has is missing. For a font whose missing glyph is blank,
    a character must also leave ink, or be whitespace. Raises OSError for a file that is not a font.
    """
    font = (
        ImageFont.load_default(size=24)
        if path is None
        else ImageFont.truetype(path, 24, layout_engine=ImageFont.Layout.BASIC)
    )  # BASIC: one glyph per character, no shaping

    def rendering(char: str) -> tuple[tuple[int, int], bytes]:
        mask = font.getmask(char)
        return mask.size, bytes(mask)

    missing = rendering(NOT_A_CHARACTER)
    return "".join(
        char for char in alphabet if (drawn := rendering(char)) != missing and (char.isspace() or any(drawn[1]))
    )


def drawable_form(char: str) -> str:
    """What must be drawn for `char`: itself, and for a case-folded letter also its capital."""
    upper = capital(char)
    return char + upper if upper != char else char


@dataclass(frozen=True)
class FontCoverage:
    font: Font
    characters: str  # the alphabet's characters this font can draw (in every case drawn), alphabet order
    character_set: frozenset[str]
    marks: str = ""  # the MARKS outside the alphabet it draws

    def draws(self, text: str) -> bool:
        return self.character_set.issuperset(text)


class FontPool:
    """Fonts to draw with, indexed by character: the fonts that have every character of a text are an AND
    of one bit mask per character, where testing each font's set took 6 % of the generator's time."""

    def __init__(self, coverages: tuple[FontCoverage, ...]) -> None:
        self.coverages = coverages
        self.having: dict[str, int] = {}  # character -> a mask with bit i set where coverages[i] draws it
        members: dict[str, int] = {}
        for index, coverage in enumerate(coverages):
            for char in coverage.character_set:
                self.having[char] = self.having.get(char, 0) | 1 << index
            members[coverage.font.family] = members.get(coverage.font.family, 0) | 1 << index
        self.families = sorted(members.items())  # (family, its fonts' mask), by name

    def drawing(self, text: str) -> int:
        """The mask of the fonts that draw every character of `text`."""
        mask = (1 << len(self.coverages)) - 1
        for char in set(text):
            mask &= self.having.get(char, 0)
        return mask

    def fonts_in(self, mask: int) -> list[FontCoverage]:
        """The fonts of `mask`, in the pool's order."""
        return [coverage for index, coverage in enumerate(self.coverages) if mask >> index & 1]


@dataclass(frozen=True)
class FontPlan:
    """The fonts that can draw part of an alphabet, split into the families train and val use and
    those only test uses, and the part of the alphabet some font can draw."""

    train: tuple[FontCoverage, ...]
    held_out: tuple[FontCoverage, ...]
    alphabet: str  # the characters at least one training font has, in alphabet order
    missing: str  # the characters no training font has: never drawn
    unusable: tuple[tuple[str | None, str], ...]  # (font, why it is not used)

    def families(self, held_out: bool) -> list[str]:
        return [family for family, _ in (self.held_out_pool if held_out else self.train_pool).families]

    @cached_property
    def train_pool(self) -> FontPool:
        return FontPool(self.train)

    @cached_property
    def held_out_pool(self) -> FontPool:
        return FontPool(self.held_out)


@lru_cache(maxsize=None)
def plan_fonts(
    fonts: tuple[Font, ...], alphabet: str, held_out_families: tuple[str, ...], draw_capitals: bool
) -> FontPlan:
    """Check every font's glyphs against `alphabet` (about 50 us per character and font) and split the
    families. With `draw_capitals`, a lowercase letter counts as covered only if its capital is too.

    Cached: the main process computes it before the worker processes fork, and they inherit it.
    """
    usable, unusable = [], []
    for font in fonts:
        try:
            covered = set(
                covered_characters(
                    font.path,
                    "".join(
                        dict.fromkeys("".join(drawable_form(char) if draw_capitals else char for char in alphabet))
                    ),
                )
            )
        except OSError as error:
            unusable.append((font.path, f"cannot be read: {error}"))
            continue
        characters = "".join(
            char for char in alphabet if set(drawable_form(char) if draw_capitals else char) <= covered
        )
        marks = covered_characters(font.path, unlabelled_marks(alphabet))
        if characters.strip():
            usable.append(FontCoverage(font, characters, frozenset(characters), marks))
        else:
            unusable.append((font.path, "no character of the alphabet"))
    families = {coverage.font.family for coverage in usable}
    held = {family for family in held_out_families if family in families}
    if held == families:  # a single family, or every one named: nothing would be left to train on
        held = set()
    train = tuple(coverage for coverage in usable if coverage.font.family not in held)
    held_out = tuple(coverage for coverage in usable if coverage.font.family in held)
    drawable = set().union(*(coverage.character_set for coverage in train))
    return FontPlan(
        train=train,
        held_out=held_out,
        alphabet="".join(char for char in alphabet if char in drawable),
        missing="".join(char for char in alphabet if char not in drawable),
        unusable=tuple(unusable),
    )


def needs_cjk_font(alphabet: str) -> bool:
    # Wide and fullwidth characters: hanzi, kana, hangul and CJK punctuation, none of which DejaVu has.
    return any(unicodedata.east_asian_width(char) in ("W", "F") for char in alphabet)
