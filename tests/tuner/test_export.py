"""Export: one mapping table, every format, and a comment wherever a choice is not expressible."""

from __future__ import annotations

import dataclasses
import json

import pytest
import yaml

from slotune.engine.config import EngineConfig
from slotune.tuner.export import FLAGS, engine_args, export


def best(**config) -> dict:
    cfg = EngineConfig(max_model_len=2048, **config)
    return {"config": cfg.to_dict(), "model": "llama-3-8b", "tp": 1}


def test_the_table_covers_every_engine_config_field() -> None:
    assert set(FLAGS) == {f.name for f in dataclasses.fields(EngineConfig)}
    assert all(set(rules) == {"vllm", "sglang"} for rules in FLAGS.values())


def test_vllm_command() -> None:
    text = export(
        best(
            max_num_batched_tokens=4096,
            long_prefill_token_threshold=512,
            block_size=32,
            max_num_seqs=128,
            prefix_caching="none",
        ),
        "vllm",
    )
    assert "#" not in text
    assert text.startswith("vllm serve meta-llama/Meta-Llama-3-8B-Instruct ")
    for piece in (
        "--max-num-batched-tokens 4096",
        "--long-prefill-token-threshold 512",
        "--block-size 32",
        "--max-num-seqs 128",
        "--no-enable-prefix-caching",
        "--gpu-memory-utilization 0.9",
    ):
        assert piece in text


def test_sglang_command() -> None:
    text = export(
        best(max_num_batched_tokens=4096, block_size=32, max_num_seqs=128, prefix_caching="none"),
        "sglang",
    )
    assert text.startswith("python -m sglang.launch_server --model-path ")
    for piece in (
        "--chunked-prefill-size 4096",
        "--page-size 32",
        "--max-running-requests 128",
        "--disable-radix-cache",
        "--enable-mixed-chunk",
        "--mem-fraction-static 0.9",
    ):
        assert piece in text
    assert "#" not in text


def test_tensor_parallel_flags() -> None:
    b = {**best(), "tp": 4}
    assert "--tensor-parallel-size 4" in export(b, "vllm")
    assert "--tp-size 4" in export(b, "sglang")


@pytest.mark.parametrize(
    ("config", "engine", "comment", "flag"),
    [
        ({"preemption_mode": "swap"}, "vllm", "vLLM V1 has no swap preemption", None),
        ({"preemption_mode": "swap"}, "sglang", "SGLang has no swap preemption", None),
        ({"preemption_mode": "hybrid"}, "vllm", "vLLM V1 has no hybrid preemption", None),
        ({"top_tier_kv_share": 0.3}, "vllm", "vLLM reserves no share", None),
        ({"top_tier_token_share": 0.3}, "sglang", "SGLang reserves no share", None),
        ({"decode_budget_ms": 50.0}, "vllm", "vLLM has no decode budget", None),
        (
            {"scheduling_policy": "priority"},
            "sglang",
            "SGLang's priority scheduling preempts",
            "--enable-priority-scheduling --schedule-low-priority-values-first",
        ),
        ({"prefix_caching": "hash"}, "sglang", "SGLang has no hash prefix cache", None),
        (
            {"prefix_caching": "radix"},
            "vllm",
            "vLLM has no radix prefix cache",
            "--enable-prefix-caching",
        ),
        ({"block_size": 256}, "vllm", "vLLM serves block sizes", "--block-size 128"),
        ({"block_size": 8}, "vllm", "vLLM serves block sizes", "--block-size 16"),
        (
            {"policy": "prefill_first", "max_num_batched_tokens": 4096},
            "vllm",
            "never runs prefill-only steps",
            "--no-enable-chunked-prefill",
        ),
        (
            {"long_prefill_token_threshold": 256},
            "sglang",
            "no per-request long-prefill",
            "--chunked-prefill-size 256",
        ),
    ],
)
def test_unsupported_choices_get_a_comment_and_the_nearest_equivalent(
    config: dict, engine: str, comment: str, flag: str | None
) -> None:
    text = export(best(**config), engine)
    comments = [line for line in text.splitlines() if line.startswith("# ")]
    assert any(comment in c for c in comments), text
    command = text.splitlines()[-1]
    assert not command.startswith("#")
    if flag:
        assert flag in command


def test_supported_choices_have_no_comment() -> None:
    args, comments = engine_args(EngineConfig(prefix_caching="radix"), "sglang")
    assert comments == [] and "--disable-radix-cache" not in args
    args, comments = engine_args(EngineConfig(prefix_caching="hash"), "vllm")
    assert comments == [] and "--enable-prefix-caching" in args


def test_json_and_yaml_are_the_engine_config() -> None:
    b = best(max_num_seqs=77, policy="prefill_first", max_num_batched_tokens=2048)
    assert EngineConfig.from_dict(json.loads(export(b, "json"))) == EngineConfig.from_dict(
        b["config"]
    )
    assert EngineConfig.from_dict(yaml.safe_load(export(b, "yaml"))) == EngineConfig.from_dict(
        b["config"]
    )


def test_unknown_format() -> None:
    with pytest.raises(ValueError, match="unknown export format"):
        export(best(), "trt")


NATIVE_PREFIX = {"vllm": "hash", "sglang": "radix"}  # no prefix-cache comment


@pytest.mark.parametrize(
    ("kv", "engine", "flag", "comment"),
    [
        ("auto", "vllm", None, None),
        ("auto", "sglang", None, None),
        ("fp8", "vllm", "--kv-cache-dtype fp8", None),
        ("fp8", "sglang", "--kv-cache-dtype fp8_e4m3", None),
        ("int8", "vllm", "--kv-cache-dtype fp8", "vLLM has no int8 KV cache"),
        ("int8", "sglang", "--kv-cache-dtype fp8_e4m3", "SGLang has no int8 KV cache"),
        ("int4", "vllm", "--kv-cache-dtype fp8", "vLLM has no 4-bit KIVI KV cache"),
        ("int4", "sglang", "--kv-cache-dtype fp8_e4m3", "SGLang has no 4-bit KIVI KV cache"),
    ],
)
def test_kv_cache_dtype(kv: str, engine: str, flag: str | None, comment: str | None) -> None:
    text = export(best(kv_cache_dtype=kv, prefix_caching=NATIVE_PREFIX[engine]), engine)
    *comments, command = text.splitlines()
    if flag is None:
        assert "--kv-cache-dtype" not in command
    else:
        assert flag in command and command.count("--kv-cache-dtype") == 1
    if comment is None:
        assert comments == []
    else:
        assert len(comments) == 1 and comment in comments[0]


@pytest.mark.parametrize(
    ("quantization", "engine", "flag", "comment"),
    [
        (None, "vllm", None, None),
        ("bf16", "sglang", None, None),
        ("fp8", "vllm", "--quantization fp8", None),
        ("fp8", "sglang", "--quantization fp8", None),
        ("awq", "vllm", "--quantization awq", None),
        ("gptq", "sglang", "--quantization gptq", None),
        ("int8", "vllm", None, "pre-quantized compressed-tensors checkpoint"),
        ("int8", "sglang", "--quantization w8a8_int8", None),
        ("int4", "vllm", "--quantization awq", "needs an AWQ or GPTQ checkpoint"),
    ],
)
def test_model_quantization(
    quantization: str | None, engine: str, flag: str | None, comment: str | None
) -> None:
    b = best(prefix_caching=NATIVE_PREFIX[engine])
    text = export({**b, "quantization": quantization}, engine)
    *comments, command = text.splitlines()
    if flag is None:
        assert "--quantization" not in command
    else:
        assert flag in command
    assert (comments == []) == (comment is None)
    if comment:
        assert comment in comments[0]


def test_quantization_is_read_from_a_local_checkpoint(tmp_path) -> None:
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "mixtral", "quantization_config": {"quant_method": "fp8"}})
    )
    b = {**best(), "model": str(tmp_path)}
    assert "--quantization fp8" in export(b, "vllm")
    assert "--quantization awq" in export({**b, "quantization": "awq"}, "vllm")  # given wins
    with pytest.raises(ValueError, match="model quantization 'nf3' is unknown"):
        export({**b, "quantization": "nf3"}, "sglang")
    # the engines name a compressed-tensors checkpoint's method, whatever scheme it holds
    fp8_groups = {"group_0": {"weights": {"num_bits": 8, "type": "float"}}}
    quant = {"quant_method": "compressed-tensors", "config_groups": fp8_groups}
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "llama4", "quantization_config": quant})
    )
    assert "--quantization compressed-tensors" in export(b, "vllm")


def test_priority_scheduling_exports_to_vllm_as_is() -> None:
    text = export(best(scheduling_policy="priority"), "vllm")
    assert "--scheduling-policy priority" in text.splitlines()[-1]
    assert "--scheduling-policy" not in export(best(), "vllm")
