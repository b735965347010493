"""Write the stack profiles of engine versions without measured runs from the measured one.

    .venv/bin/python benchmarks/derive_stacks.py    # rewrites vllm-0.34/0.11.json, sglang-0.5.json

``vllm-0.15`` is fitted on the ten training runs (vLLM 0.15.1, H100). No runs of the other
versions exist here, so their profiles take its fitted constants and change only what the
engines' documented defaults change; each says so in ``provenance`` and ``derived``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

STACKS = Path(__file__).resolve().parents[1] / "slotune/engine/sim/stacks"

DERIVED: dict[str, dict[str, Any]] = {
    "vllm-0.34": {
        "engine": "vllm==0.34 (newest release this profile names)",
        "note": "vLLM V1 engine core, newest release: async scheduling, CUDA graphs "
        "(FULL_AND_PIECEWISE: full graphs for decode batches, piecewise for mixed ones, up "
        "to min(2 max_num_seqs, 512, max_num_batched_tokens) tokens), custom all-reduce, "
        "the OpenAI server in front.",
        "provenance": "DERIVED, NOT MEASURED: no runs of this version back it. Every "
        "constant is vllm-0.15's fit on the ten training runs (vLLM 0.15.1, H100, "
        "inference-perf client): the engine loop, graph capture rule and server are the "
        "same design; whatever the newer release changed in host work or kernels is not "
        "known here. Expect the error of vllm-0.15 plus the version's drift.",
        "changes": {},
    },
    "vllm-0.11": {
        "engine": "vllm==0.11 (also 0.10)",
        "note": "vLLM V1 engine core as 0.10 - 0.11 run it by default: no async scheduling "
        "(the host schedules a step and processes its outputs while the GPU waits; "
        "--async-scheduling was opt-in until vLLM PR #27614 made it the default after "
        "0.11), CUDA graphs as 0.15, custom all-reduce, the OpenAI server in front.",
        "provenance": "DERIVED, NOT MEASURED: no runs of this version back it. Every "
        "constant is vllm-0.15's fit on the ten training runs (vLLM 0.15.1, H100, "
        "inference-perf client); only async scheduling is off (host_overlap 0, no "
        "schedule-ahead), so the host's per-step and per-request work, priors the fit "
        "could not pin (the training runs hide them behind the GPU), is added to every "
        "step. Checked, not fitted, against GPUStack's published 0.10 - 0.11 runs "
        "(benchmarks/published_vllm.py).",
        "changes": {"host_overlap": 0.0, "schedule_ahead": False},
    },
    "sglang-0.5": {
        "engine": "sglang==0.5",
        "note": "SGLang 0.5 with its defaults: the overlap scheduler (CPU scheduling of "
        "step k+1 hidden behind step k, new requests a step later), CUDA graphs for decode "
        "batches up to cuda_graph_max_bs (256 assumed for an 80 GB card), custom "
        "all-reduce, its HTTP server and tokenizer/detokenizer processes in front.",
        "provenance": "DERIVED, NOT MEASURED: no SGLang runs here. Host, per-request, "
        "all-reduce and kernel-time constants are vllm-0.15's fit (vLLM 0.15.1, H100, "
        "inference-perf client); only the graph limit follows SGLang's default. Not "
        "modelled: SGLang runs prefill and decode in separate batches unless "
        "--enable-mixed-chunk (the simulator mixes them as vLLM does), and its radix "
        "cache is priced as vLLM's block hashing.",
        "changes": {"graph_max_tokens": 256},
    },
}


def main() -> None:
    base = json.loads((STACKS / "vllm-0.15.json").read_text())
    for name, spec in DERIVED.items():
        data: dict[str, Any] = {"name": name, "engine": spec["engine"], "note": spec["note"]}
        data["provenance"] = spec["provenance"]
        for key, value in base.items():
            if key not in ("name", "engine", "note", "provenance", "fit"):
                data[key] = value
        data.update(spec["changes"])
        data["derived"] = {
            "from": "vllm-0.15",
            "copied": sorted(k for k in base if k not in ("name", "engine", "note", "fit")),
            "changed": spec["changes"],
            "measured_runs": [],
        }
        (STACKS / f"{name}.json").write_text(json.dumps(data, indent=2) + "\n")
        print(f"wrote {STACKS / f'{name}.json'}")


if __name__ == "__main__":
    main()
