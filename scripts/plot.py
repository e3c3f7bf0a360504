"""Draw a run's curves from its metrics.jsonl into one PNG, to read without TensorBoard.

    python scripts/plot.py runs/crnn                      # writes runs/crnn/curves.png
    python scripts/plot.py runs/crnn --out /tmp/crnn.png

Panels: training loss, learning rate and images/s against the step, and each validation set's word
accuracy and character error rate, plus a summary (last and best values, counted problems). Lines of
metrics.jsonl that are neither a training record (`step` and `loss`) nor a validation record (`step`,
`val` and `accuracy`) are ignored, as are lines cut short by a crash. Matplotlib draws the PNG off
screen (its Agg renderer, through `Figure`, not pyplot), so no display is needed.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import PercentFormatter

from utils import cli
from utils.jsonl import read_jsonl

COLUMNS, ROWS = 2, 3
FIGURE_SIZE, DPI = (15.7, 10.8), 100  # inches: a 1570 x 1080 PNG
# Colour-blind-safe (Okabe-Ito), then a few more for runs with many validation sets.
COLORS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442", "#8C564B", "#7F7F7F")
GRID, AXIS = "#DDDDDD", "#444444"
LOG_SCALE_RATIO = 30  # a positive series spanning more than this factor is drawn on a log axis
DOTS_BELOW = 40  # a series with fewer points gets a dot on each one, a longer one only on its last


@dataclass
class Series:
    name: str
    steps: list[float]  # sorted
    values: list[float]
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
    records.val = {
        name: sorted({r["step"]: r for r in rows}.values(), key=lambda r: r["step"])
        for name, rows in records.val.items()
    }
    return records


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def series(name: str, records: list[dict[str, Any]], key: str, scale: float = 1.0, color: str = COLORS[0]) -> Series:
    """The finite values of `key` against the step (NaN and missing values are skipped)."""
    kept = [record for record in records if is_number(record.get(key))]
    return Series(name, [record["step"] for record in kept], [record[key] * scale for record in kept], color)


def short_names(roots: list[str]) -> dict[str, str]:
    """The last two path components of each validation set, or the whole path where those collide."""
    short = {root: "/".join(Path(root).parts[-2:]) for root in roots}
    if len(set(short.values())) < len(short):
        return {root: root for root in roots}
    return short


def format_value(value: Any) -> str:
    """A number as the summary and the axes show it; what a hand-edited or foreign log holds instead
    of a number (null, text) is `n/a`, never a crash."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "n/a"
    if not math.isfinite(value):
        return str(value)  # nan, inf: a diverged run's loss, worth seeing as such
    if abs(value) >= 1e6:
        return f"{value / 1e6:g}M"
    if abs(value) >= 1e4:
        return f"{value / 1e3:g}k"
    if value == round(value):
        return str(round(value))
    return f"{value:.3g}"


def chart(
    axes: Axes,
    title: str,
    lines: list[Series],
    last_step: float,
    y_range: tuple[float | None, float | None] = (None, None),
    percent: bool = False,
    legend: str = "",
) -> None:
    """One panel: a line per series against the step. `y_range`: fixed ends (None: from the data);
    `percent`: values are percentages; `legend`: a matplotlib corner such as "upper left", or "" for none."""
    values = [value for line in lines for value in line.values]
    log = bool(values) and y_range == (None, None) and min(values) > 0 and max(values) / min(values) > LOG_SCALE_RATIO
    axes.set_title(title + (" (log scale)" if log else ""), loc="left")
    if not values:
        axes.text(0.5, 0.5, "no data yet", ha="center", va="center", color=AXIS, transform=axes.transAxes)
        axes.set_axis_off()
        return
    draw_lines(axes, lines)
    if log:
        axes.set_yscale("log")
        # Whole decades: matplotlib's margins alone can leave a single labelled tick on a short log axis.
        axes.set_ylim(10.0 ** math.floor(math.log10(min(values))), 10.0 ** math.ceil(math.log10(max(values))))
        axes.yaxis.set_major_formatter(lambda value, _: format_value(value))  # 0.1, 1, 10 rather than 10^-1, 10^0
    elif percent:
        axes.yaxis.set_major_formatter(PercentFormatter(xmax=100, symbol=" %"))
    else:
        axes.ticklabel_format(axis="y", useOffset=False)  # 0.000994, not 1e-3 + 4e-6 printed apart
    if y_range != (None, None):
        axes.set_ylim(*y_range)
    axes.set_xlim(0, max(last_step, 1))  # the same step axis, from 0, on every panel, so that panels line up
    axes.set_xlabel("step")
    axes.xaxis.set_major_formatter(lambda step, _: format_value(step))  # 250k, as in the summary
    axes.grid(color=GRID)
    if legend:
        for label in axes.legend(loc=legend).get_texts():
            label.set_parse_math(False)  # names are paths: "$" is a character, not a formula


def draw_lines(axes: Axes, lines: list[Series]) -> None:
    """Each series as a line, with a dot on every point of a short one and on the last point of a long one."""
    for line in lines:
        # Unclipped, or the dot on the last point, on the right edge, would be cut in half; out of the
        # layout, where an empty series would count as a point at the figure's corner.
        axes.plot(
            line.steps,
            line.values,
            color=line.color,
            label=line.name,
            linewidth=1.5,
            marker="o",
            markersize=4.5,
            markevery=None if len(line.steps) < DOTS_BELOW else [len(line.steps) - 1],
            clip_on=False,
            in_layout=False,
        )


def summary(records: Records, names: dict[str, str], run: Path) -> list[str]:
    lines = [f"run: {run}"]
    if records.train:
        last = records.train[-1]
        lines.append(
            f"last step {last['step']}: loss {format_value(last['loss'])}, lr {format_value(last.get('lr', 0))},"
            f" {format_value(round(last['images_per_s']) if is_number(last.get('images_per_s')) else None)}"
            f" images/s"
        )
        for key in ("infinite_losses", "undecodable_images", "skipped_steps"):
            total = sum(record.get(key, 0) for record in records.train if is_number(record.get(key)))
            lines.append(f"{key.replace('_', ' ')}: {total}")
    for root, rows in records.val.items():
        scored = [record for record in rows if is_number(record["accuracy"])]
        if not scored:
            continue
        best, last = max(scored, key=lambda record: record["accuracy"]), scored[-1]
        cer = f", CER {100 * last['cer']:.2f} %" if is_number(last.get("cer")) else ""
        lines.append(
            f"{names[root]}: accuracy {100 * last['accuracy']:.2f} % at step {last['step']}"
            f" (best {100 * best['accuracy']:.2f} % at {best['step']}){cer}"
        )
    if records.ignored:
        lines.append(f"unreadable lines (not JSON) ignored: {records.ignored}")
    return lines


def draw_curves(records: Records, run: Path) -> Figure:
    figure = Figure(figsize=FIGURE_SIZE, dpi=DPI, layout="constrained")
    loss, lr, speed, accuracy, cer, summary_panel = figure.subplots(ROWS, COLUMNS).flat
    names = short_names(list(records.val))
    colors = {root: COLORS[number % len(COLORS)] for number, root in enumerate(records.val)}
    last_step = max(record["step"] for rows in (records.train, *records.val.values()) for record in rows)
    chart(loss, "training loss (CTC)", [series("loss", records.train, "loss")], last_step)
    chart(lr, "learning rate", [series("lr", records.train, "lr")], last_step)
    chart(speed, "training images/s", [series("images/s", records.train, "images_per_s")], last_step)
    # Each legend goes in the corner the curves leave empty: top left for accuracy, top right for errors.
    chart(
        accuracy,
        "validation word accuracy",
        [series(names[root], rows, "accuracy", 100, colors[root]) for root, rows in records.val.items()],
        last_step,
        y_range=(0, 100),
        percent=True,
        legend="upper left",
    )
    chart(
        cer,
        "validation character error rate",
        [series(names[root], rows, "cer", 100, colors[root]) for root, rows in records.val.items()],
        last_step,
        y_range=(0, None),
        percent=True,
        legend="upper right",
    )
    summary_panel.set_title("summary", loc="left")
    summary_panel.set_axis_off()
    summary_panel.text(
        0,
        1,
        "\n".join(summary(records, names, run)),
        va="top",
        linespacing=1.7,
        parse_math=False,
        transform=summary_panel.transAxes,
    )  # a path, as in the legends
    return figure


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="run folder (train.out_dir) holding metrics.jsonl")
    parser.add_argument("--out", type=Path, help="PNG to write (default RUN/curves.png)")
    args = parser.parse_args(argv)
    if not args.run.is_dir():
        sys.exit(f"error: run folder {args.run} does not exist")
    metrics = args.run / "metrics.jsonl"
    if metrics.is_dir():
        sys.exit(f"error: {metrics} is a folder, not the run's log; is {args.run} a run folder?")
    if not metrics.is_file():
        sys.exit(
            f"error: {metrics} does not exist: the run has not logged yet (it writes a line every"
            " train.log_every steps), or this is not a run folder"
        )
    records = load_records(metrics)
    if not records.train and not records.val:
        sys.exit(f"error: {metrics} holds no training or validation record yet")
    out = args.out or args.run / "curves.png"
    if not out.suffix:  # matplotlib would append .png and write a file other than the one named
        sys.exit(f"error: --out {out} has no extension to choose the format by, e.g. {out}.png")
    out.parent.mkdir(parents=True, exist_ok=True)
    draw_curves(records, args.run).savefig(out)
    print(
        f"wrote {out}: {len(records.train)} training records, "
        f"{sum(map(len, records.val.values()))} validation records over {len(records.val)} sets"
    )


if __name__ == "__main__":
    cli.run(main)
