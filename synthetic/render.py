"""One synthetic sample: text in a typeface, on a background, through the geometry and the
degradations of a photographed or scanned line of print, encoded as a 32-pixel-high JPEG.

Every sample draws from its own generators, seeded from (seed, split, index), so a seed gives the
same bytes whatever the number of worker processes.
"""

from __future__ import annotations

import io
import json
import random
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageChops, ImageDraw, ImageFilter, ImageFont

from synthetic.backgrounds import (
    HELD_OUT_STYLES,
    PHOTO,
    TRAIN_STYLES,
    check_photo,
    luminance,
    paint,
)
from synthetic.fonts import (
    HELD_OUT_FAMILIES,
    Font,
    FontCoverage,
    FontPlan,
    FontPool,
    find_fonts,
    load_font,
    plan_fonts,
)
from synthetic.text import WORDS_FILE, TextSampler, folds_case, load_words, unlabelled_marks

IMAGE_HEIGHT = 32
MIN_WIDTH, MAX_WIDTH = 16, 300
FONT_SIZES = (24, 44)
MIN_CONTRAST = 70  # luminance (0-255) between text and background: varied, yet readable
TEST_SPLIT = "test"  # rendered with the held-out font families and background styles only
# Incidental text (IC15) is often steeply tilted: 345 of its 4,468 training crops are taller than wide,
# most of them short words at 10 to 60 degrees in an upright box. A share of the short texts is drawn
# so; a long one at 40 degrees would no longer be a word crop.
TILT_SHARE, TILT_DEGREES, TILT_MAX_LENGTH = 0.12, (8, 40), 8
# The crop is fitted to the mask's pixels above 64: a lookup table, which Pillow would otherwise build
# by calling a function 256 times per sample.
INK_THRESHOLD = [255 if value > 64 else 0 for value in range(256)]


@dataclass(frozen=True)
class RenderPlan:
    """What every sample draws from; computed once, before the worker processes fork."""

    fonts: FontPlan
    text: TextSampler
    photos: tuple[str, ...] = ()  # photo files for train and val
    held_out_photos: tuple[str, ...] = ()  # for test

    def fonts_for(self, split: str) -> FontPool:
        return self.fonts.held_out_pool if split == TEST_SPLIT and self.fonts.held_out else self.fonts.train_pool

    def styles_for(self, split: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(background styles, photo files) of `split`."""
        if split == TEST_SPLIT:
            return HELD_OUT_STYLES + ((PHOTO,) if self.held_out_photos else ()), self.held_out_photos
        return TRAIN_STYLES + ((PHOTO,) if self.photos else ()), self.photos


@dataclass(frozen=True)
class Sample:
    image: bytes  # JPEG
    label: str
    meta: dict  # font family and file, background style: what held-out checks read


def sample_generators(seed: int, split: str, index: int) -> tuple[random.Random, np.random.Generator]:
    # crc32, not hash(): str hashes change between processes, and so would the data.
    sequence = np.random.SeedSequence([seed, zlib.crc32(split.encode()), index])
    return random.Random(int(sequence.generate_state(1)[0])), np.random.default_rng(sequence)


def choose_font(rng: random.Random, fonts: FontPool, label: str) -> FontCoverage | None:
    """A font that has every character of `label`: a family first (a family of 18 static files is not
    18 times as likely), then one of its files."""
    drawing = fonts.drawing(label)
    families = [drawn for _, members in fonts.families if (drawn := members & drawing)]
    if not families:
        return None
    return rng.choice(fonts.fonts_in(rng.choice(families)))


def vary(font: ImageFont.FreeTypeFont, rng: random.Random) -> str:
    """Set a variable font's weight (and width, where it has one) at random; a name for the record."""
    try:
        axes = font.get_variation_axes()
    except (OSError, AttributeError):  # not a variable font
        return ""
    values = []
    for axis in axes:
        name = axis["name"].decode() if isinstance(axis["name"], bytes) else str(axis["name"])
        low, high, default = axis["minimum"], axis["maximum"], axis["default"]
        if name.lower() == "weight":
            values.append(rng.uniform(max(low, 300), min(high, 800)))
        elif name.lower() == "width" and rng.random() < 0.5:
            values.append(rng.uniform(max(low, 75), min(high, 110)))
        else:
            values.append(default)
    font.set_variation_by_axes(values)
    return ",".join(f"{value:.0f}" for value in values)


def layout(text: str, font: ImageFont.FreeTypeFont, rng: random.Random, size: int) -> list[tuple[str, float, float]]:
    """(piece, x, y of its baseline) to draw: the whole text at once (with kerning), or character by
    character with extra letter spacing or on a curved baseline."""
    spacing = size * rng.uniform(0.05, 0.35) if rng.random() < 0.12 else 0.0
    curve = size * rng.uniform(0.08, 0.25) if rng.random() < 0.1 and len(text) > 2 else 0.0
    if not spacing and not curve:
        return [(text, 0.0, 0.0)]
    pieces, x = [], 0.0
    phase, sign = rng.uniform(0, np.pi), rng.choice((-1, 1))
    for position, char in enumerate(text):
        y = sign * curve * np.sin(phase + np.pi * position / max(len(text) - 1, 1)) if curve else 0.0
        pieces.append((char, x, y))
        x += font.getlength(char) + spacing
    return pieces


def draw_pieces(
    draw: ImageDraw.ImageDraw,
    pieces: list[tuple[str, float, float]],
    origin: tuple[float, float],
    font: ImageFont.FreeTypeFont,
    fill: int,
    stroke: int = 0,
) -> None:
    for piece, x, y in pieces:
        draw.text(
            (origin[0] + x, origin[1] + y),
            piece,
            font=font,
            fill=fill,
            anchor="ls",
            stroke_width=stroke,
            stroke_fill=fill,
        )


def text_color(rng: random.Random, background: float, light_text: bool) -> np.ndarray:
    """A text colour whose luminance differs from the background's by at least MIN_CONTRAST."""
    for _ in range(50):
        color = np.array([rng.uniform(0, 255) for _ in range(3)], dtype=np.float32)
        if rng.random() < 0.6:
            color[:] = rng.uniform(0, 255)
        if abs(luminance(color) - background) >= MIN_CONTRAST and (luminance(color) > background) == light_text:
            return color
    return np.full(3, 255.0 if light_text else 0.0, dtype=np.float32)


def steep_tilt(rng: random.Random, text: str) -> float:
    """Degrees of a steep tilt for `text`, or 0."""
    if len(text) > TILT_MAX_LENGTH or rng.random() >= TILT_SHARE:
        return 0.0
    return rng.choice((-1, 1)) * rng.uniform(*TILT_DEGREES)


def geometry(
    rng: random.Random, width: int, height: int, tilt: float
) -> tuple[Image.Transform, tuple[float, ...]] | None:
    """A rotation with shear (by `tilt` degrees where it is not 0), or a perspective, as Image.transform's
    inverse coefficients; None for none."""
    choice = rng.random()
    if choice < 0.35 and not tilt:
        return None
    cx, cy = width / 2, height / 2
    if choice < 0.75 or tilt:
        angle = np.radians(tilt or (rng.uniform(-3, 3) if rng.random() < 0.85 else rng.uniform(-8, 8)))
        shear = rng.uniform(-0.3, 0.3) if rng.random() < 0.3 else 0.0
        cos, sin = np.cos(angle), np.sin(angle)
        # output (x, y) -> input: rotate by -angle about the centre, then undo the shear
        a, b = cos, sin + shear
        d, e = -sin, cos
        return Image.Transform.AFFINE, (a, b, cx - a * cx - b * cy, d, e, cy - d * cx - e * cy)
    jitter = (0.12 if rng.random() < 0.7 else 0.25) * min(width, 3 * height)  # now and then a steep view
    source = [
        (rng.uniform(-1, 1) * jitter + x, rng.uniform(-1, 1) * jitter * 0.4 + y)
        for x, y in ((0, 0), (width, 0), (width, height), (0, height))
    ]
    return Image.Transform.PERSPECTIVE, perspective_coefficients(
        [(0, 0), (width, 0), (width, height), (0, height)], source
    )


def perspective_coefficients(output: list[tuple[float, float]], source: list[tuple[float, float]]) -> tuple[float, ...]:
    """The 8 coefficients mapping each `output` corner to its `source` corner, as Pillow's PERSPECTIVE wants."""
    rows, values = [], []
    for (x, y), (u, v) in zip(output, source):
        rows.append([x, y, 1, 0, 0, 0, -u * x, -u * y])
        rows.append([0, 0, 0, x, y, 1, -v * x, -v * y])
        values += [u, v]
    return tuple(np.linalg.solve(np.array(rows, dtype=np.float64), np.array(values, dtype=np.float64)))


def crop_box(
    rng: random.Random, box: tuple[int, int, int, int], size: int, width: int, height: int, neighbours: bool
) -> tuple[int, int, int, int]:
    """The crop around the text's ink `box`: tight (the ink's edge may be shaved), usual, or loose. With
    `neighbours` on the line, the sides stay within half an em, so a neighbour shows in part only."""
    left, top, right, bottom = box
    style = rng.random()
    if style < 0.2:  # tight
        margins = [rng.uniform(-0.04, 0.08) * size for _ in range(4)]
    elif style < 0.85:
        margins = [
            rng.uniform(0.05, 0.35) * size,
            rng.uniform(0.05, 0.25) * size,
            rng.uniform(0.05, 0.35) * size,
            rng.uniform(0.05, 0.25) * size,
        ]
    else:  # loose
        margins = [
            rng.uniform(0.3, 0.9) * size,
            rng.uniform(0.2, 0.5) * size,
            rng.uniform(0.3, 0.9) * size,
            rng.uniform(0.2, 0.5) * size,
        ]
    if neighbours:
        margins[0], margins[2] = min(margins[0], 0.5 * size), min(margins[2], 0.5 * size)
    return (
        max(0, round(left - margins[0])),
        max(0, round(top - margins[1])),
        min(width, round(right + margins[2])),
        min(height, round(bottom + margins[3])),
    )


def degrade(image: Image.Image, rng: random.Random, noise: np.random.Generator, effects: list[str]) -> Image.Image:
    """Blur, motion blur, low resolution and sensor noise, each with its own probability; the names
    of those applied are added to `effects`."""
    if rng.random() < 0.3:
        effects.append("blur")
        image = image.filter(ImageFilter.GaussianBlur(rng.uniform(0.3, 1.4)))
    if rng.random() < 0.12:
        effects.append("motion blur")  # motion: a short line kernel, horizontal, vertical or diagonal
        kernel = np.zeros((3, 3), dtype=np.float32)
        direction = rng.randrange(4)
        for i in range(3):
            kernel[((1, i), (i, 1), (i, i), (i, 2 - i))[direction]] = 1
        image = image.filter(ImageFilter.Kernel((3, 3), kernel.flatten().tolist(), scale=3))
    if rng.random() < 0.2:  # low resolution, scaled back up
        effects.append("low resolution")
        small_height = rng.randint(10, 20)
        small = image.resize(
            (max(4, round(image.width * small_height / image.height)), small_height), Image.Resampling.BILINEAR
        )
        image = small.resize(image.size, Image.Resampling.BILINEAR)
    if rng.random() < 0.5:
        effects.append("noise")
        pixels = np.asarray(image, dtype=np.float32)
        pixels = pixels + noise.normal(0, rng.uniform(2, 14), pixels.shape[:2] + (1 if rng.random() < 0.7 else 3,))
        image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    return image


def neighbour_text(plan: RenderPlan, rng: random.Random) -> str:
    """A text of at least 3 characters where the sampler gives one within a few draws: a neighbour of
    one or two characters would fit whole inside a loose crop, and become part of what is read."""
    text = plan.text.sample(rng)
    for _ in range(4):
        if len(text) >= 3:
            break
        text = plan.text.sample(rng)
    return text


@dataclass(frozen=True)
class Lettering:
    """What a sample says, and how it is set: the text, its label, and the font's pieces to draw."""

    text: str
    label: str
    coverage: FontCoverage  # the font file, and the characters it has
    size: int  # pixels per em
    font: ImageFont.FreeTypeFont
    variation: str  # a variable font's axis values, for the record
    pieces: list[tuple[str, float, float]]  # (piece, x, y of its baseline), as layout() places them
    width: float  # of the set text, in pixels


@dataclass(frozen=True)
class Frame:
    """The canvas around the set text, in pixels."""

    width: int
    height: int
    margin: int  # on the left and right
    margin_y: int  # above and below
    origin: tuple[float, float]  # where the text's baseline starts
    tilt: float  # degrees of a steep tilt, or 0


@dataclass(frozen=True)
class Ground:
    """What the text is painted on, and in which colour."""

    style: str
    photo: str | None  # the file of style PHOTO
    pixels: np.ndarray  # [height, width, 3] float32 in 0..255
    light: bool  # a light background
    light_text: bool
    text_color: np.ndarray  # RGB float32


def render_sample(plan: RenderPlan, seed: int, split: str, index: int) -> Sample:
    """Sample `index` of `split`, in the order a line of print is made and then photographed: the text set
    in a font, the canvas painted behind it, the ink and its effects, then the geometry, crop and
    degradations. Each step draws from the sample's generators in turn: reordering them changes the data."""
    rng, noise = sample_generators(seed, split, index)
    lettering = set_text(plan, rng, split)
    frame = frame_text(rng, lettering)
    ground = paint_ground(plan, rng, noise, split, frame)
    effects: list[str] = []  # the names of those applied, in order, for the record
    ink, mask, neighbours = draw_ink(plan, rng, lettering, frame, effects)
    canvas = paint_ink(rng, ink, lettering, frame, ground, effects)
    if len(lettering.pieces) > 1:
        effects.append("letter spacing or curve")
    if frame.tilt:
        effects.append("tilt")
    image = transform_and_crop(rng, canvas, mask, frame, lettering.size, neighbours, effects)
    image = degrade(image, rng, noise, effects)
    new_width = min(MAX_WIDTH, max(MIN_WIDTH, round(image.width * IMAGE_HEIGHT / image.height)))
    image = image.resize((new_width, IMAGE_HEIGHT), Image.Resampling.BILINEAR)
    jpeg, quality = encode_jpeg(rng, image)
    return Sample(jpeg, lettering.label, sample_meta(lettering, ground, effects, quality))


def set_text(plan: RenderPlan, rng: random.Random, split: str) -> Lettering:
    """A text, its label, and a font of `split` that has every character of it, laid out."""
    fonts = plan.fonts_for(split)
    text = plan.text.sample(rng)
    label = plan.text.label(text)
    chosen = choose_font(rng, fonts, label)
    if chosen is None:  # characters no one font has together (mixed scripts): one font's own characters
        chosen = rng.choice(fonts.coverages)
        text = TextSampler(chosen.characters, (), plan.text.max_length).random_string(rng)
        label = plan.text.label(text)
    text = plan.text.punctuate(rng, text, chosen.marks)
    size = rng.randint(*FONT_SIZES)
    font = load_font(chosen.font.path, size)
    variation = vary(font, rng)
    pieces = layout(text, font, rng, size)
    width = max(x + font.getlength(piece) for piece, x, _ in pieces)
    return Lettering(text, label, chosen, size, font, variation, pieces, width)


def frame_text(rng: random.Random, lettering: Lettering) -> Frame:
    """The canvas for `lettering`, with its steep tilt if it gets one."""
    tilt = steep_tilt(rng, lettering.text)
    ascent, descent = lettering.font.getmetrics()
    # Room for the crop's margins and what the geometry moves in; a tilt lifts the text's ends too.
    margin = lettering.size
    margin_y = round(margin + 0.5 * lettering.width * abs(np.sin(np.radians(tilt))))
    width, height = round(lettering.width + 2 * margin), round(ascent + descent + 2 * margin_y)
    return Frame(width, height, margin, margin_y, (margin, margin_y + ascent), tilt)


def paint_ground(plan: RenderPlan, rng: random.Random, noise: np.random.Generator, split: str, frame: Frame) -> Ground:
    """A background of one of `split`'s styles, and a text colour that contrasts with it where the text is."""
    styles, photos = plan.styles_for(split)
    style = rng.choice(styles)
    light = rng.random() < 0.7
    photo = rng.choice(photos) if style == PHOTO else None
    pixels = paint(style, rng, noise, frame.width, frame.height, light, photo)
    behind_text = pixels[frame.margin_y : frame.height - frame.margin_y, frame.margin : frame.width - frame.margin]
    background_luminance = float(luminance(behind_text.mean((0, 1))))
    light_text = background_luminance < 128
    return Ground(style, photo, pixels, light, light_text, text_color(rng, background_luminance, light_text))


def draw_ink(
    plan: RenderPlan, rng: random.Random, lettering: Lettering, frame: Frame, effects: list[str]
) -> tuple[Image.Image, Image.Image, bool]:
    """The ink: everything drawn in the text's colour (the text; now and then words beside it, or a line
    above or below), as an "L" image; the mask the crop is fitted to; and whether there are neighbours."""
    font, origin = lettering.font, frame.origin
    ink = Image.new("L", (frame.width, frame.height), 0)
    draw_pieces(ImageDraw.Draw(ink), lettering.pieces, origin, font, 255)
    # What the crop is fitted to: the text's ink, and at least cap height above the baseline, so words
    # without capitals or ascenders are drawn at the same scale as the rest ("o" smaller than "O").
    mask = ink.copy()
    cap_top = font.getbbox("H", anchor="ls")[1]
    ImageDraw.Draw(mask).rectangle((origin[0], origin[1] + cap_top, origin[0] + lettering.width, origin[1]), fill=255)
    neighbours = rng.random() < 0.2
    if neighbours:  # words on either side on the line, of at least 3 characters: the crop cuts them
        effects.append("neighbours")
        gap = font.getlength(" ") * rng.uniform(1.0, 2.5)
        draw = ImageDraw.Draw(ink)
        draw.text((origin[0] - gap, origin[1]), neighbour_text(plan, rng), font=font, fill=255, anchor="rs")
        draw.text(
            (origin[0] + lettering.width + gap, origin[1]), neighbour_text(plan, rng), font=font, fill=255, anchor="ls"
        )
    if rng.random() < 0.12:  # a line above or below, of which the crop keeps an edge
        effects.append("line above or below")
        line_offset = sum(font.getmetrics()) * rng.uniform(0.95, 1.3) * rng.choice((-1, 1))
        ImageDraw.Draw(ink).text(
            (origin[0] + rng.uniform(-lettering.size, lettering.size), origin[1] + line_offset),
            plan.text.sample(rng) + " " + plan.text.sample(rng),
            font=font,
            fill=255,
            anchor="ls",
        )
    return ink, mask, neighbours


def paint_ink(
    rng: random.Random, ink: Image.Image, lettering: Lettering, frame: Frame, ground: Ground, effects: list[str]
) -> Image.Image:
    """The background with the ink in the text's colour, now and then over a shadow or inside an outline."""
    canvas = Image.fromarray(ground.pixels.astype(np.uint8))
    if rng.random() < 0.1:  # shadow
        effects.append("shadow")
        dx, dy = rng.choice((-1, 1)) * rng.randint(1, 3), rng.randint(1, 3)
        shadow = ImageChops.offset(ink, dx, dy).filter(ImageFilter.GaussianBlur(rng.uniform(0, 1.5)))
        shade = tuple(int(c) for c in np.clip(ground.pixels.mean((0, 1)) * (0.4 if ground.light else 1.8), 0, 255))
        canvas.paste(shade, mask=shadow)
    if rng.random() < 0.08:  # outlined letters: a stroke of another colour around the ink
        effects.append("outline")
        outline = Image.new("L", (frame.width, frame.height), 0)
        draw_pieces(
            ImageDraw.Draw(outline), lettering.pieces, frame.origin, lettering.font, 255, stroke=rng.randint(1, 2)
        )
        color = ground.text_color
        outline_color = text_color(rng, float(luminance(color)), light_text=luminance(color) < 128)
        canvas.paste(tuple(int(c) for c in outline_color), mask=outline)
    canvas.paste(tuple(int(c) for c in ground.text_color), mask=ink)
    return canvas


def transform_and_crop(
    rng: random.Random,
    canvas: Image.Image,
    mask: Image.Image,
    frame: Frame,
    size: int,
    neighbours: bool,
    effects: list[str],
) -> Image.Image:
    """`canvas` through geometry(), cropped around the text as `mask`, moved alike, shows it."""
    transform = geometry(rng, frame.width, frame.height, frame.tilt)
    if transform is not None:
        effects.append("rotation or shear" if transform[0] == Image.Transform.AFFINE else "perspective")
        kind, coefficients = transform
        canvas = canvas.transform(canvas.size, kind, coefficients, Image.Resampling.BILINEAR)
        mask = mask.transform(mask.size, kind, coefficients, Image.Resampling.BILINEAR)
    box = mask.point(INK_THRESHOLD).getbbox() or (
        frame.margin,
        frame.margin_y,
        frame.width - frame.margin,
        frame.height - frame.margin_y,
    )
    return canvas.crop(crop_box(rng, box, size, frame.width, frame.height, neighbours))


def encode_jpeg(rng: random.Random, image: Image.Image) -> tuple[bytes, int]:
    """`image` as a JPEG, now and then of low quality (its artefacts are a degradation too), and the quality."""
    buffer = io.BytesIO()
    quality = rng.randint(30, 60) if rng.random() < 0.25 else rng.randint(75, 95)
    image.save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue(), quality


def sample_meta(lettering: Lettering, ground: Ground, effects: list[str], quality: int) -> dict:
    """What made a sample: the record stored beside it, which the held-out checks read."""
    font = lettering.coverage.font
    return {
        "text": lettering.text,
        "font": font.family,
        "file": font.path.rsplit("/", 1)[-1] if font.path else "built-in",
        "variation": lettering.variation,
        "background": ground.style,
        **({"photo": Path(ground.photo).name} if ground.photo else {}),
        "polarity": "light on dark" if ground.light_text else "dark on light",
        "effects": effects,
        "jpeg_quality": quality,
    }


def encode_meta(meta: dict) -> bytes:
    return json.dumps(meta, ensure_ascii=False, sort_keys=True).encode("utf-8")


def build_plan(
    alphabet: str,
    max_length: int,
    words_file: Path | None = WORDS_FILE,
    fonts_folder: Path | None = None,
    held_out_families: tuple[str, ...] = HELD_OUT_FAMILIES,
    backgrounds: Path | None = None,
    system_fonts: bool = True,
    packaged_photos: tuple[str, ...] = (),
) -> tuple[RenderPlan, int]:
    """The plan for `alphabet`, and how many words of `words_file` were skipped (characters outside the
    alphabet, or longer than `max_length`). `words_file=None` draws no words; `system_fonts=False` uses
    `fonts_folder`'s fonts alone; `packaged_photos` (photo files a package ships, `package_photos()`)
    come before the `backgrounds` folder's."""
    fold = folds_case(alphabet)
    fonts = tuple(find_fonts(fonts_folder, system_fonts)) or (Font(None, "Pillow built-in", "Pillow"),)
    font_plan = plan_fonts(fonts, alphabet, held_out_families, fold)
    words, skipped = load_words(words_file, font_plan.alphabet, max_length, fold) if words_file else ((), 0)
    photos = [*packaged_photos, *(photo_files(backgrounds) if backgrounds else [])]
    # Every fifth photo is held out for test, so test's photo backgrounds are unseen too.
    held_out_photos = tuple(photos[4::5]) if len(photos) >= 2 else ()
    train_photos = tuple(photo for photo in photos if photo not in held_out_photos)
    return RenderPlan(
        font_plan,
        TextSampler(font_plan.alphabet, words, max_length, unlabelled_marks(alphabet)),
        train_photos,
        held_out_photos,
    ), skipped


PHOTO_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")


def photo_files(folder: Path) -> list[str]:
    """The image files under `folder`, sorted."""
    if not folder.is_dir():
        raise FileNotFoundError(f"background folder {folder} does not exist")
    files = sorted(str(path) for path in folder.rglob("*") if path.suffix.lower() in PHOTO_SUFFIXES and path.is_file())
    if not files:
        raise FileNotFoundError(f"background folder {folder} holds no image file ({' '.join(PHOTO_SUFFIXES)})")
    for file in files:  # the headers only: a file that is no image stops the run before it renders anything
        check_photo(file, lambda image: None)
    return files
