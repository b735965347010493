"""N-gram speculative decoding: measured on the real engine, predicted by the simulator.

    .venv/bin/python benchmarks/spec_decode.py                  # 4 agent sessions, CPU
    .venv/bin/python benchmarks/spec_decode.py --sessions 8 --k 4 --lookup 1 3

Part 1 runs the first ``--sessions`` sessions of the bundled agent trace (all at once,
greedy) through the engine on the tiny preset (CPU, one thread), without and with n-gram
speculation, and reports the acceptance (per draft position, and the ``alpha`` whose
``alpha**i`` model gives the same accepted tokens per draft) and the speed-up (output
tokens per CPU second of the process, best of ``--repeats`` alternated runs; steps). Both runs must
emit the same tokens.

Part 2 asks the simulator (h100, llama-3-8b, current vLLM stack) for steady decoding
at each batch size, without and with ``k``-token drafts of the measured ``alpha`` (and
the default), and the crossover batch size from which speculation no longer pays; then
the same for llama-3-70b on 4 GPUs with free (n-gram) drafts and with llama-3-8b drafting.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

BATCHES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]


def run_real(model: Path, prompts: dict[str, list[int]], outputs: dict[str, int], **spec: Any):
    from slotune.engine import Engine, EngineConfig, SamplingParams
    from slotune.engine.model import TorchExecutor

    longest = max(len(p) + outputs[r] for r, p in prompts.items())
    config = EngineConfig(
        max_num_batched_tokens=512,
        max_model_len=longest,
        num_gpu_blocks=len(prompts) * -(-longest // 16) + 16,
        **spec,
    )
    engine = Engine(config, TorchExecutor(model, device="cpu", threads=1))
    tokens: dict[str, list[int]] = {}
    start = time.process_time()  # one thread: CPU time, not disturbed by other load
    for rid, prompt in prompts.items():
        params = SamplingParams(temperature=0.0, max_tokens=outputs[rid], ignore_eos=True)
        engine.add_request(rid, prompt, params)
    while engine.has_unfinished_requests():
        for o in engine.step():
            tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
    return tokens, time.process_time() - start, engine.stats()


def fit_alpha(mean_accepted: float, k: int) -> float:
    """The alpha whose alpha + ... + alpha**k equals the measured accepted tokens per draft."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if sum(mid**i for i in range(1, k + 1)) < mean_accepted:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def agent_requests(sessions: int, scale: float) -> tuple[dict[str, list[int]], dict[str, int]]:
    """Each turn of the first sessions as one request: its whole conversation so far (the
    trace's stand-in tokens for earlier outputs) and its output length, scaled."""
    from slotune.workloads import load_trace
    from slotune.workloads.trace import output_placeholder_tokens

    trace = load_trace("agent").repeat_to(sessions)
    own = trace.own_prompt_token_ids()
    index = {r.request_id: i for i, r in enumerate(trace.requests)}
    full: list[list[int]] = []
    prompts, outputs = {}, {}
    for i, r in enumerate(trace.requests):
        ids = list(own[i])
        if r.parent_id is not None:
            p = index[r.parent_id]
            parent = trace.requests[p]
            ids = full[p] + output_placeholder_tokens(trace.seed, p, parent.output_len) + ids
        full.append(ids)
        prompts[r.request_id] = ids
        outputs[r.request_id] = max(4, round(r.output_len * scale))
    return prompts, outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    parser.add_argument("--lookup", type=int, nargs=2, default=(1, 3), metavar=("MIN", "MAX"))
    parser.add_argument("--output-scale", type=float, default=0.5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--context", type=int, nargs="+", default=[1000, 4000], help="simulated context tokens"
    )
    args = parser.parse_args()

    from slotune.engine.model.init_model import init_model
    from slotune.engine.sim import SimExecutor
    from slotune.engine.sim.speculative import (
        NGRAM_ACCEPTANCE,
        crossover_batch_size,
        speculation_curve,
    )

    model = init_model(Path(tempfile.mkdtemp()) / "m", "tiny", seed=0)
    prompts, outputs = agent_requests(args.sessions, args.output_scale)
    spec = dict(
        num_speculative_tokens=args.k,
        prompt_lookup_min=args.lookup[0],
        prompt_lookup_max=args.lookup[1],
    )
    plain_s, spec_s = [], []
    for _ in range(args.repeats):
        plain_tokens, t, plain_stats = run_real(model, prompts, outputs)
        plain_s.append(t)
        spec_tokens, t, stats = run_real(model, prompts, outputs, **spec)
        spec_s.append(t)
        assert spec_tokens == plain_tokens, "speculation changed a greedy output"
    total = sum(outputs.values())
    drafts = stats["spec_num_drafts"]
    per_draft = stats["spec_num_accepted_tokens"] / max(drafts, 1)
    per_pos = [n / max(drafts, 1) for n in stats["spec_num_accepted_tokens_per_pos"]]
    alpha = fit_alpha(per_draft, args.k)
    decode_steps = plain_stats["steps"]
    print(
        f"agent trace, {args.sessions} sessions: {len(prompts)} requests, "
        f"{sum(map(len, prompts.values()))} prompt and {total} output tokens; tiny model, CPU"
    )
    print(f"k={args.k}, prompt lookup {args.lookup[0]}..{args.lookup[1]}")
    print(
        f"drafts: {drafts} ({stats['spec_num_draft_tokens']} tokens), accepted "
        f"{stats['spec_num_accepted_tokens']} = {per_draft:.2f} per draft; "
        f"by position {', '.join(f'{p:.2f}' for p in per_pos)}; fitted alpha {alpha:.2f}"
    )
    print("| run | steps | CPU s (best) | output tok/CPU s |")
    print("|---|---:|---:|---:|")
    print(f"| no speculation | {decode_steps} | {min(plain_s):.2f} | {total / min(plain_s):.0f} |")
    print(
        f"| n-gram k={args.k} | {stats['steps']} | {min(spec_s):.2f} | {total / min(spec_s):.0f} |"
    )
    print(
        f"speed-up: {min(plain_s) / min(spec_s):.2f}x CPU time, "
        f"{decode_steps / stats['steps']:.2f}x steps"
    )

    cost = SimExecutor("h100", "llama-3-8b").cost_model
    print(f"\nsimulated h100, llama-3-8b, k={args.k}: throughput speed-up by batch size")
    print("| context | alpha | " + " | ".join(map(str, BATCHES)) + " | crossover |")
    print("|---:|---:|" + "---:|" * (len(BATCHES) + 1))
    for context in args.context:
        for a in sorted({round(alpha, 2), NGRAM_ACCEPTANCE, 0.3, 0.5}):
            points = speculation_curve(cost, a, args.k, context, BATCHES)
            row = " | ".join(f"{p.speedup:.2f}" for p in points)
            print(f"| {context} | {a:.2f} | {row} | {crossover_batch_size(points) or 'none'} |")

    target = SimExecutor("h100", "llama-3-70b", tp=4).cost_model
    draft = SimExecutor("h100", "llama-3-8b", tp=4).cost_model
    context = args.context[0]
    print(f"\nsimulated 4x h100, llama-3-70b, k={args.k}, context {context}")
    print("| drafts | alpha | " + " | ".join(map(str, BATCHES)) + " | crossover |")
    print("|---|---:|" + "---:|" * (len(BATCHES) + 1))
    for name, model in (("n-gram", None), ("llama-3-8b", draft)):
        for a in (0.5, 0.8):
            points = speculation_curve(target, a, args.k, context, BATCHES, model)
            row = " | ".join(f"{p.speedup:.2f}" for p in points)
            print(f"| {name} | {a:.2f} | {row} | {crossover_batch_size(points) or 'none'} |")


if __name__ == "__main__":
    main()
