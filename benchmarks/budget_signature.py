"""Which kind of per-step slowdown reproduces a measured single-knob change?

    .venv/bin/python benchmarks/budget_signature.py            # the budget 2048 -> 1024 pair

A change of mean E2E and mean TTFT has a signature: a cost every step pays moves E2E and
TTFT in one ratio, a cost only the steps carrying prefill tokens pay (in vLLM V1 the steps
that run piecewise CUDA graphs with eager attention, a prefix-cache hit's few tokens or a
new prompt's chunk) moves TTFT far more than E2E. This replays the study's "general" load
(``validate.pairs.study_workload``) on Llama-3.1-8B (Llama-3-8B's shapes), H100, the shipped
stack, and adds each hypothetical cost in turn to every step or to the mixed steps only,
printing the simulated change beside the measured pair. A hypothesis, not a fit: nothing
here changes the shipped stack.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any
from unittest import mock

from slotune.engine.sim.cost_model import CostModel
from slotune.engine.sim.stack import load_stack
from slotune.validate.pairs import MEASURED_PAIRS, simulate, study_workload


@contextmanager
def mixed_step_cost(extra_s: float) -> Iterator[None]:
    """Every step that carries prefill tokens costs ``extra_s`` more on the GPU."""
    plain = CostModel.gpu_step_seconds

    def priced(self: CostModel, *args: Any, **kwargs: Any) -> float:
        chunks = kwargs.get("prefill_chunks", args[4] if len(args) > 4 else ())
        return plain(self, *args, **kwargs) + (extra_s if chunks else 0.0)

    with mock.patch.object(CostModel, "gpu_step_seconds", priced):
        yield


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--pair", default="Llama-3.1-8B budget 2048 -> 1024")
    ap.add_argument("--stage-s", type=float, default=120.0, help="seconds of each load stage")
    args = ap.parse_args()
    pair = next((p for p in MEASURED_PAIRS if p.name == args.pair), None)
    if pair is None:
        print(f"unknown pair {args.pair!r}; known: {[p.name for p in MEASURED_PAIRS]}")
        return 2
    trace = study_workload(((8.0, args.stage_s), (20.0, args.stage_s)))
    stack = load_stack(None)
    base = simulate(pair.before, trace, stack)

    def row(label: str, after: dict[str, float]) -> None:
        e2e, ttft = (after[m] / base[m] - 1 for m in ("e2e", "ttft"))
        ratio = ttft / e2e if abs(e2e) > 0.005 else float("nan")
        print(f"| {label} | {e2e * 100:+.1f} % | {ttft * 100:+.1f} % | {ratio:.2f} |")

    meas_ratio = (pair.ttft or 0.0) / pair.e2e if pair.e2e else float("nan")
    print(f"Pair: {pair.name}; mixed steps {base['mixed'] * 100:.1f} % of {base['steps']:.0f}\n")
    print("| hypothesis | E2E | TTFT | TTFT / E2E |")
    print("|---|---:|---:|---:|")
    print(
        f"| measured | {(pair.e2e or 0) * 100:+.0f} % | {(pair.ttft or 0) * 100:+.0f} % "
        f"| {meas_ratio:.2f} |"
    )
    row("simulated, as shipped", simulate(pair.after, trace, stack))
    for f in (1.08, 1.12):
        scaled = replace(stack, gpu_time_scale=stack.gpu_time_scale * f)
        row(f"every step's GPU work x{f:g}", simulate(pair.before, trace, scaled))
    for ms in (0.6, 0.8):
        exposed = replace(stack, host_exposed_us=stack.host_exposed_us + 1e3 * ms)
        row(f"every step +{ms:g} ms on the critical path", simulate(pair.before, trace, exposed))
    for ms in (2.0, 5.0):
        with mixed_step_cost(ms * 1e-3):
            row(f"mixed steps only +{ms:g} ms", simulate(pair.before, trace, stack))
    return 0


if __name__ == "__main__":
    sys.exit(main())
