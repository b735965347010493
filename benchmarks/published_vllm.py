"""The simulator against published vLLM 0.10 – 0.11 serving runs: a check, never a fit.

    PYTHONPATH=. .venv/bin/python benchmarks/published_vllm.py            # every case
    PYTHONPATH=. .venv/bin/python benchmarks/published_vllm.py --only 14b-h100 --json out.json

Source (numbers transcribed below, nothing downloaded at run time): GPUStack's
"performance lab" pages, repository ``gpustack/gpustack``:

- ``docs/performance-lab/qwen3-14b/h100.md`` at commit 7ae332aaf05783e657560ef927c527b156e2536d
- ``docs/performance-lab/qwen3-14b/a100.md`` at commit 10e9444a07c73556f2ef0d10d2b2766bbf54c9c0
- ``docs/performance-lab/qwen3-32b/h100.md`` at commit 10e9444a07c73556f2ef0d10d2b2766bbf54c9c0
- ``docs/performance-lab/qwen3-32b/a100.md`` at commit 10e9444a07c73556f2ef0d10d2b2766bbf54c9c0
- ``docs/performance-lab/gpt-oss-20b/h100.md`` at commit 7b50d5067ddbdeba0739e7f72d6f40e53d3b9a04
- ``docs/performance-lab/gpt-oss-20b/a100.md`` at commit 7ae332aaf05783e657560ef927c527b156e2536d
- ``docs/performance-lab/gpt-oss-120b/h100.md`` at commit 72aee9dd195ff5c9bf3a4886add80038ce79aef8
- ``docs/performance-lab/gpt-oss-120b/a100.md`` at commit 1f37f1b8bd79c6b424a0cb55c7abd08a5c2132dc

Each page's "Baseline benchmark results" (section "Other Benchmark Cases") serve
``vllm serve Qwen/Qwen3-14B`` (Qwen3-32B, openai/gpt-oss-20b; openai/gpt-oss-120b with
``--max-model-len 32768``) with vLLM v0.11.0 (v0.10.2 for gpt-oss-120b on H100) and its
defaults (one GPU: no ``--tensor-parallel-size``; the checkpoint's weights: bf16, gpt-oss's
experts MXFP4; max_model_len the model's unless given) and measure it with
``vllm bench serve --dataset-name random --random-input-len L --random-output-len O
--num-prompts N --seed 42`` (``openai-chat`` backend, no request rate: every request is
sent at once). The random cases are 32000 in / 100 out × 100, 4000 / 200 × 500,
2000 / 100 × 500 and 128 / 4 × 1000; the pages' ShareGPT cases are left out (it needs the
ShareGPT file, which is not downloaded here). The pages' result blocks give the token
totals actually sent and generated (vLLM's random prompts re-tokenize to slightly fewer
tokens than asked; some outputs stop early at an end-of-sequence token, gpt-oss's about
half of the 4000/200 case's): the simulated workload sends exactly those totals, spread as
evenly as whole tokens allow (the pages do not give each request's length).

Simulated: each case's N requests arriving at t=0 on slotune's simulator, the page's GPU
profile (``h100``; ``a100-80g`` for the A100 pages: gpt-oss's say "A100 SXM 80GB", the Qwen3
ones do not say, and only an 80 GB card holds Qwen3-32B in bf16), TP 1, the ``vllm-0.15``
stack (the fitted release nearest 0.11; 0.10 and 0.11 have no stack of their own) and vLLM
V1's serving defaults as ``targets.vllm.VLLM_0_15`` gives them for the card (token budget
8192 and 1024 sequences on H100, 2048 and 256 on A100; blocks of 16, prefix caching on,
which random prompts never hit; gpu_memory_utilization 0.9). Qwen3-14B and Qwen3-32B are not
catalogue models: their shapes are the public facts of their Hugging Face config.json files
(``QWEN3_CONFIGS``), read by ``models.model_from_hf_dict``; gpt-oss-20b and -120b are the
catalogue's (their sliding-window layers read and keep at most the 128-token window, as
``models`` says).

Metrics as ``vllm bench serve`` reports them: TTFT per request; TPOT per request
``(e2e - ttft) / (output - 1)``; the mean and median over requests; total token
throughput ``(input + output tokens) / duration``, the duration from the first send to
the last finish. Errors are ``simulated / measured - 1``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

REPO = "gpustack/gpustack"
COMMITS = {  # the commit of each page that was read (the index's stored version)
    ("qwen3-14b", "h100"): "7ae332aaf05783e657560ef927c527b156e2536d",
    ("qwen3-14b", "a100"): "10e9444a07c73556f2ef0d10d2b2766bbf54c9c0",
    ("qwen3-32b", "h100"): "10e9444a07c73556f2ef0d10d2b2766bbf54c9c0",
    ("qwen3-32b", "a100"): "10e9444a07c73556f2ef0d10d2b2766bbf54c9c0",
    ("gpt-oss-20b", "h100"): "7b50d5067ddbdeba0739e7f72d6f40e53d3b9a04",
    ("gpt-oss-20b", "a100"): "7ae332aaf05783e657560ef927c527b156e2536d",
    ("gpt-oss-120b", "h100"): "72aee9dd195ff5c9bf3a4886add80038ce79aef8",
    ("gpt-oss-120b", "a100"): "1f37f1b8bd79c6b424a0cb55c7abd08a5c2132dc",
}
STACK = "vllm-0.15"

_QWEN3_COMMON: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "attention_bias": False,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 5120,
    "num_key_value_heads": 8,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000,
    "tie_word_embeddings": False,
    "vocab_size": 151936,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "torch_dtype": "bfloat16",
}
QWEN3_CONFIGS: dict[str, dict[str, Any]] = {
    # Qwen/Qwen3-14B and Qwen/Qwen3-32B config.json (the fields that decide the shapes)
    "qwen3-14b": {
        **_QWEN3_COMMON,
        "num_hidden_layers": 40,
        "num_attention_heads": 40,
        "intermediate_size": 17408,
    },
    "qwen3-32b": {
        **_QWEN3_COMMON,
        "num_hidden_layers": 64,
        "num_attention_heads": 64,
        "intermediate_size": 25600,
    },
}
PUBLIC_PARAMS = {"qwen3-14b": 14.8e9, "qwen3-32b": 32.8e9}
"""The parameter counts the models' cards state (14.8B and 32.8B)."""


@dataclass(frozen=True)
class Published:
    """One baseline result block of a page: the case and what ``vllm bench serve`` printed."""

    page: str
    commit: str
    model: str
    gpu: str  # slotune GPU profile
    tp: int
    case: str
    num_prompts: int
    input_len: int  # asked for (--random-input-len)
    output_len: int  # asked for (--random-output-len)
    total_input: int  # "Total input tokens"
    total_output: int  # "Total generated tokens"
    duration_s: float
    total_tps: float  # "Total Token throughput (tok/s)"
    ttft_mean_ms: float
    ttft_median_ms: float
    tpot_mean_ms: float
    tpot_median_ms: float
    peak_output_tps: float  # "Peak output token throughput (tok/s)": the best 1-s bucket
    max_model_len: int = 0  # --max-model-len of the serving command (0: the model's)
    vllm: str = "0.11.0"

    @property
    def label(self) -> str:
        return f"{self.model.removeprefix('qwen3-')}-{self.gpu.split('-')[0]} {self.case}"


NA = float("nan")  # a figure the page does not print


def _rows(model: str, gpu: str, cases: list[tuple[Any, ...]], **serve: Any) -> list[Published]:
    card = gpu.split("-")[0]
    page = f"docs/performance-lab/{model}/{card}.md"
    return [Published(page, COMMITS[model, card], model, gpu, 1, *c, **serve) for c in cases]


# case, N, input, output, total in, total out, duration s, total tok/s,
# TTFT mean, median (ms), TPOT mean, median (ms), peak output tok/s
_32K = ("32000/100", 100, 32000, 100)
_4K = ("4000/200", 500, 4000, 200)
_2K = ("2000/100", 500, 2000, 100)
_128 = ("128/4", 1000, 128, 4)
PUBLISHED: tuple[Published, ...] = (
    *_rows(
        "qwen3-14b",
        "h100",
        [
            (*_32K, 3200000, 9855, 386.80, 8298.56, 191024.43, 191051.49, 277.44, 284.52, 192.0),
            (*_4K, 1997942, 99803, 227.57, 9218.03, 112716.92, 110734.54, 132.45, 139.68, 1536.0),
            (*_2K, 998175, 50000, 98.91, 10597.19, 50716.13, 49138.28, 206.51, 231.62, 2890.0),
            (*_128, 127698, 4000, 22.72, 5796.73, 18282.75, 18061.13, 525.31, 597.29, 843.0),
        ],
    ),
    *_rows(
        "qwen3-14b",
        "a100-80g",
        [
            (*_32K, 3200000, 9891, 724.56, 4430.14, 359648.08, 359424.54, 445.58, 462.54, 130.0),
            (*_4K, 1997942, 99783, 407.05, 5153.42, 197625.03, 196621.85, 254.61, 272.93, 1304.0),
            (*_2K, 998175, 50000, 175.66, 5967.13, 86908.30, 86575.09, 301.73, 334.17, 1722.0),
            (*_128, 127698, 4000, 26.79, 4916.63, 19451.46, 19150.52, 233.35, 238.61, 618.0),
        ],
    ),
    *_rows(
        "qwen3-32b",
        "h100",
        [
            (*_32K, 3200000, 7681, 1157.25, 2771.81, 585981.22, 582757.65, 43.42, 43.36, 24.0),
            (*_4K, 1997942, 99790, 976.29, 2148.69, 482284.21, 483375.28, 66.61, 62.08, 186.0),
            (*_2K, 998175, 50000, 328.04, 3195.30, 163909.40, 164148.38, 86.62, 84.24, 359.0),
            (*_128, 127698, 4000, 32.88, 4005.62, 21648.67, 21342.36, 1169.72, 1292.78, 522.0),
        ],
    ),
    *_rows(
        "qwen3-32b",
        "a100-80g",
        [
            (*_32K, 3200000, 7699, 1783.59, 1798.45, 890711.38, 892708.86, 67.87, 67.32, 21.0),
            (*_4K, 1997942, 99893, 1141.94, 1837.08, 566579.70, 564705.97, 96.19, 96.40, 180.0),
            (*_2K, 998175, 50000, 415.71, 2521.38, 208397.03, 209108.79, 143.23, 143.96, 381.0),
            (*_128, 127698, 4000, 49.57, 2656.71, 31177.64, 31073.76, 528.57, 544.55, 200.0),
        ],
    ),
    *_rows(
        "gpt-oss-20b",
        "h100",
        [  # this page prints no peak output throughput for these runs
            (*_32K, 3200000, 9350, 107.95, 29730.30, 53687.69, 53539.25, 239.44, 273.86, NA),
            (*_4K, 1999249, 52309, 61.73, 33236.17, 31245.12, 30820.97, 184.26, 225.55, NA),
            (*_2K, 999120, 47022, 32.58, 32113.65, 16515.86, 16363.96, 149.76, 159.20, NA),
            (*_128, 127755, 4000, 4.70, 28032.23, 3174.14, 2892.24, 178.91, 208.03, NA),
        ],
    ),
    *_rows(
        "gpt-oss-20b",
        "a100-80g",
        [
            (*_32K, 3200000, 9533, 440.85, 7280.33, 219739.77, 219663.48, 268.03, 278.17, 203.0),
            (*_4K, 1999249, 53530, 128.79, 15938.87, 62947.13, 61941.78, 123.35, 129.79, 1983.0),
            (*_2K, 999120, 47224, 58.06, 18021.34, 31669.55, 32083.12, 100.32, 119.20, 4701.0),
            (*_128, 127755, 4000, 5.44, 24223.22, 2774.46, 1971.28, 62.10, 65.44, 932.0),
        ],
    ),
    *_rows(  # vllm serve openai/gpt-oss-120b --max-model-len 32768, vLLM v0.10.2
        "gpt-oss-120b",
        "h100",
        [  # this page prints no peak output throughput for these runs
            (*_32K, 3200000, 9877, 198.92, 16136.57, 99444.04, 99439.56, 23.99, 23.69, NA),
            (*_4K, 1999249, 67205, 145.04, 14247.47, 72954.68, 73023.24, 31.70, 32.02, NA),
            (*_2K, 999120, 49197, 72.87, 14385.69, 36234.76, 35662.58, 41.35, 42.86, NA),
            (*_128, 127755, 4000, 7.72, 17059.15, 4850.46, 4987.41, 304.80, 341.94, NA),
        ],
        max_model_len=32768,
        vllm="0.10.2",
    ),
    *_rows(  # vllm serve openai/gpt-oss-120b --max-model-len 32768 on one of the 2 GPUs
        "gpt-oss-120b",
        "a100-80g",
        [
            (*_32K, 3200000, 9988, 740.10, 4337.21, 368856.64, 368713.30, 224.58, 228.19, 176.0),
            (*_4K, 1999249, 67259, 269.39, 7671.00, 133561.13, 134006.62, 112.18, 114.77, 1146.0),
            (*_2K, 999120, 48981, 123.94, 8456.65, 61328.02, 61764.97, 131.94, 138.30, 1696.0),
            (*_128, 127755, 4000, 14.09, 9353.12, 7813.18, 7750.58, 182.75, 189.53, 273.0),
        ],
        max_model_len=32768,
    ),
)


def spread(total: int, n: int) -> list[int]:
    """``total`` tokens over ``n`` requests as evenly as whole tokens allow (the first
    ``total mod n`` get one more)."""
    if n < 1 or total < n:
        raise ValueError(f"cannot spread {total} tokens over {n} requests (each needs one)")
    q, r = divmod(total, n)
    return [q + 1] * r + [q] * (n - r)


def workload(row: Published) -> Any:
    """The case's requests: ``num_prompts`` unique random prompts, all sent at t=0, with the
    page's input and generated token totals."""
    from slotune.workloads.trace import Trace, TraceRequest

    ins = spread(row.total_input, row.num_prompts)
    outs = spread(row.total_output, row.num_prompts)
    reqs = tuple(
        TraceRequest(request_id=f"r{i}", prompt_len=p, output_len=o, arrival_time=0.0)
        for i, (p, o) in enumerate(zip(ins, outs, strict=True))
    )
    return Trace(name=f"{row.model}-{row.case}", requests=reqs, seed=42)


def model_spec(name: str) -> Any:
    """A Qwen3 model from its config facts (``QWEN3_CONFIGS``), else the catalogue's."""
    from slotune.engine.sim.models import get_model, model_from_hf_dict

    if name in QWEN3_CONFIGS:
        return model_from_hf_dict(QWEN3_CONFIGS[name], name)
    return get_model(name)


def write_configs(folder: Path) -> dict[str, str]:
    """Each Qwen3 model's config.json under ``folder``/name and each catalogue model's
    name: what the simulator reads, by model."""
    paths = {}
    for name, data in QWEN3_CONFIGS.items():
        (folder / name).mkdir(parents=True, exist_ok=True)
        path = folder / name / "config.json"
        path.write_text(json.dumps(data))
        paths[name] = str(path)
    return paths | {r.model: r.model for r in PUBLISHED if r.model not in QWEN3_CONFIGS}


def engine_config(row: Published) -> Any:
    """vLLM V1's serving defaults on the case's GPU (``targets.vllm.VLLM_0_15``); the
    context is the serving command's ``--max-model-len``, else the model's (vLLM's default)."""
    from slotune.engine.sim.hardware import get_gpu
    from slotune.targets.vllm import VLLM_0_15

    context = row.max_model_len or model_spec(row.model).max_position_embeddings
    return VLLM_0_15.defaults(get_gpu(row.gpu), max_model_len=context)


def simulate(row: Published, model_path: str, stack: str = STACK) -> dict[str, float]:
    """The case on the simulator: the metrics ``vllm bench serve`` prints, in its units."""
    from slotune.workloads.arrivals import ArrivalSpec
    from slotune.workloads.metrics import request_metrics
    from slotune.workloads.runner.engine_loop import run_simulated

    trace = workload(row)
    t0 = time.perf_counter()
    result = run_simulated(
        engine_config(row),
        trace,
        gpu=row.gpu,
        model=model_path,
        tp=row.tp,
        stack=stack,
        arrivals=ArrivalSpec(timestamps=True),
    )
    wall = time.perf_counter() - t0
    m = request_metrics(result)
    ok = m["ok"]
    if not ok.all():
        raise RuntimeError(f"{row.label}: {int((~ok).sum())} simulated requests failed")
    duration = float(np.max(m["e2e"]))  # every request is sent at t=0
    tokens = row.total_input + float(m["output_tokens"].sum())
    stats = result.engine_stats
    return {
        "duration_s": duration,
        "total_tps": tokens / duration,
        "ttft_mean_ms": float(np.mean(m["ttft"])) * 1e3,
        "ttft_median_ms": float(np.median(m["ttft"])) * 1e3,
        "tpot_mean_ms": float(np.nanmean(m["tpot"])) * 1e3,
        "tpot_median_ms": float(np.nanmedian(m["tpot"])) * 1e3,
        "peak_output_tps": peak_output_tps(result.requests["token_times"]),
        "kv_pool_tokens": float(stats["num_total_blocks"] * engine_config(row).block_size),
        "preemptions": float(stats["num_preemptions"]),
        "max_running": float(result.steps["num_running"].max()),
        "sim_wall_s": wall,
    }


def peak_output_tps(token_times: Any) -> float:
    """``vllm bench serve``'s peak output throughput: the most tokens that reach the client
    within one whole second counted from the first send (t=0)."""
    from slotune.workloads.metrics import flat_token_times

    times, _ = flat_token_times(token_times)
    return float(np.bincount(times.astype(np.int64)).max()) if times.size else 0.0


METRICS = (
    ("ttft_mean_ms", "mean TTFT (s)", 1e-3),
    ("ttft_median_ms", "median TTFT (s)", 1e-3),
    ("tpot_mean_ms", "mean TPOT (ms)", 1.0),
    ("tpot_median_ms", "median TPOT (ms)", 1.0),
    ("total_tps", "total tok/s", 1.0),
    ("duration_s", "duration (s)", 1.0),
)


def error(sim: float, meas: float) -> float:
    return sim / meas - 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--only", action="append", default=[], help="cases whose label contains this")
    ap.add_argument("--json", type=Path, default=None, help="write the rows here")
    ap.add_argument("--stack", default=STACK, help=f"stack profile (default {STACK})")
    args = ap.parse_args()
    rows = [r for r in PUBLISHED if not args.only or any(o in r.label for o in args.only)]
    if not rows:
        print(f"no case matches {args.only}", file=sys.stderr)
        return 2
    out: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        paths = write_configs(Path(tmp))
        for row in rows:
            sim = simulate(row, paths[row.model], args.stack)
            print(f"{row.label}: simulated in {sim['sim_wall_s']:.1f} s", file=sys.stderr)
            out.append({"published": asdict(row), "label": row.label, "simulated": sim})
    print(report(out))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


def _num(x: float) -> str:
    return "n/a" if np.isnan(x) else f"{x:.0f}"


def _val(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.4g}"


def report(out: list[dict[str, Any]]) -> str:
    lines = [
        "| case | " + " | ".join(f"{name} meas / sim (err)" for _, name, _ in METRICS) + " |",
        "|---|" + "---:|" * len(METRICS),
    ]
    errs: dict[str, list[tuple[float, str]]] = {key: [] for key, _, _ in METRICS}
    for o in out:
        pub, sim = o["published"], o["simulated"]
        cells = []
        for key, _, scale in METRICS:
            e = error(sim[key], pub[key])
            errs[key].append((e, o["label"]))
            cells.append(f"{_val(pub[key] * scale)} / {_val(sim[key] * scale)} ({e * 100:+.0f} %)")
        lines.append(f"| {o['label']} | " + " | ".join(cells) + " |")
    groups = {
        "all": lambda label: True,
        "H100": lambda label: "-h100 " in label,
        "A100": lambda label: "-a100 " in label,
        "Qwen3": lambda label: not label.startswith("gpt-oss"),
        "gpt-oss": lambda label: label.startswith("gpt-oss"),
    }
    lines += [
        "",
        "Median absolute error over the cases of each group, and the worst case:",
        "",
        "| metric | " + " | ".join(groups) + " | worst (case) |",
        "|---|" + "---:|" * len(groups) + "---|",
    ]
    for key, name, _ in METRICS:
        meds = []
        for keep in groups.values():
            sel = [abs(e) for e, label in errs[key] if keep(label)]
            meds.append(f"{float(np.median(sel)) * 100:.1f} %" if sel else "")
        worst = max(errs[key], key=lambda x: abs(x[0]))
        lines.append(
            f"| {name} | " + " | ".join(meds) + f" | {worst[0] * 100:+.0f} % ({worst[1]}) |"
        )
    lines += [
        "",
        "| case | peak output tok/s meas / sim | simulated KV pool (tokens) "
        "| simulated preemptions | simulated most running | simulation wall (s) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for o in out:
        pub, sim = o["published"], o["simulated"]
        lines.append(
            f"| {o['label']} | {_num(pub['peak_output_tps'])} / {sim['peak_output_tps']:.0f} | "
            f"{sim['kv_pool_tokens']:.0f} | {sim['preemptions']:.0f} | "
            f"{sim['max_running']:.0f} | {sim['sim_wall_s']:.1f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
