"""A small PNG line-plot writer for the benchmark, so that `--plot` needs no plotting library:
numpy draws into an RGB raster, zlib and struct encode it. Both axes are logarithmic (sequence
length spans powers of two; time and attention memory grow like its square).
"""
import math
import struct
import zlib
from dataclasses import dataclass, field

import numpy as np

PANEL_W, PANEL_H = 480, 300
PLOT_LEFT, PLOT_RIGHT, PLOT_TOP, PLOT_BOTTOM = 64, 16, 28, 34  # panel margins around the axes
HEADER_H = 56                                                # title line and legend line
LINE_THICKNESS = 2
MARKER_RADIUS = 3
MAX_Y_TICKS = 7
FONT_SCALE = 2
GLYPH_W, GLYPH_H = 3, 5
CHAR_ADVANCE = (GLYPH_W + 1) * FONT_SCALE
TEXT_H = GLYPH_H * FONT_SCALE
SWATCH = 12

WHITE, BLACK, GRAY, LIGHT = (255, 255, 255), (0, 0, 0), (110, 110, 110), (225, 225, 225)
PALETTE = [(31, 119, 180), (214, 39, 40), (44, 160, 44), (255, 127, 14), (148, 103, 189),
           (140, 86, 75), (227, 119, 194)]

# A 3x5 bitmap font: each octal digit is one row of three pixels, top row first.
_FONT = dict(zip(
    "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ.-:/()=_,+% ",
    "75557 26227 71747 71717 55711 74717 74757 71111 75757 75717 25755 65656 34443 65556 "
    "74647 74644 34553 55755 72227 11152 55655 44447 57755 65555 25552 65644 25563 65655 "
    "34216 72222 55557 55552 55775 55255 55222 71247 00002 00700 02020 11244 24442 21112 "
    "07070 00007 00024 02720 51245 00000".split()))


@dataclass
class Panel:
    title: str
    series: dict = field(default_factory=dict)  # name -> [(x, y)], points with y <= 0 skipped


def write_line_plot(path, title, panels, columns=2):
    """Draw the panels on a grid under a title and one legend shared by all panels."""
    names = list(dict.fromkeys(name for panel in panels for name in panel.series))
    colors = {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(names)}
    rows = max(1, math.ceil(len(panels) / columns))
    canvas = np.full((HEADER_H + rows * PANEL_H, columns * PANEL_W, 3), WHITE, dtype=np.uint8)
    _text(canvas, PLOT_LEFT, 8, title, BLACK)
    x = PLOT_LEFT
    for name in names:
        canvas[32:32 + SWATCH, x:x + SWATCH] = colors[name]
        _text(canvas, x + SWATCH + 6, 33, name, BLACK)
        x += SWATCH + 6 + len(name) * CHAR_ADVANCE + 24
    for i, panel in enumerate(panels):
        _draw_panel(canvas, (i % columns) * PANEL_W, HEADER_H + (i // columns) * PANEL_H, panel,
                    colors)
    with open(path, "wb") as f:
        f.write(png_bytes(canvas))


def _draw_panel(canvas, x0, y0, panel, colors):
    left, top = x0 + PLOT_LEFT, y0 + PLOT_TOP
    right, bottom = x0 + PANEL_W - PLOT_RIGHT, y0 + PANEL_H - PLOT_BOTTOM
    _text(canvas, left, y0 + 8, panel.title, BLACK)
    points = {name: [(x, y) for x, y in pts if y > 0] for name, pts in panel.series.items()}
    xs = sorted({x for pts in points.values() for x, _ in pts})
    ys = [y for pts in points.values() for _, y in pts]
    if not ys:
        _text(canvas, left + 8, top + 8, "no data", GRAY)
        _frame(canvas, left, top, right, bottom)
        return
    lx = _log_range(xs)
    ly = _log_range(ys)
    px = lambda v: round(left + (right - left) * (math.log10(v) - lx[0]) / (lx[1] - lx[0]))
    py = lambda v: round(bottom - (bottom - top) * (math.log10(v) - ly[0]) / (ly[1] - ly[0]))
    for x in xs:
        canvas[top:bottom, px(x)] = LIGHT
        label = f"{x:g}"
        _text(canvas, px(x) - len(label) * CHAR_ADVANCE // 2, bottom + 8, label, BLACK)
    for y in _y_ticks(ly):
        canvas[py(y), left:right] = LIGHT
        label = f"{y:g}"
        _text(canvas, left - 6 - len(label) * CHAR_ADVANCE, py(y) - TEXT_H // 2, label, BLACK)
    _frame(canvas, left, top, right, bottom)
    for name, pts in points.items():
        pixels = [(px(x), py(y)) for x, y in sorted(pts)]
        for a, b in zip(pixels, pixels[1:]):
            _segment(canvas, a, b, colors[name])
        for cx, cy in pixels:
            canvas[cy - MARKER_RADIUS:cy + MARKER_RADIUS + 1,
                   cx - MARKER_RADIUS:cx + MARKER_RADIUS + 1] = colors[name]


def _log_range(values):
    """log10 bounds with a margin, so end points are not drawn on the frame."""
    lo, hi = math.log10(min(values)), math.log10(max(values))
    pad = max(0.05 * (hi - lo), 0.1)
    return lo - pad, hi + pad


def _y_ticks(log_range):
    """1-2-5 ticks inside the range, thinned to at most MAX_Y_TICKS."""
    ticks = [m * 10.0 ** e for e in range(math.floor(log_range[0]), math.ceil(log_range[1]) + 1)
             for m in (1, 2, 5) if log_range[0] <= math.log10(m * 10.0 ** e) <= log_range[1]]
    stride = math.ceil(len(ticks) / MAX_Y_TICKS)
    return ticks[::stride]


def _frame(canvas, left, top, right, bottom):
    canvas[top, left:right + 1] = canvas[bottom, left:right + 1] = BLACK
    canvas[top:bottom + 1, left] = canvas[top:bottom + 1, right] = BLACK


def _segment(canvas, a, b, color):
    steps = max(abs(b[0] - a[0]), abs(b[1] - a[1])) + 1
    xs = np.linspace(a[0], b[0], steps).round().astype(int)
    ys = np.linspace(a[1], b[1], steps).round().astype(int)
    for dx in range(LINE_THICKNESS):
        for dy in range(LINE_THICKNESS):
            canvas[ys + dy, xs + dx] = color


def _text(canvas, x, y, text, color):
    """Draw text with the top-left corner at (x, y); lower case is drawn as upper case."""
    for i, char in enumerate(text.upper()):
        rows = _FONT.get(char, _FONT["_"])
        for r, digit in enumerate(rows):
            for c in range(GLYPH_W):
                if int(digit, 8) >> (GLYPH_W - 1 - c) & 1:
                    top, left = y + r * FONT_SCALE, x + i * CHAR_ADVANCE + c * FONT_SCALE
                    canvas[top:top + FONT_SCALE, left:left + FONT_SCALE] = color


def png_bytes(rgb):
    """Encode an (H, W, 3) uint8 array as a PNG: 8-bit RGB, no interlace, filter 0 per row."""
    height, width, _ = rgb.shape
    rows = np.concatenate([np.zeros((height, 1), np.uint8), rgb.reshape(height, -1)], axis=1)

    def chunk(tag, data):
        return (struct.pack(">I", len(data)) + tag + data
                + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8 bits, RGB
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(rows.tobytes(), 9)) + chunk(b"IEND", b""))
