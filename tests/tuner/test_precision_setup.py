"""The model's precision and expert parallelism are given to a study: stored in its setup,
used by every trial's simulation, and carried into the exported launch commands."""

from __future__ import annotations

from slotune.targets import Launch, get_target
from slotune.tuner.evaluate import Evaluator
from slotune.tuner.export import command_line
from slotune.tuner.prepare import TuneOptions, prepare


def _prepared(**kw: object) -> object:
    options = TuneOptions(
        gpu="h100",
        model="mixtral-8x7b",
        tp=2,
        slo="ttft=2s,tpot=100ms",
        rate=2.0,
        num_requests=12,
        **kw,  # type: ignore[arg-type]
    )
    return prepare(options)


def test_quantization_and_ep_reach_the_trials_and_the_export() -> None:
    plain, fp8 = _prepared(), _prepared(quantization="fp8", ep=2)
    assert (fp8.setup.quantization, fp8.setup.ep) == ("fp8", 2)  # type: ignore[attr-defined]
    assert "kv_cache_dtype" in fp8.space.free_names  # type: ignore[attr-defined]
    config = fp8.space.config_from_params(fp8.space.grid()[0])  # type: ignore[attr-defined]
    durations = [
        Evaluator(p.setup, p.trace).run(config).duration_s  # type: ignore[attr-defined]
        for p in (plain, fp8)
    ]
    assert durations[1] < durations[0]
    launch = Launch("m", gpu="h100", model="mixtral-8x7b", tp=2, quantization="fp8", ep=2)
    vllm = command_line(config, get_target(fp8.setup.target), launch)  # type: ignore[attr-defined]
    assert "--quantization fp8_per_tensor" in vllm and "--enable-expert-parallel" in vllm
    sgl = config.__class__(**{**config.to_dict(), "prefix_caching": "radix"})
    assert "--ep-size 2" in command_line(sgl, get_target("sglang"), launch)
