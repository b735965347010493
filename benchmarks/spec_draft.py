"""Draft-model speculative decoding: measured on the real engine, predicted by the simulator.

    PYTHONPATH=. .venv/bin/python benchmarks/spec_draft.py            # CPU, a few minutes
    PYTHONPATH=. .venv/bin/python benchmarks/spec_draft.py --sessions 2 --k 2 4 --repeats 1

Part 1 runs the first ``--sessions`` sessions of the bundled agent trace (all at once,
greedy; ``spec_decode.agent_requests``) through the engine on the ``tiny`` preset (2
layers, CPU, one thread; ``--preset``), without speculation and with a draft model of
``k`` tokens: the target cut to its first ``--draft-layers`` layers (same embeddings and
head), and the target itself (every draft accepted: the cost of drafting alone). It
reports acceptance (per draft position, and the fitted ``alpha``), steps, and CPU seconds
of the process (best of ``--repeats`` alternated runs). Every run must emit the same
tokens.

Part 2 asks the simulator (current vLLM stack) for steady decoding at each batch size with
a draft model at the default acceptance (``DRAFT_ACCEPTANCE``, vllm-project/vllm#24322) and
at the acceptance measured in part 1: the throughput speed-up and the crossover batch size
from which speculation no longer pays, for llama-3-70b on 4 h100 drafted by llama-3-8b and
qwen2.5-32b on one h100 drafted by a Qwen2.5-0.5B (its public config.json shape).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from benchmarks.spec_decode import BATCHES, agent_requests, fit_alpha, run_real

QWEN2_5_0_5B = {  # Qwen/Qwen2.5-0.5B's config.json (the fields the simulator reads)
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
}


def cut_draft(target: Path, out: Path, layers: int) -> Path:
    """``target`` cut to its first ``layers`` decoder layers: same embeddings, norm, head
    and tokenizer."""
    import shutil

    from safetensors.torch import load_file, save_file

    out.mkdir(parents=True, exist_ok=True)
    config = json.loads((target / "config.json").read_text())
    config["num_hidden_layers"] = layers
    (out / "config.json").write_text(json.dumps(config))
    tensors = {}
    for file in sorted(target.glob("*.safetensors")):
        for name, t in load_file(file).items():
            if not name.startswith("model.layers.") or int(name.split(".")[2]) < layers:
                tensors[name] = t
    save_file(tensors, out / "model.safetensors")
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (target / name).exists():
            shutil.copy(target / name, out / name)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--k", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--output-scale", type=float, default=0.5)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--context", type=int, default=1000, help="simulated context tokens")
    parser.add_argument("--preset", default="tiny", help="init-model preset of the target")
    parser.add_argument("--draft-layers", type=int, default=1, help="the target's first N")
    args = parser.parse_args()

    from slotune.engine.model.init_model import init_model
    from slotune.engine.sim import SimExecutor
    from slotune.engine.sim.speculative import (
        DRAFT_ACCEPTANCE,
        crossover_batch_size,
        speculation_curve,
    )

    root = Path(tempfile.mkdtemp())
    target = init_model(root / args.preset, args.preset, seed=0)
    cut = f"first {args.draft_layers} layer" + ("s" if args.draft_layers > 1 else "")
    drafts = {cut: cut_draft(target, root / "draft", args.draft_layers), "target itself": target}
    prompts, outputs = agent_requests(args.sessions, args.output_scale)
    total = sum(outputs.values())
    print(
        f"agent trace, {args.sessions} sessions: {len(prompts)} requests, "
        f"{sum(map(len, prompts.values()))} prompt and {total} output tokens; "
        f"{args.preset} preset, CPU, one thread"
    )
    runs = [("no speculation", None, 0)] + [
        (f"{name}, k={k}", path, k) for name, path in drafts.items() for k in args.k
    ]
    best: dict[str, float] = {}
    stats: dict[str, dict] = {}
    reference = None
    for _ in range(args.repeats):
        for label, path, k in runs:
            spec = (
                {}
                if path is None
                else {"num_speculative_tokens": k, "speculative_model": str(path)}
            )
            tokens, seconds, stats[label] = run_real(target, prompts, outputs, **spec)
            reference = reference or tokens
            assert tokens == reference, f"{label}: speculation changed a greedy output"
            best[label] = min(best.get(label, seconds), seconds)
    plain = best["no speculation"]
    plain_steps = stats["no speculation"]["steps"]
    print("| run | acceptance | by position | alpha | steps | CPU s (best) | speed-up |")
    print("|---|---:|---|---:|---:|---:|---:|")
    measured = {}
    for label, _, k in runs:
        s = stats[label]
        if k:
            drafts_n = max(s["spec_num_drafts"], 1)
            rate = s["spec_num_accepted_tokens"] / max(s["spec_num_draft_tokens"], 1)
            per_pos = ", ".join(
                f"{n / drafts_n:.2f}" for n in s["spec_num_accepted_tokens_per_pos"]
            )
            alpha = fit_alpha(s["spec_num_accepted_tokens"] / drafts_n, k)
            measured[label] = alpha
            accept = f"{rate:.2f} | {per_pos} | {alpha:.2f}"
        else:
            accept = "- | - | -"
        print(
            f"| {label} | {accept} | {s['steps']} ({plain_steps / s['steps']:.2f}x fewer) | "
            f"{best[label]:.2f} | {plain / best[label]:.2f}x |"
        )

    qwen_draft = root / "qwen2.5-0.5b.json"
    qwen_draft.write_text(json.dumps(QWEN2_5_0_5B))
    first = next(a for label, a in measured.items() if label.startswith(cut))
    pairs = [
        ("4x h100, llama-3-70b + llama-3-8b", ("llama-3-70b", 4), "llama-3-8b"),
        ("h100, qwen2.5-32b + Qwen2.5-0.5B", ("qwen2.5-32b", 1), str(qwen_draft)),
    ]
    for title, (name, tp), draft_name in pairs:
        cost = SimExecutor("h100", name, tp=tp).cost_model
        draft = SimExecutor("h100", draft_name, tp=tp).cost_model
        print(f"\nsimulated {title}, context {args.context}: throughput speed-up by batch size")
        print("| k | alpha | " + " | ".join(map(str, BATCHES)) + " | crossover |")
        print("|---:|---:|" + "---:|" * (len(BATCHES) + 1))
        for k in args.k:
            for a in sorted({DRAFT_ACCEPTANCE, round(first, 2)}):
                points = speculation_curve(cost, a, k, args.context, BATCHES, draft)
                row = " | ".join(f"{p.speedup:.2f}" for p in points)
                print(f"| {k} | {a:.2f} | {row} | {crossover_batch_size(points) or 'none'} |")


if __name__ == "__main__":
    main()
