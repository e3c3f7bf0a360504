"""Render a synthetic text-recognition dataset: random words on noisy text-line images, as LMDBs.

    python scripts/make_synthetic.py --out datasets/synth                 # 50,000 train + 2,000 val
    python scripts/make_synthetic.py --out datasets/tiny --train 200 --val 50 --overwrite
    python scripts/make_synthetic.py --out datasets/words --words words.txt --fonts my_fonts/
    python scripts/make_synthetic.py --out datasets/cjk --alphabet configs/alphabets/cjk_gb2312_level1.txt

writes `OUT/train` and `OUT/val`. Every sample is drawn from its own random generators, seeded from
(seed, split, index), so a seed gives the same bytes whatever `--workers` is, and val never replays
train's stream. The images are 32 px high RGB JPEGs; labels hold only alphabet characters.

Text: random strings of alphabet characters, or words drawn from `--words FILE` (one per line).
Fonts: the system's DejaVu fonts, plus its CJK fonts when the alphabet has CJK characters, or every
font in `--fonts DIR`. Each font's glyphs are checked against the alphabet: a text is drawn only with a
font that has all of its characters, and characters no font has are left out, with a message.
"""
from __future__ import annotations

import argparse
import io
import os
import random
import subprocess
import sys
import time
import unicodedata
import zlib
from collections import Counter
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from functools import lru_cache, partial
from multiprocessing.pool import Pool
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # so `data` imports from any working directory
from data.alphabet import load_alphabet  # noqa: E402
from data.lmdb_writer import write_lmdb  # noqa: E402

DEFAULT_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"
DEJAVU_FOLDER = Path("/usr/share/fonts/truetype/dejavu")
EXCLUDED_FONTS = ("Math", "ExtraLight")  # symbol coverage only / strokes too thin to read at 32 px
# Where Debian and Ubuntu put fonts-noto-cjk, fonts-wqy-zenhei, fonts-wqy-microhei and fonts-arphic-uming,
# looked at when fontconfig is absent.
CJK_FONT_PATHS = (
    "/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc",
    "/usr/share/fonts/opentype/noto/NotoSerifCJK-Regular.ttc",
    "/usr/share/fonts/truetype/wqy/wqy-zenhei.ttc",
    "/usr/share/fonts/truetype/wqy/wqy-microhei.ttc",
    "/usr/share/fonts/truetype/arphic/uming.ttc",
)
FONT_SUFFIXES = (".ttf", ".otf", ".ttc")
NOT_A_CHARACTER = "\U0010FFFF"  # no font maps it: drawing it shows the font's "missing glyph" box
IMAGE_HEIGHT = 32
MIN_WIDTH, MAX_WIDTH = 16, 300
FONT_SIZES = (22, 40)
MIN_CONTRAST = 90  # luminance (0-255) between text and background: varied, yet always readable
JPEG_QUALITY = 90


def fontconfig_fonts(pattern: str) -> list[tuple[str, str]]:
    """(file, family) of each font `fc-list PATTERN` lists; [] without fontconfig."""
    try:
        listing = subprocess.run(
            ["fc-list", pattern, "file", "family"], capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return []
    return [(file, family) for file, _, family in (line.partition(": ") for line in listing.splitlines())]


def find_fonts() -> list[str]:
    """DejaVu font files, through fontconfig or the Debian folder; [] means Pillow's built-in font.

    Sorted, so that a seed picks the same font on every run.
    """
    fonts = {file for file, family in fontconfig_fonts(":") if "DejaVu" in family}
    if not fonts:
        fonts = {str(path) for path in DEJAVU_FOLDER.glob("*.ttf")}
    return sorted(font for font in fonts if not any(word in Path(font).name for word in EXCLUDED_FONTS))


def find_cjk_fonts() -> list[str]:
    """Fonts for Chinese (which also hold the Japanese kana and much Korean), sorted; [] if none."""
    fonts = {file.rstrip(":") for file, _ in fontconfig_fonts(":lang=zh")}
    fonts |= {path for path in CJK_FONT_PATHS if Path(path).is_file()}
    return sorted(font for font in fonts if font.lower().endswith(FONT_SUFFIXES))


def fonts_in_folder(folder: Path) -> list[str]:
    """Every .ttf, .otf and .ttc file under `folder`, sorted (a .ttc is used through its first face)."""
    if not folder.is_dir():
        raise FileNotFoundError(f"font folder {folder} does not exist")
    fonts = sorted(str(path) for path in folder.rglob("*") if path.suffix.lower() in FONT_SUFFIXES and path.is_file())
    if not fonts:
        raise FileNotFoundError(f"font folder {folder} holds no .ttf, .otf or .ttc file")
    return fonts


def needs_cjk_font(alphabet: str) -> bool:
    # Wide and fullwidth characters: hanzi, kana, hangul and CJK punctuation, none of which DejaVu has.
    return any(unicodedata.east_asian_width(char) in ("W", "F") for char in alphabet)


@lru_cache(maxsize=None)
def load_font(path: str | None, size: int) -> ImageFont.FreeTypeFont:
    # Cached per process: parsing a .ttf costs more than drawing a word with it.
    if path is None:
        return ImageFont.load_default(size=size)
    return ImageFont.truetype(path, size)


@dataclass(frozen=True)
class FontCoverage:
    path: str | None  # None: Pillow's built-in font
    characters: str  # the alphabet's characters this font has a glyph for, in alphabet order
    character_set: frozenset[str]

    def draws(self, text: str) -> bool:
        return self.character_set.issuperset(text)


def covered_characters(path: str | None, alphabet: str) -> str:
    """The characters of `alphabet` the font at `path` has a glyph for, in alphabet order.

    A character the font has no glyph for is drawn as the font's "missing glyph" (usually a box), so a
    character drawn exactly like one no font has is missing. For a font whose missing glyph is blank,
    a character must also leave ink, or be whitespace. Raises OSError for a file that is not a font.
    """
    font = ImageFont.load_default(size=24) if path is None else ImageFont.truetype(
        path, 24, layout_engine=ImageFont.Layout.BASIC)  # BASIC: one glyph per character, no shaping

    def rendering(char: str) -> tuple[tuple[int, int], bytes]:
        mask = font.getmask(char)
        return mask.size, bytes(mask)

    missing = rendering(NOT_A_CHARACTER)
    return "".join(char for char in alphabet
                   if (drawn := rendering(char)) != missing and (char.isspace() or any(drawn[1])))


@dataclass(frozen=True)
class FontPlan:
    """The fonts that can draw part of an alphabet, and the part of the alphabet some font can draw."""

    fonts: tuple[FontCoverage, ...]  # each with at least one of the alphabet's characters
    alphabet: str  # the characters at least one font has, in alphabet order
    missing: str  # the characters no font has: never drawn
    unusable: tuple[tuple[str | None, str], ...]  # (font, why it is not used)


@lru_cache(maxsize=None)
def plan_fonts(fonts: tuple[str | None, ...], alphabet: str) -> FontPlan:
    """Check every font's glyphs against `alphabet` (about 50 us per character and font).

    Cached: the main process computes it before the worker processes fork, and they inherit it.
    """
    usable, unusable = [], []
    for path in fonts:
        try:
            characters = covered_characters(path, alphabet)
        except OSError as error:
            unusable.append((path, f"cannot be read: {error}"))
            continue
        if characters.strip():
            usable.append(FontCoverage(path, characters, frozenset(characters)))
        else:
            unusable.append((path, "no character of the alphabet"))
    drawable = set().union(*(font.character_set for font in usable))
    return FontPlan(fonts=tuple(usable), alphabet="".join(char for char in alphabet if char in drawable),
                    missing="".join(char for char in alphabet if char not in drawable), unusable=tuple(unusable))


@lru_cache(maxsize=None)
def load_words(path: str, alphabet: str, fonts: tuple[str | None, ...]) -> tuple[tuple[str, ...], Counter]:
    """The words of `path` (one per line) that some font can draw, and how many were skipped, by reason.

    Ends are stripped (whitespace there would be invisible in the image but present in the label) and
    blank lines ignored; a word listed twice is drawn twice as often. Cached, like `plan_fonts`.
    """
    known = set(alphabet)
    plan = plan_fonts(fonts, alphabet)
    words, skipped = [], Counter()
    for line in Path(path).read_text(encoding="utf-8-sig").splitlines():
        word = line.strip()
        if not word:
            continue
        if not known.issuperset(word):
            skipped["characters outside the alphabet"] += 1
        elif not any(font.draws(word) for font in plan.fonts):
            skipped["characters no single font has"] += 1
        else:
            words.append(word)
    return tuple(words), skipped


def sample_generators(seed: int, split: str, index: int) -> tuple[random.Random, np.random.Generator]:
    # crc32, not hash(): str hashes change between processes, and so would the data.
    sequence = np.random.SeedSequence([seed, zlib.crc32(split.encode()), index])
    return random.Random(int(sequence.generate_state(1)[0])), np.random.default_rng(sequence)


def random_text(rng: random.Random, alphabet: str, max_length: int) -> str:
    # Whitespace at either end would be invisible in the image but present in the label.
    visible = [char for char in alphabet if not char.isspace()]
    length = rng.randint(1, max_length)
    if length == 1:
        return rng.choice(visible)
    middle = "".join(rng.choices(alphabet, k=length - 2))
    return rng.choice(visible) + middle + rng.choice(visible)


def random_colors(rng: random.Random) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(text, background) colors, gray half of the time, whose luminances differ by MIN_CONTRAST."""
    gray = rng.random() < 0.5
    while True:  # redraw until readable: 1 in 2 gray pairs pass, 1 in 5 color ones
        text_color, background = random_color(rng, gray), random_color(rng, gray)
        if abs(luminance(text_color) - luminance(background)) >= MIN_CONTRAST:
            return text_color, background


def random_color(rng: random.Random, gray: bool) -> tuple[int, int, int]:
    if gray:
        return (rng.randint(0, 255),) * 3
    return rng.randint(0, 255), rng.randint(0, 255), rng.randint(0, 255)


def luminance(color: tuple[int, int, int]) -> float:
    # The weights Pillow's convert("L") uses, so contrast holds for models that read grayscale.
    red, green, blue = color
    return 0.299 * red + 0.587 * green + 0.114 * blue


def render_sample(
    seed: int, split: str, index: int, alphabet: str, fonts: tuple[str | None, ...], max_length: int,
    words_file: str | None = None,
) -> tuple[bytes, str]:
    """Draw sample `index` of `split`: (JPEG bytes of a 32 px high text line, its label).

    The text is a word of `words_file`, or random characters of `alphabet` that some font of `fonts`
    has; it is drawn with a font that has all of its characters.
    """
    rng, noise_rng = sample_generators(seed, split, index)
    plan = plan_fonts(fonts, alphabet)
    if words_file is not None:
        text = rng.choice(load_words(words_file, alphabet, fonts)[0])
    else:
        text = random_text(rng, plan.alphabet, max_length)
    size = rng.randint(*FONT_SIZES)
    # When every font has every character (the default alphabet) this is the same draw as choosing
    # among all fonts, so the default dataset keeps its bytes.
    candidates = [font.path for font in plan.fonts if font.draws(text)]
    if candidates:
        font = load_font(rng.choice(candidates), size)
    else:  # random characters no one font has together (mixed scripts): redraw from one font's characters
        chosen = rng.choice(plan.fonts)
        font = load_font(chosen.path, size)
        text = random_text(rng, chosen.characters, max_length)
    text_color, background = random_colors(rng)

    # The box spans at least cap height to baseline, so words without ascenders or descenders are
    # drawn at the same scale as the rest, and "o" stays smaller than "O".
    left, top, right, bottom = font.getbbox(text, anchor="ls")
    top = min(top, font.getbbox("H", anchor="ls")[1])
    bottom = max(bottom, 0)
    pad_left, pad_right = rng.randint(0, size // 2), rng.randint(0, size // 2)
    pad_top, pad_bottom = rng.randint(0, size // 6), rng.randint(0, size // 6)
    width = right - left + pad_left + pad_right
    height = bottom - top + pad_top + pad_bottom
    image = Image.new("RGB", (width, height), background)
    ImageDraw.Draw(image).text((pad_left - left, pad_top - top), text, font=font, fill=text_color, anchor="ls")

    image = image.rotate(rng.uniform(-3, 3), resample=Image.BICUBIC, expand=True, fillcolor=background)
    if rng.random() < 0.4:
        image = image.filter(ImageFilter.GaussianBlur(rng.uniform(0, 1.2)))
    new_width = min(MAX_WIDTH, max(MIN_WIDTH, round(image.width * IMAGE_HEIGHT / image.height)))
    image = image.resize((new_width, IMAGE_HEIGHT), Image.BILINEAR)

    pixels = np.asarray(image, dtype=np.float32)
    pixels += noise_rng.normal(0, rng.uniform(0, 12), pixels.shape)
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=JPEG_QUALITY)
    return buffer.getvalue(), text


def write_split(
    out: Path, count: int, render: Callable[[int], tuple[bytes, str]], pool: Pool | None, overwrite: bool
) -> None:
    # imap keeps sample order, so the LMDB is the same with one worker or many.
    samples = pool.imap(render, range(count), chunksize=64) if pool else map(render, range(count))
    start = time.perf_counter()
    written = write_lmdb(out, tqdm(samples, total=count, desc=out.name, unit="img"), overwrite=overwrite)
    print(f"{out.name}: wrote {written} samples to {out} in {time.perf_counter() - start:.1f}s")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder that receives train/ and val/")
    parser.add_argument("--train", type=int, default=50_000, help="training samples (default 50000)")
    parser.add_argument("--val", type=int, default=2_000, help="validation samples (default 2000)")
    parser.add_argument("--seed", type=int, default=0, help="non-negative; same seed, same bytes")
    parser.add_argument("--alphabet", default=DEFAULT_ALPHABET, help="characters, or a .txt file with one per line")
    parser.add_argument("--max-length", type=int, default=10, help="longest random word (default 10)")
    parser.add_argument("--words", type=Path, help="draw the text from this UTF-8 file, one word per line, instead"
                        " of random strings (words with characters outside the alphabet are skipped)")
    parser.add_argument("--fonts", type=Path, help="draw with every .ttf/.otf/.ttc font in this folder instead of"
                        " the system's DejaVu (and CJK) fonts")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="rendering processes")
    parser.add_argument("--overwrite", action="store_true", help="replace existing OUT/train and OUT/val")
    args = parser.parse_args(argv)
    for option in ("train", "val", "seed"):
        if getattr(args, option) < 0:
            parser.error(f"--{option} must be >= 0, got {getattr(args, option)}")
    for option in ("max_length", "workers"):
        if getattr(args, option) < 1:
            parser.error(f"--{option.replace('_', '-')} must be >= 1, got {getattr(args, option)}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        alphabet = load_alphabet(args.alphabet)
    except (OSError, ValueError) as error:
        sys.exit(f"error: --alphabet: {error}")
    if alphabet.isspace():
        sys.exit("error: --alphabet has only whitespace; give it characters that can be drawn")
    splits = {"train": args.train, "val": args.val}
    # Checked before rendering anything, so an existing val does not fail the run after train is done.
    existing = [args.out / split for split in splits if (args.out / split).exists()]
    if existing and not args.overwrite:
        sys.exit(f"error: {existing[0]} already exists; remove it or pass --overwrite to replace it")

    fonts = choose_fonts(args.fonts, alphabet)
    plan = plan_fonts(fonts, alphabet)
    report_font_plan(plan, alphabet)
    words_file = None
    if args.words is not None:
        words_file = str(args.words)
        try:
            words, skipped = load_words(words_file, alphabet, fonts)
        except (OSError, UnicodeDecodeError) as error:
            sys.exit(f"error: --words: {error}")
        reasons = ", ".join(f"{count} with {reason}" for reason, count in skipped.items())
        print(f"words: kept {len(words)} of {len(words) + sum(skipped.values())} in {args.words};"
              f" skipped {sum(skipped.values())}{': ' + reasons if reasons else ''}")
        if not words:
            sys.exit(f"error: --words: no word of {args.words} can be drawn with this alphabet and these fonts")
    # The pool forks after the font plan and the word list are computed: the workers inherit both.
    with Pool(args.workers) if args.workers > 1 else nullcontext() as pool:
        for split, count in splits.items():
            render = partial(render_sample, args.seed, split, alphabet=alphabet, fonts=fonts,
                             max_length=args.max_length, words_file=words_file)
            write_split(args.out / split, count, render, pool, args.overwrite)


def choose_fonts(folder: Path | None, alphabet: str) -> tuple[str | None, ...]:
    """The fonts of `folder`, or else the system's DejaVu fonts and, for a CJK alphabet, its CJK fonts."""
    if folder is not None:
        try:
            fonts = fonts_in_folder(folder)
        except FileNotFoundError as error:
            sys.exit(f"error: --fonts: {error}")
        print(f"{len(fonts)} fonts in {folder}")
        return tuple(fonts)
    fonts = find_fonts()
    print(f"{len(fonts)} DejaVu fonts" if fonts else "no DejaVu fonts found: drawing with Pillow's built-in font")
    if needs_cjk_font(alphabet):
        cjk_fonts = find_cjk_fonts()
        if cjk_fonts:
            print(f"{len(cjk_fonts)} CJK fonts: {', '.join(Path(font).name for font in cjk_fonts)}")
        else:
            print("no CJK font found (fc-list :lang=zh lists none; install fonts-noto-cjk or fonts-wqy-zenhei, or"
                  " pass --fonts DIR): drawing each text with a font that has all of its characters")
        fonts = cjk_fonts + fonts
    return tuple(fonts) or (None,)


def report_font_plan(plan: FontPlan, alphabet: str) -> None:
    by_reason: dict[str, list[str]] = {}
    for font, reason in plan.unusable:
        by_reason.setdefault(reason, []).append(Path(font).name if font else "the built-in font")
    for reason, names in by_reason.items():
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        print(f"not using {shown}: {reason}")
    if plan.missing:
        shown = " ".join(repr(char) for char in plan.missing[:20]) + (" ..." if len(plan.missing) > 20 else "")
        print(f"{len(plan.missing)} of the alphabet's {len(alphabet)} characters are in no font and are never"
              f" drawn: {shown}")
    if not plan.alphabet.strip():
        sys.exit("error: no font can draw any character of the alphabet; install fonts that have them"
                 " (fonts-noto-cjk for Chinese, Japanese and Korean) or pass --fonts DIR")


if __name__ == "__main__":
    main()
