"""Regression benchmarks for CI: a suite of benchmarks, run, recorded as a baseline, and
judged against it.

suite = load_suite("benchmarks/suite.yaml")
current = run_suite(suite)
comparison = compare(load_results("baseline.json"), current)
sys.exit(comparison.exit_code)
"""

from slotune.regress.compare import Comparison, Judgement, compare
from slotune.regress.report import junit_xml, markdown, write_reports
from slotune.regress.results import BenchmarkResult, SuiteResult, load_results
from slotune.regress.run import RunError, run_benchmark, run_suite
from slotune.regress.suite import Benchmark, Suite, SuiteError, load_suite
from slotune.regress.tolerance import Tolerance, parse_tolerance

__all__ = [
    "Benchmark",
    "BenchmarkResult",
    "Comparison",
    "Judgement",
    "RunError",
    "Suite",
    "SuiteError",
    "SuiteResult",
    "Tolerance",
    "compare",
    "junit_xml",
    "load_results",
    "load_suite",
    "markdown",
    "parse_tolerance",
    "run_benchmark",
    "run_suite",
    "write_reports",
]
