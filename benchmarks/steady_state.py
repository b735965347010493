"""Steady-state goodput: how long a run must be for the tuner's ranking to stop changing.

    .venv/bin/python benchmarks/steady_state.py                 # sharegpt-like, h100, 13 configs
    .venv/bin/python benchmarks/steady_state.py --durations 20,30,60,120 --trace agent

For each of a grid of configurations (batch budget x max_num_seqs, fp8 KV cache, prefill
first, and vLLM's defaults) the goodput objective's rate search (the highest ladder rate
whose run meets the SLO for 99 % of requests, from 16 req/s as the tuner's baseline
search starts) is run with a burst (500 requests at each rate, 2 % steps) and with timed
runs of each duration as ``slotune tune`` runs them by default (5 % steps, a warm-up of
``--warmup`` s, a cool-down of a tenth, a run that never settled counts as a miss).
Reported per mode: each configuration's goodput, the CPU seconds the searches took, and
against the longest runs: Kendall's tau of the rankings, whether the best configuration
is the same, and the largest goodput error.
"""

from __future__ import annotations

import argparse
import itertools
import time
from typing import Any


def kendall_tau(a: list[float], b: list[float]) -> float:
    """Kendall's tau-b (ties allowed): 1 when the two rankings agree on every pair."""
    concordant = discordant = ties_a = ties_b = 0
    for i, j in itertools.combinations(range(len(a)), 2):
        da, db = a[i] - a[j], b[i] - b[j]
        if da == 0 and db == 0:
            continue
        if da == 0:
            ties_a += 1
        elif db == 0:
            ties_b += 1
        elif da * db > 0:
            concordant += 1
        else:
            discordant += 1
    n = concordant + discordant
    denominator = ((n + ties_a) * (n + ties_b)) ** 0.5
    return (concordant - discordant) / denominator if denominator else 1.0


def configs(baseline: Any) -> list[tuple[str, Any]]:
    from dataclasses import replace

    out = [("vllm-defaults", baseline)]
    for tokens, seqs in itertools.product((256, 1024, 4096), (16, 64, 256)):
        name = f"tokens{tokens}-seqs{seqs}"
        out.append((name, replace(baseline, max_num_batched_tokens=tokens, max_num_seqs=seqs)))
    out.append(("defaults-fp8-kv", replace(baseline, kv_cache_dtype="fp8")))
    fp8 = replace(baseline, max_num_batched_tokens=4096, max_num_seqs=512, kv_cache_dtype="fp8")
    out.append(("tokens4096-seqs512-fp8", fp8))
    out.append(
        (
            "tokens2048-prefill-first",
            replace(baseline, max_num_batched_tokens=2048, policy="prefill_first"),
        )
    )
    return out


def goodputs(
    options: Any, named: list[tuple[str, Any]], guesses: list[float] | None = None
) -> tuple[list[float], float]:
    """Each configuration's goodput and the CPU seconds the searches took: the tuner's
    exact search from 16 req/s, or (``guesses``) a walk one ladder rung at a time from
    the guessed rate up to the last rate held (the same answer when goodput is monotone
    in the rate, in a few runs)."""
    from slotune.tuner.evaluate import Evaluator
    from slotune.tuner.prepare import prepare

    prepared = prepare(options)
    evaluator = Evaluator(prepared.setup, prepared.trace)
    ladder = evaluator.ladder
    assert ladder is not None
    start = time.process_time()
    values = []
    for i, (_, config) in enumerate(named):
        if guesses is None:
            values.append(evaluator.goodput(config, ladder.rung(16.0), exact=True).value)
            continue

        def held(k: int, config: Any = config) -> bool:
            return evaluator.measure(config, ladder.rate(k)).feasible

        k = ladder.rung(max(guesses[i], ladder.rate(ladder.lowest)))
        if held(k):
            while k < ladder.highest and held(k + 1):
                k += 1
            values.append(ladder.rate(k))
            continue
        while k > ladder.lowest and not held(k - 1):
            k -= 1
        values.append(ladder.rate(k - 1) if k > ladder.lowest else 0.0)
    return values, time.process_time() - start


def main() -> None:
    from concurrent.futures import ProcessPoolExecutor
    from dataclasses import replace

    from slotune.tuner.prepare import TuneOptions, baseline_config, prepare

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", default="sharegpt-like")
    parser.add_argument("--gpu", default="h100")
    parser.add_argument("--slo", default="ttft=300ms,tpot=50ms")
    parser.add_argument("--durations", default="20,30,60,120")
    parser.add_argument(
        "--exact", type=float, default=30.0, help="Duration searched exactly; the rest walk from it"
    )
    parser.add_argument("--warmup", type=float, default=10.0, help="Warm-up seconds")
    args = parser.parse_args()
    base = TuneOptions(gpu=args.gpu, slo=args.slo, trace=args.trace, objective="goodput")
    burst = replace(base, num_requests=500)
    named = configs(baseline_config(prepare(burst)))

    def timed(d: float) -> Any:
        return replace(base, duration=d, warmup=min(args.warmup, d / 3), cooldown=d / 10)

    durations = sorted(float(x) for x in args.durations.split(","))
    modes = [("burst-500", burst), *((f"{d:g}s", timed(d)) for d in durations)]
    results = {"burst-500": goodputs(burst, named)}
    print(f"burst-500: {results['burst-500'][1]:.1f} CPU s", flush=True)
    exact = f"{args.exact:g}s"
    results[exact] = goodputs(timed(args.exact), named)
    print(f"{exact}: {results[exact][1]:.1f} CPU s (exact searches)", flush=True)
    rest = [(n, o) for n, o in modes[1:] if n != exact]
    with ProcessPoolExecutor(max_workers=max(len(rest), 1)) as pool:
        futures = {n: pool.submit(goodputs, o, named, results[exact][0]) for n, o in rest}
        for name, future in futures.items():
            results[name] = future.result()
            print(f"{name}: {results[name][1]:.1f} CPU s", flush=True)
    reference = results[modes[-1][0]][0]
    best = max(range(len(named)), key=lambda i: reference[i])
    print(f"\nreference: the {modes[-1][0]} runs; best there: {named[best][0]}")
    print(f"{'mode':>10} {'CPU s':>9} {'tau':>6} {'same best':>9} {'max err':>8}")
    for name, _ in modes:
        values, seconds = results[name]
        error = max(abs(v - r) / r for v, r in zip(values, reference, strict=True) if r)
        same = max(range(len(named)), key=lambda i: values[i]) == best
        print(
            f"{name:>10} {seconds:9.1f} {kendall_tau(values, reference):6.2f} "
            f"{'yes' if same else 'no':>9} {error:8.1%}"
        )
    print("\ngoodput (req/s) per configuration:")
    print(f"{'config':>26} " + " ".join(f"{n:>9}" for n, _ in modes))
    for i, (cname, _) in enumerate(named):
        print(f"{cname:>26} " + " ".join(f"{results[n][0][i]:9.2f}" for n, _ in modes))


if __name__ == "__main__":
    main()
