"""Render a synthetic text-recognition dataset: random words on noisy text-line images, as LMDBs.

    python scripts/make_synthetic.py --out datasets/synth                 # 50,000 train + 2,000 val
    python scripts/make_synthetic.py --out datasets/tiny --train 200 --val 50 --overwrite

writes `OUT/train` and `OUT/val`. Every sample is drawn from its own random generators, seeded from
(seed, split, index), so a seed gives the same bytes whatever `--workers` is, and val never replays
train's stream. The images are 32 px high RGB JPEGs; labels hold only alphabet characters.
"""
from __future__ import annotations

import argparse
import io
import os
import random
import subprocess
import sys
import time
import zlib
from collections.abc import Callable
from contextlib import nullcontext
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
IMAGE_HEIGHT = 32
MIN_WIDTH, MAX_WIDTH = 16, 300
FONT_SIZES = (22, 40)
MIN_CONTRAST = 90  # luminance (0-255) between text and background: varied, yet always readable
JPEG_QUALITY = 90


def find_fonts() -> list[str]:
    """DejaVu font files, through fontconfig or the Debian folder; [] means Pillow's built-in font.

    Sorted, so that a seed picks the same font on every run.
    """
    try:
        listing = subprocess.run(
            ["fc-list", ":", "file", "family"], capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        listing = ""
    candidates = [line.partition(": ") for line in listing.splitlines()]
    fonts = {file for file, _, family in candidates if "DejaVu" in family}
    if not fonts:
        fonts = {str(path) for path in DEJAVU_FOLDER.glob("*.ttf")}
    return sorted(font for font in fonts if not any(word in Path(font).name for word in EXCLUDED_FONTS))


@lru_cache(maxsize=None)
def load_font(path: str | None, size: int) -> ImageFont.FreeTypeFont:
    # Cached per process: parsing a .ttf costs more than drawing a word with it.
    if path is None:
        return ImageFont.load_default(size=size)
    return ImageFont.truetype(path, size)


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
    seed: int, split: str, index: int, alphabet: str, fonts: list[str], max_length: int
) -> tuple[bytes, str]:
    """Draw sample `index` of `split`: (JPEG bytes of a 32 px high text line, its label)."""
    rng, noise_rng = sample_generators(seed, split, index)
    text = random_text(rng, alphabet, max_length)
    size = rng.randint(*FONT_SIZES)
    font = load_font(rng.choice(fonts) if fonts else None, size)
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
    parser.add_argument("--max-length", type=int, default=10, help="longest word (default 10)")
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

    fonts = find_fonts()
    print(f"{len(fonts)} DejaVu fonts" if fonts else "no DejaVu fonts found: drawing with Pillow's built-in font")
    with Pool(args.workers) if args.workers > 1 else nullcontext() as pool:
        for split, count in splits.items():
            render = partial(
                render_sample, args.seed, split, alphabet=alphabet, fonts=fonts, max_length=args.max_length
            )
            write_split(args.out / split, count, render, pool, args.overwrite)


if __name__ == "__main__":
    main()
