"""HTML reports built from stored results only (``best.json``, the study, stored runs)."""

from slotune.reports.build import TuneReport, build_bench_report, build_report

__all__ = ["TuneReport", "build_bench_report", "build_report"]
