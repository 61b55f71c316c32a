"""Plain-text and Markdown tables of benchmark rows (report.py, the int8 report and every bench subcommand)."""
from __future__ import annotations

import math


def _fmt(v, width: int = 0) -> str:
    if v is None:
        s = "-"
    elif isinstance(v, float):
        s = "nan" if not math.isfinite(v) else (f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}")
    else:
        s = str(v)
    return s


def table(rows: list[dict], cols: list[tuple[str, str]]) -> str:
    """Plain-text table: cols = [(key, header)]; missing values print as '-'."""
    body = [[_fmt(r.get(k)) for k, _ in cols] for r in rows]
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, (_, h) in enumerate(cols)]
    lines = ["  ".join(h.ljust(w) for (_, h), w in zip(cols, widths)),
             "  ".join("-" * w for w in widths)]
    for b in body:
        lines.append("  ".join(c.rjust(w) if i >= 2 else c.ljust(w) for i, (c, w) in enumerate(zip(b, widths))))
    return "\n".join(lines)


def _md_table(rows: list[dict], cols: list[tuple[str, str]]) -> str:
    head = "| " + " | ".join(h for _, h in cols) + " |"
    sep = "|" + "|".join("---" if i < 3 else "---:" for i in range(len(cols))) + "|"
    body = ["| " + " | ".join(_fmt(r.get(k)) for k, _ in cols) + " |" for r in rows]
    return "\n".join([head, sep, *body])
