"""Label placement for crowded scatter plots: the points stay where they are, each label takes the
nearest free slot around its point (leader line back to it when it is not right beside it).
Greedy and deterministic; overlap is checked in pixels of the final layout, so call this after
tight_layout and after the axis limits are set."""
from __future__ import annotations

import math

import numpy as np

FONT = 6  # pt
MARKER = 4  # pt: half the box a marker occupies
DX = (8, 26, 48, 75, 105, 140)  # pt to either side of the point
DY = tuple(range(0, 161, 8))  # pt above or below: one 6 pt text line per step


def _candidates() -> list[tuple[int, int]]:
    """(dx, dy) offsets nearest first; +dy before -dy at equal distance (flipped for odd labels,
    so neighbours alternate above / below)."""
    cands = [(sx * dx, sy * dy) for dx in DX for dy in DY for sx in (1, -1) for sy in ((1, -1) if dy else (1,))]
    return sorted(cands, key=lambda c: math.hypot(c[0], 1.5 * c[1]))


def place_labels(ax, items: list[tuple[float, float, str]], markers: list[tuple[float, float]] = (),
                 artists: list = ()) -> list:
    """items: (x, y, text) in data coordinates. markers: points no label may cover. artists: text
    already drawn that labels must avoid. Returns the annotations."""
    fig = ax.figure
    fig.canvas.draw()  # a renderer, and transforms in their final state
    renderer = fig.canvas.get_renderer()
    px = fig.dpi / 72  # pixels per point
    frame = ax.get_window_extent(renderer)
    taken = [(x - MARKER * px, y - MARKER * px, x + MARKER * px, y + MARKER * px)
             for x, y in ax.transData.transform(list(markers) or np.empty((0, 2)))]
    taken += [tuple(a.get_window_extent(renderer).extents) for a in artists]
    boxes = np.array(taken, dtype=float).reshape(-1, 4)
    cands = np.array(_candidates(), dtype=float)
    made = []
    order = sorted(range(len(items)), key=lambda i: (items[i][0], -items[i][1]))
    for rank, i in enumerate(order):
        x, y, text = items[i]
        ax_px, ay_px = ax.transData.transform((x, y))
        probe = ax.text(0, 0, text, fontsize=FONT)
        w, h = probe.get_window_extent(renderer).size
        probe.remove()
        flip = -1 if rank % 2 else 1
        dx, dy = cands[:, 0], cands[:, 1] * flip
        x0 = ax_px + dx * px - np.where(dx < 0, w, 0)
        y0 = ay_px + dy * px - h / 2
        x1, y1 = x0 + w, y0 + h
        inside = (x0 >= frame.x0) & (x1 <= frame.x1) & (y0 >= frame.y0) & (y1 <= frame.y1)
        clear = ~((x0[:, None] < boxes[:, 2]) & (x1[:, None] > boxes[:, 0]) &
                  (y0[:, None] < boxes[:, 3]) & (y1[:, None] > boxes[:, 1])).any(axis=1)
        free = np.flatnonzero(inside & clear)
        k = free[0] if free.size else 0  # nowhere free: the nearest slot (overlap beats a lost label)
        boxes = np.vstack([boxes, [x0[k], y0[k], x1[k], y1[k]]])
        near = abs(dx[k]) <= DX[0] and dy[k] == 0
        made.append(ax.annotate(text, (x, y), xytext=(dx[k], dy[k]), textcoords="offset points", fontsize=FONT,
                                ha="left" if dx[k] > 0 else "right", va="center", zorder=4,
                                arrowprops=None if near else dict(arrowstyle="-", color="0.55", lw=0.5,
                                                                  shrinkA=1, shrinkB=3)))
    return made
