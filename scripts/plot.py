"""Draw a run's curves from its metrics.jsonl into one PNG, to read without TensorBoard.

    python scripts/plot.py runs/crnn                      # writes runs/crnn/curves.png
    python scripts/plot.py runs/crnn --out /tmp/crnn.png

Panels: training loss, learning rate and images/s against the step, and each validation set's word
accuracy and character error rate, plus a summary (last and best values, counted problems). Lines of
metrics.jsonl that are neither a training record (`step` and `loss`) nor a validation record (`step`,
`val` and `accuracy`) are ignored, as are lines cut short by a crash. Pillow draws everything.
"""
from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw, ImageFont

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from utils import cli  # noqa: E402
from utils.jsonl import read_jsonl  # noqa: E402
from utils.visualize import caption_font  # noqa: E402

PANEL_WIDTH, PANEL_HEIGHT, MARGIN = 760, 340, 16
PLOT_LEFT, PLOT_RIGHT, PLOT_TOP, PLOT_BOTTOM = 78, 20, 34, 40  # room for tick labels and the title
COLUMNS, ROWS = 2, 3
# Colour-blind-safe (Okabe-Ito), then a few more for runs with many validation sets.
COLORS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442",
          "#8C564B", "#7F7F7F")
GRID, AXIS, TEXT = "#DDDDDD", "#444444", "#111111"
LOG_SCALE_RATIO = 30  # a positive series spanning more than this factor is drawn on a log axis


@dataclass
class Series:
    name: str
    points: list[tuple[float, float]]  # (step, value), sorted by step
    color: str = COLORS[0]


@dataclass
class Records:
    train: list[dict[str, Any]] = field(default_factory=list)  # sorted by step
    val: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # per set, sorted by step
    ignored: int = 0  # lines that are not JSON (a crash mid-write)


def load_records(path: Path) -> Records:
    """The training and validation records of a metrics.jsonl; any other line is skipped."""
    rows, unreadable = read_jsonl(path)
    records = Records(ignored=unreadable)
    for _, record in rows:
        if not isinstance(record, dict) or not is_number(record.get("step")):
            continue
        if isinstance(record.get("val"), str) and "accuracy" in record:
            records.val.setdefault(record["val"], []).append(record)
        elif "val" not in record and "loss" in record:
            records.train.append(record)
    # A resumed run re-logs the steps after its checkpoint (train.py drops the dead run's lines, but a
    # copied log may still hold both): the last record of a step wins.
    records.train = sorted({record["step"]: record for record in records.train}.values(), key=lambda r: r["step"])
    records.val = {name: sorted({r["step"]: r for r in rows}.values(), key=lambda r: r["step"])
                   for name, rows in records.val.items()}
    return records


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def series(name: str, records: list[dict[str, Any]], key: str, scale: float = 1.0, color: str = COLORS[0]) -> Series:
    """The finite values of `key` against the step (NaN and missing values leave a gap)."""
    return Series(name, [(r["step"], r[key] * scale) for r in records if is_number(r.get(key))], color)


def short_names(roots: list[str]) -> dict[str, str]:
    """The last two path components of each validation set, or the whole path where those collide."""
    short = {root: "/".join(Path(root).parts[-2:]) for root in roots}
    if len(set(short.values())) < len(short):
        return {root: root for root in roots}
    return short


def nice_step(span: float, count: int) -> float:
    """A 1, 2 or 5 times a power of ten close to span / count."""
    raw = span / max(count, 1)
    power = 10 ** math.floor(math.log10(raw))
    return next(factor * power for factor in (1, 2, 5, 10) if factor * power >= raw)


def linear_ticks(low: float, high: float, count: int = 5) -> list[float]:
    step = nice_step(high - low, count)
    first = math.ceil(low / step - 1e-9)
    return [tick * step for tick in range(first, math.floor(high / step + 1e-9) + 1)]


def format_value(value: float) -> str:
    if abs(value) >= 1e6:
        return f"{value / 1e6:g}M"
    if abs(value) >= 1e4:
        return f"{value / 1e3:g}k"
    if value == round(value):
        return str(round(value))
    return f"{value:.3g}"


class Panel:
    """One chart: a title, axes with ticks and grid lines, and a line per series."""

    def __init__(self, draw: ImageDraw.ImageDraw, left: int, top: int, fonts: dict[str, ImageFont.ImageFont]) -> None:
        self.draw, self.fonts = draw, fonts
        self.box = (left, top, left + PANEL_WIDTH, top + PANEL_HEIGHT)
        self.plot = (left + PLOT_LEFT, top + PLOT_TOP, left + PANEL_WIDTH - PLOT_RIGHT, top + PANEL_HEIGHT - PLOT_BOTTOM)

    def chart(self, title: str, lines: list[Series], x_range: tuple[float, float],
              y_range: tuple[float | None, float | None] = (None, None), unit: str = "", legend: str = "") -> None:
        """`y_range`: fixed ends (None: from the data); `legend`: "" (none), "left" or "right" (top corner)."""
        left, top, right, bottom = self.plot
        points = [point for line in lines for point in line.points]
        if not points:
            self.draw.text((self.box[0] + 8, self.box[1] + 6), title, fill=TEXT, font=self.fonts["title"])
            self.draw.text(((left + right) // 2, (top + bottom) // 2), "no data yet", fill=AXIS,
                           font=self.fonts["label"], anchor="mm")
            return
        values = [value for _, value in points]
        x_low, x_high = x_range
        if x_high == x_low:
            x_low, x_high = x_low - 1, x_high + 1
        log = y_range == (None, None) and min(values) > 0 and max(values) / min(values) > LOG_SCALE_RATIO
        if log:
            y_low, y_high = math.floor(math.log10(min(values))), math.ceil(math.log10(max(values)))
            y_ticks = [float(power) for power in range(y_low, y_high + 1)]
        else:
            y_low = min(values) if y_range[0] is None else y_range[0]
            y_high = max(values) if y_range[1] is None else y_range[1]
            if y_high == y_low:
                y_low, y_high = y_low - max(abs(y_low) * 0.1, 1e-12), y_high + max(abs(y_high) * 0.1, 1e-12)
            y_ticks = linear_ticks(y_low, y_high)
            y_low, y_high = min(y_low, y_ticks[0]), max(y_high, y_ticks[-1])

        def to_pixel(step: float, value: float) -> tuple[float, float]:
            value = math.log10(value) if log else value
            return (left + (step - x_low) / (x_high - x_low) * (right - left),
                    bottom - (value - y_low) / (y_high - y_low) * (bottom - top))

        draw, label_font = self.draw, self.fonts["label"]
        for tick in y_ticks:
            y = bottom - (tick - y_low) / (y_high - y_low) * (bottom - top)
            draw.line([(left, y), (right, y)], fill=GRID)
            text = format_value(10 ** tick) if log else format_value(tick)
            draw.text((left - 6, y), text + unit, fill=AXIS, font=label_font, anchor="rm")
        for tick in linear_ticks(x_low, x_high):
            x = left + (tick - x_low) / (x_high - x_low) * (right - left)
            draw.line([(x, top), (x, bottom)], fill=GRID)
            draw.text((x, bottom + 6), format_value(tick), fill=AXIS, font=label_font, anchor="mt")
        draw.rectangle((left, top, right, bottom), outline=AXIS)
        draw.text(((left + right) // 2, bottom + 22), "step", fill=AXIS, font=label_font, anchor="mt")
        draw.text((self.box[0] + 8, self.box[1] + 6), title + (" (log scale)" if log else ""), fill=TEXT,
                  font=self.fonts["title"])
        for line in lines:
            pixels = [to_pixel(step, value) for step, value in line.points if not log or value > 0]
            if len(pixels) > 1:
                draw.line(pixels, fill=line.color, width=2, joint="curve")
            for x, y in pixels if len(pixels) < 40 else pixels[-1:]:  # dots where there are few points
                draw.ellipse((x - 3, y - 3, x + 3, y + 3), fill=line.color)
        if legend:  # in the corner the curves leave empty: top left for accuracy, top right for errors
            width = max(draw.textlength(line.name, font=label_font) for line in lines) + 30
            x = left + 8 if legend == "left" else right - 8 - width
            draw.rectangle((x, top + 4, x + width, top + 8 + 18 * len(lines)), fill="white", outline=GRID)
            for number, line in enumerate(lines):
                y = top + 8 + 18 * number
                draw.rectangle((x + 6, y + 3, x + 18, y + 13), fill=line.color)
                draw.text((x + 24, y), line.name, fill=TEXT, font=label_font)

    def text(self, title: str, lines: list[str]) -> None:
        self.draw.text((self.box[0] + 8, self.box[1] + 6), title, fill=TEXT, font=self.fonts["title"])
        for number, line in enumerate(lines):
            self.draw.text((self.box[0] + 12, self.box[1] + PLOT_TOP + number * 19), line, fill=TEXT,
                           font=self.fonts["label"])


def summary(records: Records, names: dict[str, str], run: Path) -> list[str]:
    lines = [f"run: {run}"]
    if records.train:
        last = records.train[-1]
        lines.append(f"last step {last['step']}: loss {format_value(last['loss'])}, lr {format_value(last.get('lr', 0))},"
                     f" {last.get('images_per_s', 0):.0f} images/s")
        for key in ("infinite_losses", "undecodable_images", "skipped_steps"):
            total = sum(record.get(key, 0) for record in records.train if is_number(record.get(key)))
            lines.append(f"{key.replace('_', ' ')}: {total}")
    for root, rows in records.val.items():
        scored = [record for record in rows if is_number(record["accuracy"])]
        if not scored:
            continue
        best, last = max(scored, key=lambda record: record["accuracy"]), scored[-1]
        cer = f", CER {100 * last['cer']:.2f} %" if is_number(last.get("cer")) else ""
        lines.append(f"{names[root]}: accuracy {100 * last['accuracy']:.2f} % at step {last['step']}"
                     f" (best {100 * best['accuracy']:.2f} % at {best['step']}){cer}")
    if records.ignored:
        lines.append(f"unreadable lines (not JSON) ignored: {records.ignored}")
    return lines


def draw_curves(records: Records, run: Path) -> Image.Image:
    image = Image.new("RGB", (COLUMNS * PANEL_WIDTH + (COLUMNS + 1) * MARGIN, ROWS * PANEL_HEIGHT + (ROWS + 1) * MARGIN),
                      "white")
    draw = ImageDraw.Draw(image)
    fonts = {"title": caption_font(size=16), "label": caption_font(size=12)}
    panels = [Panel(draw, MARGIN + column * (PANEL_WIDTH + MARGIN), MARGIN + row * (PANEL_HEIGHT + MARGIN), fonts)
              for row in range(ROWS) for column in range(COLUMNS)]
    names = short_names(list(records.val))
    colors = {root: COLORS[number % len(COLORS)] for number, root in enumerate(records.val)}
    # One step axis for every panel, from 0, so that panels line up.
    last_step = max(record["step"] for rows in (records.train, *records.val.values()) for record in rows)
    steps = (0, last_step)
    panels[0].chart("training loss (CTC)", [series("loss", records.train, "loss")], steps)
    panels[1].chart("learning rate", [series("lr", records.train, "lr")], steps)
    panels[2].chart("training images/s", [series("images/s", records.train, "images_per_s")], steps)
    panels[3].chart("validation word accuracy", [series(names[root], rows, "accuracy", 100, colors[root])
                                                 for root, rows in records.val.items()],
                    steps, y_range=(0, 100), unit=" %", legend="left")
    panels[4].chart("validation character error rate", [series(names[root], rows, "cer", 100, colors[root])
                                                         for root, rows in records.val.items()],
                    steps, y_range=(0, None), unit=" %", legend="right")
    panels[5].text("summary", summary(records, names, run))
    return image


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="run folder (train.out_dir) holding metrics.jsonl")
    parser.add_argument("--out", type=Path, help="PNG to write (default RUN/curves.png)")
    args = parser.parse_args(argv)
    if not args.run.is_dir():
        sys.exit(f"error: run folder {args.run} does not exist")
    metrics = args.run / "metrics.jsonl"
    if not metrics.is_file():
        sys.exit(f"error: {metrics} does not exist: the run has not logged yet (it writes a line every"
                 " train.log_every steps), or this is not a run folder")
    records = load_records(metrics)
    if not records.train and not records.val:
        sys.exit(f"error: {metrics} holds no training or validation record yet")
    out = args.out or args.run / "curves.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    draw_curves(records, args.run).save(out)
    print(f"wrote {out}: {len(records.train)} training records, "
          f"{sum(map(len, records.val.values()))} validation records over {len(records.val)} sets")


if __name__ == "__main__":
    cli.run(main)
