"""``tune --verify`` against ``slotune serve``: what a verified configuration costs, and
whether measuring on the server repairs a simulator that is wrong.

The setting is the slow test's (``tests/tuner/wrong_stack.py``): the server is the
simulated engine behind the real HTTP server, paced in wall-clock time, on the TRUE stack;
the study simulates a WRONG stack, the true one with ``host_exposed_us`` ten times too
small, over a 32- and a 256-token budget (and the defaults, 2048). Round 1 tunes and
verifies on the wrong stack and fits a stack to the measured runs; round 2 tunes and
verifies again from that fitted stack. The table gives, per round, the Spearman rank
correlation between the simulated and the measured order of the same candidates, the
simulated and the measured winner (with its budget), the constant's value in the stack
simulated, the wall time per verified configuration (its server's start, the replay and
the stop), the fit's and the whole round's.

    PYTHONPATH=. .venv/bin/python benchmarks/verify_loop.py [--rounds 2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slotune.engine.sim.stack import load_stack
from slotune.tuner.workflow import Stage, StageStarted
from tests.tuner import wrong_stack


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="slotune-verify-"))
    experiment = wrong_stack.prepare(work)
    field = wrong_stack.FIELD
    print(
        f"true stack {wrong_stack.TRUE_STACK}: {field} = {experiment.true_value:.4g}; "
        f"wrong: x{wrong_stack.FACTOR:g} = {experiment.wrong_value:.4g}"
    )
    print("| round | simulated stack | rank correlation | simulated winner | measured winner "
          f"| {field} | s per verified config | s fit | s round |")  # fmt: skip
    print("|---|---|---:|---|---|---:|---:|---:|---:|")
    stack: Path = experiment.wrong_stack
    fits = []
    began: list[float] = []  # when each round's verification started

    def follow(event: object) -> None:
        if isinstance(event, StageStarted) and event.stage is Stage.VERIFY:
            began.append(time.time())

    for round_ in range(1, args.rounds + 1):
        start = time.time()
        result = experiment.tune(stack, work / f"round{round_}", on_event=follow)
        seconds = time.time() - start
        measured = (result.out_dir / "verify" / "verify.json").stat().st_mtime
        fitted_at = (result.out_dir / "verify" / "stack.json").stat().st_mtime
        outcome = result.verified
        budgets = {c.label: c.config["max_num_batched_tokens"] for c in outcome.candidates}
        verified = [c for c in outcome.candidates if c.ok]
        value = getattr(load_stack(str(stack)), field)
        rho = outcome.rank_correlation
        sim, won = outcome.simulated_order[0], outcome.winner
        print(
            f"| {round_} | {stack.stem} | {'-' if rho is None else f'{rho:.2f}'} "
            f"| {sim} ({budgets[sim]}) | {won} ({budgets[won]}) | {value:.4g} "
            f"| {(measured - began[-1]) / max(len(verified), 1):.1f} "
            f"| {fitted_at - measured:.0f} | {seconds:.0f} |"
        )
        if result.verified_stack is None:
            break
        stack = result.verified_stack
        fitted = getattr(load_stack(str(stack)), field)
        fits.append(f"fitted {field} after round {round_}: {fitted:.4g}")
    for line in fits:
        print(f"{line} (true {experiment.true_value:.4g})")


if __name__ == "__main__":
    main()
