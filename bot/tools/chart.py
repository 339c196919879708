"""A small PNG chart of days unused across a memory list.

One bar per days-unused bucket: each day on its own while a memory is on the desk, then wider
buckets in the drawer, with a line where memories move to the drawer (DORMANT_AFTER_DAYS). An
admin sees at a glance whether the list is mostly in use, drifting towards the drawer, or asleep.
Drawn with Pillow (its built-in font: nothing to download); returns the PNG bytes, no Discord here.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass

from PIL import Image, ImageDraw, ImageFont

WIDTH, HEIGHT = 640, 300
BACKGROUND = (43, 45, 49)  # Discord's dark embed background, so the chart sits well in an embed
TEXT = (219, 222, 225)
MUTED = (148, 155, 164)
DESK = (88, 101, 242)  # blurple
DRAWER = (128, 132, 142)
MAX_DESK_BARS = 10


@dataclass(frozen=True)
class Bucket:
    low: int
    high: int | None  # exclusive; None = no upper end
    label: str
    drawer: bool
    count: int = 0


def buckets(days: Sequence[int], dormant_after: int, decay: bool) -> list[Bucket]:
    """The bars: days 0..DORMANT_AFTER_DAYS-1 (grouped when there are many), then 1-2x, 2-4x and 4x+ in the drawer."""
    edges: list[tuple[int, int | None]] = []
    if dormant_after <= MAX_DESK_BARS:
        edges += [(day, day + 1) for day in range(dormant_after)]
    else:
        step = -(-dormant_after // MAX_DESK_BARS)
        edges += [(low, min(low + step, dormant_after)) for low in range(0, dormant_after, step)]
    edges += [(dormant_after, dormant_after * 2), (dormant_after * 2, dormant_after * 4), (dormant_after * 4, None)]
    result = []
    for low, high in edges:
        if high is None:
            label = f"{low}+"
        elif high - low == 1:
            label = str(low)
        else:
            label = f"{low}-{high - 1}"
        count = sum(1 for day in days if day >= low and (high is None or day < high))
        result.append(Bucket(low, high, label, drawer=decay and low >= dormant_after, count=count))
    return result


def days_unused_chart(days: Sequence[int], dormant_after: int, *, decay: bool = True, title: str = "Days unused") -> bytes:
    """The chart as PNG bytes. `days` holds one days_unused value per memory of the list."""
    bars = buckets(days, dormant_after, decay)
    image = Image.new("RGB", (WIDTH, HEIGHT), BACKGROUND)
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default(size=13)
    small = ImageFont.load_default(size=11)
    left, right, top, bottom = 40, WIDTH - 16, 46, HEIGHT - 44
    draw.text((left, 10), f"{title} · {len(days)} memories", font=font, fill=TEXT)
    legend_x = WIDTH - 200
    draw.rectangle((legend_x, 14, legend_x + 10, 24), fill=DESK)
    draw.text((legend_x + 14, 11), "desk", font=small, fill=TEXT)
    draw.rectangle((legend_x + 60, 14, legend_x + 70, 24), fill=DRAWER)
    draw.text((legend_x + 74, 11), "drawer" if decay else "drawer (decay off)", font=small, fill=TEXT)

    highest = max((bar.count for bar in bars), default=0) or 1
    draw.line((left, top, left, bottom), fill=MUTED)
    draw.line((left, bottom, right, bottom), fill=MUTED)
    draw.text((left - 6, top - 6), str(highest), font=small, fill=MUTED, anchor="ra")
    draw.text((left - 6, bottom), "0", font=small, fill=MUTED, anchor="rb")
    slot = (right - left) / len(bars)
    for index, bar in enumerate(bars):
        x0 = left + index * slot + slot * 0.15
        x1 = left + (index + 1) * slot - slot * 0.15
        height = (bottom - top) * bar.count / highest
        if bar.count:
            draw.rectangle((x0, bottom - height, x1, bottom - 1), fill=DRAWER if bar.drawer else DESK)
            draw.text(((x0 + x1) / 2, bottom - height - 3), str(bar.count), font=small, fill=TEXT, anchor="mb")
        draw.text(((x0 + x1) / 2, bottom + 4), bar.label, font=small, fill=MUTED, anchor="ma")
        if decay and bar.low == dormant_after:  # where memories move to the drawer
            x = left + index * slot
            for y in range(int(top), int(bottom), 8):
                draw.line((x, y, x, y + 4), fill=MUTED)
    draw.text(((left + right) / 2, HEIGHT - 18), "days unused (chat days without a match)", font=small, fill=MUTED, anchor="ma")
    out = io.BytesIO()
    image.save(out, format="PNG", optimize=True)
    return out.getvalue()
