"""A small, realistic ``slotune tune`` output folder written from synthetic data.

The report tests and ``benchmarks/report_build.py`` use this instead of running the tuner:
an Optuna SQLite study made with ``create_trial`` (user attrs ``metrics``/``config``/
``feasible``, constraints in system attrs), ``trials.csv``, ``best.json`` and the stored
runs of the recommended and the baseline configuration.
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pandas as pd
from optuna.distributions import CategoricalDistribution, IntDistribution
from optuna.trial import TrialState

from slotune.reports.columns import REQUEST_COLUMNS, STEP_COLUMNS

SLO_TTFT_MS = 300.0
SLO_TPOT_MS = 50.0
STUDY_NAME = "slotune-test"
HF_MODEL = "meta-llama/Meta-Llama-3-8B-Instruct"

DISTRIBUTIONS = {
    "max_num_batched_tokens": IntDistribution(256, 16384, log=True),
    "long_prefill_token_threshold": CategoricalDistribution([0, 256, 512, 1024, 2048]),
    "block_size": CategoricalDistribution([16, 32]),
    "max_num_seqs": IntDistribution(16, 512, log=True),
    "prefix_caching": CategoricalDistribution(["none", "hash", "radix"]),
    "preemption_mode": CategoricalDistribution(["recompute", "swap"]),
}
DEFAULT_CONFIG: dict[str, Any] = {
    "max_num_batched_tokens": 2048,
    "long_prefill_token_threshold": 0,
    "block_size": 16,
    "max_num_seqs": 256,
    "max_model_len": 8192,
    "preemption_mode": "recompute",
    "swap_space_gb": 4.0,
    "prefix_caching": "hash",
    "policy": "chunked",
    "gpu_memory_utilization": 0.9,
    "num_gpu_blocks": None,
}


def _pcts(values: np.ndarray) -> dict[str, float]:
    values = values[np.isfinite(values)]
    if values.size == 0:
        return {
            "mean": math.nan,
            "p50": math.nan,
            "p90": math.nan,
            "p95": math.nan,
            "p99": math.nan,
        }
    return {
        "mean": float(values.mean()),
        **{f"p{q}": float(np.percentile(values, q)) for q in (50, 90, 95, 99)},
    }


def _trial_outcome(params: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    budget = params["max_num_batched_tokens"]
    seqs = params["max_num_seqs"]
    ttft_p99 = 120 + 2.2e5 / budget + 0.15 * seqs + rng.normal(0, 15)
    tpot_p99 = 18 + budget / 350 + 0.03 * seqs + rng.normal(0, 2)
    cache_bonus = {"none": 0.0, "hash": 0.6, "radix": 0.7}[params["prefix_caching"]]
    attainment = float(np.clip(1.1 - ttft_p99 / 1500 - tpot_p99 / 250, 0, 1))
    goodput = max(0.0, 6.0 * attainment + cache_bonus + rng.normal(0, 0.1))
    return {
        "num_requests": 400,
        "completed": 400,
        "failed": 0,
        "goodput": goodput,
        "slo_attainment": attainment,
        "request_throughput": 6.5,
        "ttft_ms": {
            "mean": ttft_p99 / 3,
            "p50": ttft_p99 / 3,
            "p90": ttft_p99 / 1.5,
            "p95": ttft_p99 / 1.2,
            "p99": ttft_p99,
        },
        "tpot_ms": {
            "mean": tpot_p99 / 2,
            "p50": tpot_p99 / 2,
            "p90": tpot_p99 / 1.4,
            "p95": tpot_p99 / 1.2,
            "p99": tpot_p99,
        },
        "num_preemptions": int(rng.integers(0, 20)),
        "prefix_cache_hit_rate": 0.1 if params["prefix_caching"] == "none" else 0.55,
    }


def write_study(path: Path, n_trials: int, objective: str, seed: int = 0) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = f"sqlite:///{path}"
    if objective == "pareto":
        study = optuna.create_study(
            study_name=STUDY_NAME, storage=storage, directions=["maximize", "minimize"]
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(["goodput", "ttft_p99_ms"])
    else:
        study = optuna.create_study(study_name=STUDY_NAME, storage=storage, direction="maximize")
    rng = np.random.default_rng(seed)
    trials = []
    for i in range(n_trials):
        params = {name: _sample(dist, rng) for name, dist in DISTRIBUTIONS.items()}
        metrics = _trial_outcome(params, rng)
        constraints = [
            metrics["ttft_ms"]["p99"] - SLO_TTFT_MS,
            metrics["tpot_ms"]["p99"] - SLO_TPOT_MS,
        ]
        state = TrialState.COMPLETE
        if i % 17 == 16:
            state = TrialState.FAIL
        elif i % 13 == 12:
            state = TrialState.PRUNED
        values = None
        if state == TrialState.COMPLETE:
            if objective == "pareto":
                values = [metrics["goodput"], metrics["ttft_ms"]["p99"]]
            else:
                values = [metrics["goodput"]]
        trials.append(
            optuna.trial.create_trial(
                state=state,
                values=values,
                params=params,
                distributions=DISTRIBUTIONS,
                user_attrs={
                    "metrics": metrics,
                    "config": {**DEFAULT_CONFIG, **params},
                    "feasible": all(c <= 0 for c in constraints),
                },
                system_attrs={"constraints": constraints},
            )
        )
    study.add_trials(trials)
    return study


def _sample(dist: Any, rng: np.random.Generator) -> Any:
    if isinstance(dist, CategoricalDistribution):
        return dist.choices[int(rng.integers(len(dist.choices)))]
    low, high = math.log(dist.low), math.log(dist.high)
    return round(math.exp(rng.uniform(low, high)))


def write_run(
    run_dir: Path,
    *,
    n_requests: int = 300,
    ttft_scale_ms: float = 90.0,
    tpot_ms: float = 25.0,
    budget: int = 2048,
    seed: int = 0,
) -> dict[str, Any]:
    """Write summary.json, requests.csv and steps.csv of one synthetic run; return the summary."""
    rng = np.random.default_rng(seed)
    run_dir.mkdir(parents=True, exist_ok=True)
    arrivals = np.cumsum(rng.exponential(0.15, n_requests))
    prompts = rng.integers(64, 3000, n_requests)
    outputs = rng.integers(2, 200, n_requests)
    ttft = rng.lognormal(math.log(ttft_scale_ms), 0.6, n_requests) / 1000
    rows = []
    for i in range(n_requests):
        first = arrivals[i] + ttft[i]
        gaps = rng.gamma(4.0, tpot_ms / 4000.0, outputs[i] - 1)
        times = np.concatenate([[first], first + np.cumsum(gaps)])
        error = "timeout" if i == 5 else ""
        rows.append(
            {
                REQUEST_COLUMNS["request_id"]: f"req-{i}",
                REQUEST_COLUMNS["arrival"]: round(float(arrivals[i]), 6),
                REQUEST_COLUMNS["first_token"]: round(float(first), 6),
                REQUEST_COLUMNS["token_times"]: json.dumps([round(float(t), 6) for t in times]),
                REQUEST_COLUMNS["finish"]: round(float(times[-1]), 6),
                REQUEST_COLUMNS["prompt_tokens"]: int(prompts[i]),
                REQUEST_COLUMNS["output_tokens"]: int(outputs[i]),
                REQUEST_COLUMNS["cached_tokens"]: int(prompts[i] * rng.uniform(0, 0.8)),
                REQUEST_COLUMNS["preemptions"]: int(rng.random() < 0.02),
                REQUEST_COLUMNS["error"]: error,
            }
        )
    requests = pd.DataFrame(rows)
    requests.to_csv(run_dir / "requests.csv", index=False)
    horizon = float(requests[REQUEST_COLUMNS["finish"]].max())
    n_steps = int(horizon / 0.03)
    durations = rng.uniform(0.02, 0.04, n_steps)
    times = np.cumsum(durations)
    decode = rng.integers(10, 200, n_steps)
    prefill = np.minimum(rng.integers(0, budget, n_steps), budget - decode)
    prefill = np.clip(prefill, 0, None)
    steps = pd.DataFrame(
        {
            STEP_COLUMNS["time"]: times,
            STEP_COLUMNS["scheduled"]: prefill + decode,
            STEP_COLUMNS["prefill"]: prefill,
            STEP_COLUMNS["decode"]: decode,
            STEP_COLUMNS["running"]: rng.integers(5, 60, n_steps),
            STEP_COLUMNS["waiting"]: rng.integers(0, 20, n_steps),
            STEP_COLUMNS["kv_usage"]: np.clip(0.5 + 0.3 * np.sin(times / 7), 0, 1),
            STEP_COLUMNS["step_time"]: durations,
            STEP_COLUMNS["preempted"]: (rng.random(n_steps) < 0.005).astype(int),
            STEP_COLUMNS["decode_context"]: decode * rng.integers(200, 2000, n_steps),
            STEP_COLUMNS["prefill_context"]: prefill
            + (prefill > 0) * rng.integers(0, 1024, n_steps),
        }
    )
    steps.to_csv(run_dir / "steps.csv", index=False)
    ok = requests[REQUEST_COLUMNS["error"]].fillna("") == ""
    ttft_ms = ttft[ok.to_numpy()] * 1000
    e2el = (requests[REQUEST_COLUMNS["finish"]] - requests[REQUEST_COLUMNS["arrival"]])[ok]
    tpot = (e2el.to_numpy() * 1000 - ttft_ms) / (outputs[ok.to_numpy()] - 1)
    met = (ttft_ms <= SLO_TTFT_MS) & (tpot <= SLO_TPOT_MS)
    duration = horizon - float(arrivals[0])
    summary = {
        "num_requests": n_requests,
        "completed": int(ok.sum()),
        "failed": int((~ok).sum()),
        "duration_s": duration,
        "request_throughput": float(ok.sum() / duration),
        "output_throughput": float(outputs[ok.to_numpy()].sum() / duration),
        "ttft_ms": _pcts(ttft_ms),
        "tpot_ms": _pcts(tpot),
        "itl_ms": _pcts(np.full(3, tpot_ms)),
        "e2el_ms": _pcts(e2el.to_numpy() * 1000),
        "slo": f"ttft={SLO_TTFT_MS:g}ms,tpot={SLO_TPOT_MS:g}ms",
        "slo_attainment": float(met.sum() / n_requests),
        "goodput": float(met.sum() / duration),
        "num_preemptions": int(requests[REQUEST_COLUMNS["preemptions"]].sum()),
        "prefix_cache_hit_rate": float(
            requests[REQUEST_COLUMNS["cached_tokens"]].sum()
            / requests[REQUEST_COLUMNS["prompt_tokens"]].sum()
        ),
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def write_out_dir(
    out: Path, *, n_trials: int = 40, objective: str = "goodput", n_requests: int = 300
) -> dict[str, Any]:
    """Write a whole tune output folder; return the best.json it wrote."""
    out.mkdir(parents=True, exist_ok=True)
    study = write_study(out / "study.db", n_trials, objective)
    study.trials_dataframe().to_csv(out / "trials.csv", index=False)
    feasible = [
        t for t in study.trials if t.state == TrialState.COMPLETE and t.user_attrs["feasible"]
    ]
    best_trial = max(feasible, key=lambda t: t.values[0])
    config = best_trial.user_attrs["config"]
    best_metrics = write_run(
        out / "runs" / "best",
        n_requests=n_requests,
        ttft_scale_ms=80,
        tpot_ms=22,
        budget=config["max_num_batched_tokens"],
        seed=1,
    )
    base_metrics = write_run(
        out / "runs" / "baseline",
        n_requests=n_requests,
        ttft_scale_ms=160,
        tpot_ms=34,
        budget=DEFAULT_CONFIG["max_num_batched_tokens"],
        seed=2,
    )
    flags = " ".join(
        f"--{k.replace('_', '-')} {v}"
        for k, v in config.items()
        if k in ("max_num_batched_tokens", "max_num_seqs", "block_size")
    )
    best = {
        "config": config,
        "metrics": best_metrics,
        "objective": objective,
        "objective_value": best_trial.values[0],
        "metric_names": ["goodput", "ttft_p99_ms"] if objective == "pareto" else ["goodput"],
        "directions": ["maximize", "minimize"] if objective == "pareto" else ["maximize"],
        "trial": best_trial.number,
        "feasible": True,
        "goodput_rps": 12.5,
        "score": 0.61,
        "load": {"rate": 6.0, "description": "Poisson at 6 req/s"},
        "attainment_target": 0.99,
        "weights": {"ttft": 0.5, "tpot": 0.5},
        "backend": "sim",
        "storage": f"sqlite:///{out / 'study.db'}",
        "notes": ["vLLM accepts block sizes up to 128: 128 is used for the tuned 256"],
        "slo": f"ttft={SLO_TTFT_MS:g}ms,tpot={SLO_TPOT_MS:g}ms",
        "gpu": "h100",
        "model": "llama-3-8b",
        "tp": 1,
        "trace": {
            "name": "sharegpt-mini",
            "stats": {
                "num_requests": n_requests,
                "mean_prompt_tokens": 1500.2,
                "mean_output_tokens": 100.4,
                "prefix_sharing_ratio": 0.4,
            },
        },
        "baseline": {
            "name": "vLLM serving defaults",
            "config": DEFAULT_CONFIG,
            "metrics": base_metrics,
            "goodput_rps": 10.0,
            "score": 0.74,
        },
        "seed": 0,
        "sampler": "tpe",
        "study_name": STUDY_NAME,
        "date": "2026-11-29T12:00:00Z",
        "slotune_version": "0.1.0",
        "commands": {
            "vllm": f"vllm serve {HF_MODEL} {flags} --enable-chunked-prefill",
            "sglang": f"python -m sglang.launch_server --model-path {HF_MODEL} "
            f"--chunked-prefill-size {config['max_num_batched_tokens']}",
        },
    }
    (out / "best.json").write_text(json.dumps(best, indent=2))
    return best
