"""Export: the measured configuration exactly, for the study's target, or a refusal."""

from __future__ import annotations

import json

import pytest
import yaml

from slotune.engine.config import EngineConfig
from slotune.engine.sim.capacity import determine_capacity, kv_block_bytes
from slotune.engine.sim.models import get_model
from slotune.engine.sim.profile import load_profile
from slotune.targets import ExportRefused, Launch
from slotune.targets.flags import sglang_mem_fraction
from slotune.tuner.export import export


def best(target: str = "vllm==0.34", **config) -> dict:
    cfg = EngineConfig(max_model_len=2048, **config)
    return {
        "config": cfg.to_dict(),
        "model": "llama-3-8b",
        "tp": 1,
        "gpu": "h100",
        "target": target,
    }


def words(text: str) -> list[str]:
    return text.split()


def flag(text: str, name: str) -> str | None:
    w = words(text)
    return w[w.index(name) + 1] if name in w else None


def test_vllm_command_is_exactly_the_config() -> None:
    text = export(
        best(
            max_num_batched_tokens=4096,
            long_prefill_token_threshold=512,
            block_size=32,
            max_num_seqs=128,
            prefix_caching="none",
            kv_cache_dtype="fp8",
            num_gpu_blocks=900,
        )
    )
    assert "#" not in text and "\n" not in text
    assert text.startswith("vllm serve meta-llama/Meta-Llama-3-8B-Instruct ")
    assert flag(text, "--max-num-batched-tokens") == "4096"
    assert flag(text, "--long-prefill-token-threshold") == "512"
    assert flag(text, "--block-size") == "32"
    assert flag(text, "--max-num-seqs") == "128"
    assert flag(text, "--kv-cache-dtype") == "fp8"
    assert flag(text, "--gpu-memory-utilization") == "0.9"
    assert flag(text, "--num-gpu-blocks-override") == "900"  # blocks of the exported 32
    assert "--no-enable-prefix-caching" in words(text)


def test_sglang_command_meanings() -> None:
    b = best("sglang", max_num_batched_tokens=4096, block_size=32, max_num_seqs=128)
    text = export({**b, "config": {**b["config"], "prefix_caching": "radix"}})
    assert text.startswith("python -m sglang.launch_server --model-path ")
    # the budget caps the whole step's prefill: chunk size and prefill tokens alike
    assert flag(text, "--chunked-prefill-size") == flag(text, "--max-prefill-tokens") == "4096"
    assert flag(text, "--page-size") == "32" and flag(text, "--max-running-requests") == "128"
    assert "--enable-mixed-chunk" in words(text) and "--disable-radix-cache" not in words(text)
    frac = float(flag(text, "--mem-fraction-static") or 0)
    assert 0.5 < frac < 0.9  # weights + pool only, below gpu_memory_utilization's 0.9


def test_sglang_prefill_first_and_pool() -> None:
    b = best("sglang", policy="prefill_first", max_num_batched_tokens=4096, block_size=16)
    b["config"]["prefix_caching"] = "none"
    b["config"]["num_gpu_blocks"] = 1000
    text = export(b)
    assert flag(text, "--chunked-prefill-size") == "-1"
    assert flag(text, "--max-total-tokens") == "16000"
    assert "--disable-radix-cache" in words(text) and "--enable-mixed-chunk" not in words(text)


def test_sglang_mem_fraction_is_weights_plus_the_simulated_pool() -> None:
    config = EngineConfig(max_model_len=2048, block_size=1, prefix_caching="radix")
    profile, model = load_profile("h100"), get_model("llama-3-8b")
    blocks = determine_capacity(profile, model, 1, config).num_gpu_blocks
    used = model.weight_bytes_per_gpu(1) + blocks * kv_block_bytes(model, 1, 1)
    frac = sglang_mem_fraction(config, Launch("m", gpu="h100", model="llama-3-8b"))
    assert frac <= used / profile.gpu.memory_bytes < frac + 0.001
    with pytest.raises(ExportRefused, match="names none"):
        sglang_mem_fraction(config, Launch("m"))


def test_tensor_and_expert_parallel_flags() -> None:
    b = {**best(), "model": "mixtral-8x7b", "tp": 4, "ep": 4}
    assert "--tensor-parallel-size 4 --enable-expert-parallel" in export(b)
    with pytest.raises(ExportRefused, match="EP = TP = 4"):
        export({**b, "ep": 2})
    b["config"]["prefix_caching"] = "radix"
    s = export({**b, "target": "sglang", "ep": 2})
    assert "--tp-size 4 --ep-size 2" in s


def test_formats_pick_the_engine_and_refuse_what_it_cannot_run() -> None:
    b = best()  # vLLM defaults-like: hash prefix caching
    assert export(b, "vllm") == export(b)
    with pytest.raises(ExportRefused, match=r"sglang==0\.5\.23 does not run prefix_caching=hash"):
        export(b, "sglang")
    assert export(b, "vllm", target="vllm==0.15").startswith("vllm serve")
    with pytest.raises(ValueError, match="name different engines"):
        export(b, "sglang", target="vllm")
    with pytest.raises(ValueError, match="unknown export format"):
        export(b, "trt")


def test_a_best_json_without_target_is_slotunes_engine() -> None:
    b = best(block_size=256, preemption_mode="swap")
    del b["target"]
    assert export(b).startswith("slotune serve --model ")
    with pytest.raises(ExportRefused, match="does not run block_size=256"):
        export(b, "vllm")


def test_json_is_the_engine_config_and_yaml_a_vllm_config_file() -> None:
    b = best(max_num_seqs=77, prefix_caching="none")
    assert EngineConfig.from_dict(json.loads(export(b, "json"))) == EngineConfig.from_dict(
        b["config"]
    )
    text = export(b, "yaml")
    assert text.startswith("# vllm serve meta-llama/Meta-Llama-3-8B-Instruct --config")
    data = yaml.safe_load(text)
    assert data["max-num-seqs"] == 77 and data["no-enable-prefix-caching"] is True
    assert data["gpu-memory-utilization"] == 0.9
    with pytest.raises(ExportRefused, match="vllm serve --config"):
        export(best("sglang", prefix_caching="radix"), "yaml")


@pytest.mark.parametrize(
    ("target", "kv", "value"),
    [
        ("vllm==0.34", "fp8", "fp8"),
        ("vllm==0.34", "int8", "int8_per_token_head"),
        ("vllm==0.34", "int4", "int4_per_token_head"),
        ("vllm==0.15", "fp8", "fp8"),
        ("sglang", "fp8", "fp8_e4m3"),
    ],
)
def test_kv_cache_dtype(target: str, kv: str, value: str) -> None:
    b = best(target, kv_cache_dtype=kv)
    if target == "sglang":
        b["config"]["prefix_caching"] = "radix"
    assert flag(export(b), "--kv-cache-dtype") == value
    assert "--kv-cache-dtype" not in export(best(target, prefix_caching="none"))


@pytest.mark.parametrize(
    ("target", "quantization", "value"),
    [
        ("vllm==0.34", "fp8", "fp8_per_tensor"),
        ("vllm==0.15", "fp8", "fp8"),
        ("sglang", "fp8", "fp8"),
    ],
)
def test_online_fp8_weights(target: str, quantization: str, value: str) -> None:
    b = {**best(target, prefix_caching="none"), "quantization": quantization}
    assert flag(export(b), "--quantization") == value


@pytest.mark.parametrize("target", ["vllm==0.34", "vllm==0.15", "sglang"])
@pytest.mark.parametrize("quantization", ["int4", "awq", "int8", "w8a8_int8"])
def test_prequantized_weights_need_the_checkpoint(target: str, quantization: str) -> None:
    b = {**best(target, prefix_caching="none"), "quantization": quantization}
    with pytest.raises(ExportRefused, match="give it with --served-model PATH_OR_ID"):
        export(b)
    text = export(b, served_model="org/model-AWQ")
    assert "--quantization" not in text  # the engine reads quant_method from the checkpoint
    assert "org/model-AWQ" in words(text)


def test_a_local_checkpoint_must_hold_the_measured_kind(tmp_path) -> None:
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "llama", "quantization_config": {"quant_method": "awq"}})
    )
    b = {**best(prefix_caching="none"), "quantization": "int4"}
    assert "--quantization" not in export(b, served_model=str(tmp_path))
    with pytest.raises(ExportRefused, match="holds awq weights"):
        export({**b, "quantization": "fp8"}, served_model=str(tmp_path))
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "llama", "quantization_config": {"quant_method": "bitsandbytes"}})
    )
    with pytest.raises(ExportRefused, match="holds bitsandbytes weights"):
        export(b, served_model=str(tmp_path))


def test_slotune_engine_serves_16_bit_weights_only() -> None:
    b = {**best("slotune"), "quantization": "fp8"}
    with pytest.raises(ExportRefused, match="does not serve fp8 weights"):
        export(b)


def test_engine_args_are_the_flags_without_the_launch_head() -> None:
    from slotune.tuner.export import engine_args

    config = EngineConfig(max_model_len=2048, max_num_seqs=64, prefix_caching="none")
    flags, comments = engine_args(config, "vllm", "int4")  # the user's checkpoint: no refusal
    assert comments == [] and flags[:2] == ["--max-num-batched-tokens", "2048"]
    assert "vllm" not in flags and "--no-enable-prefix-caching" in flags
    with pytest.raises(ExportRefused, match="names none"):
        engine_args(config, "sglang")  # SGLang's memory fraction needs the simulated GPU
    flags, _ = engine_args(config, "sglang", gpu="h100", model="llama-3-8b")
    assert flags[0] == "--chunked-prefill-size" and "--disable-radix-cache" in flags


def test_sglang_serves_a_gptq_checkpoint_as_gptq_marlin(tmp_path) -> None:
    """SGLang registers gptq_marlin only on CUDA: a GPTQ checkpoint needs it named."""
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "llama", "quantization_config": {"quant_method": "gptq"}})
    )
    b = {**best("sglang", prefix_caching="none"), "quantization": "int4"}
    assert flag(export(b, served_model=str(tmp_path)), "--quantization") == "gptq_marlin"
    assert "--quantization" not in export({**b, "target": "vllm"}, served_model=str(tmp_path))


@pytest.mark.parametrize("target", ["vllm", "sglang"])
def test_speculation_off_adds_no_flag(target: str) -> None:
    assert "speculative" not in export(best(target, prefix_caching="none"))


def test_vllm_speculative_config_is_ngram_json() -> None:
    from slotune.tuner.export import engine_args

    config = EngineConfig(num_speculative_tokens=4, prompt_lookup_min=2, prompt_lookup_max=3)
    args, _ = engine_args(config, "vllm")
    spec = json.loads(args[args.index("--speculative-config") + 1])
    assert spec == {
        "method": "ngram",
        "num_speculative_tokens": 4,
        "prompt_lookup_max": 3,
        "prompt_lookup_min": 2,
    }


def test_sglang_refuses_prompt_lookup_speculation() -> None:
    b = best("sglang", prefix_caching="none", num_speculative_tokens=4)
    with pytest.raises(ExportRefused, match=r"not\s+by prompt lookup"):
        export(b)


def test_scheduling_policies_export_where_the_target_runs_them() -> None:
    vllm = export(best("vllm", scheduling_policy="priority"))
    assert "--scheduling-policy priority" in vllm
    sglang = export(best("sglang", prefix_caching="none", scheduling_policy="priority"))
    assert "--enable-priority-scheduling --schedule-low-priority-values-first" in sglang
    for refused in (
        {"preemption_mode": "hybrid"},
        {"top_tier_kv_share": 0.3},
        {"top_tier_token_share": 0.3},
        {"decode_budget_ms": 50.0},
    ):
        with pytest.raises(ExportRefused, match="does not run"):
            export(best("vllm", **refused))
    embedded = export(best("slotune", preemption_mode="hybrid", decode_budget_ms=50.0))
    assert "--preemption-mode hybrid" in embedded and "--decode-budget-ms 50.0" in embedded
