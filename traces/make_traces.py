"""Write slotune's bundled traces into slotune/workloads/data/ (fixed seeds, reproducible).

    .venv/bin/python traces/make_traces.py

Each file is slotune's own JSONL. Prompts are stored as lengths or as shared segments
(see slotune/workloads/trace.py), so the files stay small while shared prefixes remain
real shared tokens.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from slotune.workloads.generators import (
    AgentParams,
    ClippedNormal,
    SharedPrefixParams,
    agent_sessions,
    inference_perf_shared_prefix,
    long_context,
    reasoning,
    shared_prefix,
    sharegpt_like,
    with_tiers,
)
from slotune.workloads.load import DATA_DIR

SEED = 20240601


def main(out_dir: Path = DATA_DIR) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    traces = [
        sharegpt_like(1000, seed=SEED),
        agent_sessions(AgentParams(num_sessions=64), seed=SEED + 1),
        shared_prefix(num_groups=8, requests_per_group=50, seed=SEED + 2),
        long_context(200, seed=SEED + 3),
        reasoning(300, seed=SEED + 4),
        replace(
            inference_perf_shared_prefix(
                SharedPrefixParams(
                    system_prompt_len=2000,
                    question_len=ClippedNormal(200, 50, 50, 400),
                    output_len=ClippedNormal(200, 50, 50, 400),
                    multi_turn=True,
                    num_turns=4,
                ),
                seed=SEED + 5,
            ),
            name="shared-prefix-chat",
        ),
        with_tiers(
            agent_sessions(AgentParams(num_sessions=64), seed=SEED + 1),
            pro_share=0.25,
            seed=SEED + 6,
            name="agent-tiers",
        ),
    ]
    for trace in traces:
        path = out_dir / f"{trace.name}.jsonl"
        trace.to_jsonl(path)
        stats = trace.stats()
        print(
            f"{path}: {stats['requests']} requests, {stats['sessions']} sessions, "
            f"prompt mean {stats['prompt_len']['mean']:.0f}, output mean "
            f"{stats['output_len']['mean']:.0f}, "
            f"prefix sharing {stats['prefix_sharing_ratio']:.2f}, "
            f"{path.stat().st_size // 1024} KiB"
        )


if __name__ == "__main__":
    main()
