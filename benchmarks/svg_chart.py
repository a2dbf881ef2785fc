"""A horizontal bar chart as SVG text, for benchmark figures in docs/ (no
plotting library in the project's dependencies)."""
from __future__ import annotations

import html
import math
import re
from typing import Sequence

_ROW = 22
_LABEL = 330
_BAR = 420
_COLORS = ("#4477aa", "#ee6677", "#228833", "#ccbb44", "#66ccee", "#aa3377")


def bars(title: str, rows: Sequence[tuple[str, float, str]], unit: str,
         log_scale: bool = True) -> str:
  """rows: (label, value, group); bars of a group share a colour. Values on
  a log scale by default (they span orders of magnitude)."""
  groups = list(dict.fromkeys(g for _, _, g in rows))
  top = max(v for _, v, _ in rows)
  low = min(v for _, v, _ in rows if v > 0)

  def width(v: float) -> float:
    if not log_scale:
      return _BAR * v / top
    lo = math.floor(math.log10(low))
    return _BAR * (math.log10(max(v, low)) - lo + 0.05) / (
        math.log10(top) - lo + 0.05)

  height = 56 + _ROW * len(rows) + 24 * len(groups)
  out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_LABEL + _BAR + 90}"'
         f' height="{height}" font-family="sans-serif" font-size="12">',
         f'<text x="8" y="18" font-size="14">{html.escape(title)}</text>']
  for i, (label, value, group) in enumerate(rows):
    y = 32 + i * _ROW
    color = _COLORS[groups.index(group) % len(_COLORS)]
    out += [f'<text x="{_LABEL - 6}" y="{y + 14}" text-anchor="end">'
            f'{html.escape(label)}</text>',
            f'<rect x="{_LABEL}" y="{y + 3}" width="{width(value):.1f}" '
            f'height="{_ROW - 6}" fill="{color}"/>',
            f'<text x="{_LABEL + width(value) + 4:.1f}" y="{y + 14}">'
            f'{value:,.1f} {html.escape(unit)}</text>']
  y = 40 + _ROW * len(rows)
  for k, group in enumerate(groups):
    out += [f'<rect x="{_LABEL}" y="{y + 24 * k}" width="12" height="12" '
            f'fill="{_COLORS[k % len(_COLORS)]}"/>',
            f'<text x="{_LABEL + 18}" y="{y + 24 * k + 11}">'
            f'{html.escape(group)}</text>']
  if log_scale:
    out.append(f'<text x="8" y="{height - 6}" fill="#666">bar length: log '
               'scale</text>')
  out.append("</svg>")
  return "\n".join(out) + "\n"


def stack(charts: Sequence[str]) -> str:
  """Charts from bars() one above the other, as one SVG."""
  sizes = [tuple(float(re.search(f'{k}="([0-9.]+)"', c).group(1))
                 for k in ("width", "height")) for c in charts]
  out = [f'<svg xmlns="http://www.w3.org/2000/svg" '
         f'width="{max(w for w, _ in sizes):g}" '
         f'height="{sum(h for _, h in sizes):g}">']
  y = 0.0
  for chart, (_, h) in zip(charts, sizes):
    out.append(chart.replace("<svg ", f'<svg y="{y:g}" ', 1).strip())
    y += h
  out.append("</svg>")
  return "\n".join(out) + "\n"
