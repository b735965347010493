"""Markdown tables of calibration errors."""

from __future__ import annotations

from slotune.calibration.errors import ErrorRow


def errors_markdown(rows: list[ErrorRow]) -> str:
    """One table per reference file: ops down, ranges across, ``median / p90`` abs. error."""
    out = []
    for file in dict.fromkeys(r.file for r in rows):
        mine = [r for r in rows if r.file == file]
        ranges = list(dict.fromkeys(r.range_name for r in mine))
        cells = {(r.op, r.range_name): f"{r.median_pct:.1f} / {r.p90_pct:.1f}" for r in mine}
        out.append(f"`{file}` (median / p90 absolute error, %):\n")
        out.append("| op | " + " | ".join(ranges) + " |")
        out.append("|---|" + "---:|" * len(ranges))
        for op in dict.fromkeys(r.op for r in mine):
            out.append(f"| {op} | " + " | ".join(cells.get((op, x), "") for x in ranges) + " |")
        out.append("")
    return "\n".join(out)
