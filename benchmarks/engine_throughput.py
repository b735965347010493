"""Engine throughput: our engine against Hugging Face ``generate`` with static batches.

    .venv/bin/python benchmarks/engine_throughput.py              # small preset, CPU
    .venv/bin/python benchmarks/engine_throughput.py --model DIR --device cuda --threads 0

Both run the same model (one checkpoint folder, float32 on the CPU), the same requests
(ShareGPT-like lengths scaled to the small model, all queued at the start) and the same
number of sequences at a time: our engine with continuous batching and chunked prefill
(``max_num_seqs`` = the batch size), transformers with static batches of that size, each
batch left-padded and run until its longest output is done. Reported: output tokens per
second (only the tokens each request asked for) and the ratio, best of ``--repeats``
alternated runs of each.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

SCALE = 0.25


def requests(num: int, seed: int = 0) -> list[tuple[list[int], int]]:
    from slotune.workloads import sharegpt_like

    trace = sharegpt_like(num, seed=seed)
    prompts = trace.own_prompt_token_ids()
    out = []
    for r, ids in zip(trace, prompts, strict=True):
        n = max(4, round(r.prompt_len * SCALE))
        out.append((ids[:n], max(2, round(r.output_len * SCALE))))
    return out


def run_ours(
    model: Path, device: str, reqs: list[tuple[list[int], int]], batch: int, threads: int
) -> float:
    from slotune.engine import Engine, EngineConfig, SamplingParams
    from slotune.engine.model import TorchExecutor

    config = EngineConfig(
        max_num_batched_tokens=512,
        max_num_seqs=batch,
        max_model_len=1024,
        num_gpu_blocks=4096,
        prefix_caching="none",
    )
    executor = TorchExecutor(model, device=device, threads=threads or None)
    engine = Engine(config, executor, eos_token_id=executor.eos_token_id)
    t = time.perf_counter()
    for i, (prompt, n) in enumerate(reqs):
        engine.add_request(
            f"r{i}", prompt, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
        )
    produced = 0
    while engine.has_unfinished_requests():
        produced += sum(len(o.new_token_ids) for o in engine.step())
    assert produced == sum(n for _, n in reqs)
    return time.perf_counter() - t


def run_hf(model: Path, device: str, reqs: list[tuple[list[int], int]], batch: int) -> float:
    import torch
    from transformers import AutoModelForCausalLM

    dev = torch.device("cuda" if device == "cuda" else "cpu")
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    hf = AutoModelForCausalLM.from_pretrained(model, local_files_only=True, dtype=dtype)
    hf = hf.to(dev).eval()
    t = time.perf_counter()
    for start in range(0, len(reqs), batch):
        group = reqs[start : start + batch]
        width = max(len(p) for p, _ in group)
        ids = torch.zeros(len(group), width, dtype=torch.long)
        mask = torch.zeros(len(group), width, dtype=torch.long)
        for row, (p, _) in enumerate(group):
            ids[row, width - len(p) :] = torch.tensor(p)
            mask[row, width - len(p) :] = 1
        new = max(n for _, n in group)
        with torch.no_grad():
            hf.generate(
                input_ids=ids.to(dev),
                attention_mask=mask.to(dev),
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=False,
                pad_token_id=0,
            )
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="checkpoint folder (default: a fresh small preset)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (0: the executor's default)"
    )
    args = parser.parse_args()

    import tempfile

    import torch

    from slotune.engine.model.init_model import init_model

    model = Path(args.model) if args.model else init_model(Path(tempfile.mkdtemp()) / "m", "small")
    reqs = requests(args.requests)
    tokens = sum(n for _, n in reqs)
    ours_runs, hf_runs = [], []
    for _ in range(args.repeats):  # alternated, best of each: other work on the cores only adds
        ours_runs.append(run_ours(model, args.device, reqs, args.batch, args.threads))
        torch.set_num_threads(args.threads or torch.get_num_threads())
        hf_runs.append(run_hf(model, args.device, reqs, args.batch))
    ours, hf = min(ours_runs), min(hf_runs)
    print(f"{len(reqs)} requests, {tokens} output tokens, batch {args.batch}, {args.device}")
    print("| system | wall s | output tok/s |")
    print("|---|---:|---:|")
    print(f"| slotune engine (continuous batching) | {ours:.1f} | {tokens / ours:.0f} |")
    print(f"| transformers generate (static batches) | {hf:.1f} | {tokens / hf:.0f} |")
    print(f"speed-up: {hf / ours:.2f}x")


if __name__ == "__main__":
    main()
