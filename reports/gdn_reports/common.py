"""Shared pieces of the report generators: atomic writes, number formatting, Markdown tables."""
from __future__ import annotations

import math
import os
from pathlib import Path


def write_text_atomically(path: Path, text: str) -> None:
    """Writes a temporary file beside path and renames it over path: a reader (or a crash)
    never sees half a report."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    try:
        temporary.write_text(text, encoding="utf-8")
        os.replace(temporary, path)
    finally:
        if temporary.exists():
            temporary.unlink()


def save_figure_atomically(figure, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    try:
        figure.savefig(temporary, format=path.suffix.lstrip("."), dpi=90, bbox_inches="tight",
                       metadata={"Software": None} if path.suffix == ".png" else None)
        os.replace(temporary, path)
    finally:
        if temporary.exists():
            temporary.unlink()


def fmt(value, digits: int = 3) -> str:
    """Numbers as the tables print them: integers plainly, floats in 3 significant digits
    (scientific), non-finite as inf/nan, missing as n/a. The test parses these back."""
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return f"{value:.{digits - 1}e}"


def fmt_fixed(value, decimals: int = 3) -> str:
    if value is None:
        return "n/a"
    if math.isinf(value) or math.isnan(value):
        return fmt(value)
    return f"{value:.{decimals}f}"


def fmt_percent(fraction) -> str:
    if fraction is None:
        return "n/a"
    return f"{100.0 * fraction:.1f}%"


def escape(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def table(headers: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(escape(h) for h in headers) + " |",
             "|" + "|".join("---" for _ in headers) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(escape(c) for c in row) + " |")
    return "\n".join(lines)


def median(values: list[float]):
    values = sorted(v for v in values if v is not None and not math.isnan(v))
    if not values:
        return None
    middle = len(values) // 2
    return values[middle] if len(values) % 2 else 0.5 * (values[middle - 1] + values[middle])


def maximum(values: list[float]):
    values = [v for v in values if v is not None and not math.isnan(v)]
    return max(values) if values else None


def provenance_table(provenance) -> str:
    rows = [[p.path, p.kind, p.records, p.device or "not recorded", p.date or "not recorded",
             p.commit or "not recorded", f"`{p.command}`" if p.command else "not recorded"] for p in provenance]
    return table(["input", "kind", "records", "device", "date", "commit", "command"], rows)
