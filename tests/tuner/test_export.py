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
