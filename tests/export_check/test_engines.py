"""The real-engine harness itself: the engines reject what they reject, values land, defaults.

Runs where vLLM 0.34 / SGLang 0.5.23 are installed (`make check-export`); elsewhere only the
checkpoint tests run. Expected values were read from the engines' source:
vllm/engine/arg_utils.py `get_batch_defaults` (API server: 8192 / 1024 on >= 70 GiB GPUs that
are not A100, 2048 / 256 on A100 and smaller) and sglang/srt/arg_groups/memory_hook.py
(chunked_prefill_size 8192 from 60 to 160 GiB, 4096 from 35 to 60 GiB).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from tests.export_check.engines import (
    GPUS,
    QUANTIZATION_CONFIGS,
    EngineRejected,
    make_hf_checkpoint,
    resolve_launch_line,
    sglang_defaults,
    sglang_resolve,
    vllm_defaults,
    vllm_resolve,
)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str | None, Path]:
    root = tmp_path_factory.mktemp("checkpoints")
    kinds: list[str | None] = [None, *QUANTIZATION_CONFIGS]
    return {kind: make_hf_checkpoint(root / str(kind), quantization=kind) for kind in kinds}


@pytest.fixture(scope="module")
def bf16(checkpoints: dict[str | None, Path]) -> str:
    return str(checkpoints[None])


@pytest.fixture(scope="module")
def vllm(checkpoints: dict[str | None, Path]) -> None:
    pytest.importorskip("vllm")


@pytest.fixture(scope="module")
def sglang(checkpoints: dict[str | None, Path]) -> None:
    pytest.importorskip("sglang")


# --------------------------------------------------------------------------------------
# The checkpoint builder (runs everywhere)


def test_checkpoint_carries_the_quantization_config_of_its_kind(tmp_path: Path) -> None:
    plain = json.loads((make_hf_checkpoint(tmp_path / "plain") / "config.json").read_text())
    awq = json.loads(
        (make_hf_checkpoint(tmp_path / "awq", quantization="awq") / "config.json").read_text()
    )
    assert "quantization_config" not in plain
    assert awq["quantization_config"]["quant_method"] == "awq"
    assert awq["quantization_config"]["bits"] == 4


def test_checkpoint_tokenizer_loads_and_refuses_unknown_kinds(tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    path = make_hf_checkpoint(tmp_path / "m")
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    assert (
        tokenizer.get_vocab_size() == json.loads((path / "config.json").read_text())["vocab_size"]
    )
    with pytest.raises(ValueError, match="no checkpoint kind"):
        make_hf_checkpoint(tmp_path / "x", quantization="int3")


# --------------------------------------------------------------------------------------
# vLLM 0.34


VLLM_BATCH_DEFAULTS = {
    "h100": (8192, 1024),
    "h200": (8192, 1024),
    "a100": (2048, 256),
    "l40s": (2048, 256),
}


@pytest.mark.parametrize("gpu", sorted(GPUS))
def test_vllm_defaults_per_gpu(vllm: None, bf16: str, gpu: str) -> None:
    defaults = vllm_defaults(bf16, gpu)
    budget, seqs = VLLM_BATCH_DEFAULTS[gpu]
    assert (defaults["max_num_batched_tokens"], defaults["max_num_seqs"]) == (budget, seqs)
    assert defaults["enable_chunked_prefill"] is True
    assert defaults["enable_prefix_caching"] is True
    assert defaults["prefix_caching_hash_algo"] == "sha256"
    assert defaults["block_size"] == 64
    assert defaults["kv_cache_dtype"] == "auto"
    assert defaults["long_prefill_token_threshold"] == 0
    assert defaults["gpu_memory_utilization"] is None  # resolved at startup (1.0 extensible)
    assert defaults["scheduling_policy"] == "fcfs"
    assert defaults["async_scheduling"] is True
    assert defaults["max_model_len"] == 32768  # the checkpoint's max_position_embeddings


def test_vllm_rejects_budget_below_max_num_seqs(vllm: None, bf16: str) -> None:
    with pytest.raises(EngineRejected, match=r"max_num_batched_tokens \(256\).*max_num_seqs"):
        vllm_resolve([bf16, "--max-num-batched-tokens", "256", "--max-num-seqs", "512"])
    landed = vllm_resolve([bf16, "--max-num-batched-tokens", "512", "--max-num-seqs", "512"])
    assert (landed["max_num_batched_tokens"], landed["max_num_seqs"]) == (512, 512)


def test_vllm_long_prefill_threshold_lands_and_is_capped_by_max_model_len(
    vllm: None, bf16: str
) -> None:
    assert (
        vllm_resolve([bf16, "--long-prefill-token-threshold", "512"])[
            "long_prefill_token_threshold"
        ]
        == 512
    )
    with pytest.raises(EngineRejected, match="cannot be greater than the max_model_len"):
        vllm_resolve([bf16, "--max-model-len", "4096", "--long-prefill-token-threshold", "8192"])


def test_vllm_every_scheduler_and_memory_value_lands(vllm: None, bf16: str) -> None:
    argv = [
        bf16,
        "--max-num-batched-tokens",
        "4096",
        "--max-num-seqs",
        "96",
        "--block-size",
        "32",
        "--no-enable-prefix-caching",
        "--kv-cache-dtype",
        "fp8",
        "--tensor-parallel-size",
        "2",
        "--gpu-memory-utilization",
        "0.85",
        "--num-gpu-blocks-override",
        "1234",
        "--max-model-len",
        "8192",
        "--scheduling-policy",
        "priority",
    ]
    landed = vllm_resolve(argv, gpu="a100")
    assert landed["max_num_batched_tokens"] == 4096
    assert landed["max_num_seqs"] == 96
    assert landed["block_size"] == 32
    assert landed["enable_prefix_caching"] is False
    assert landed["kv_cache_dtype"] == "fp8"
    assert landed["tensor_parallel_size"] == 2
    assert landed["gpu_memory_utilization"] == 0.85
    assert landed["num_gpu_blocks_override"] == 1234
    assert landed["max_model_len"] == 8192
    assert landed["scheduling_policy"] == "priority"


@pytest.mark.parametrize("method", ["awq", "gptq", "awq_marlin", "gptq_marlin"])
def test_vllm_weight_quantization_needs_a_quantized_checkpoint(
    vllm: None, bf16: str, method: str
) -> None:
    with pytest.raises(EngineRejected, match=f"Cannot find the config file for {method}"):
        vllm_resolve([bf16, "--quantization", method])


@pytest.mark.parametrize(
    ("kind", "flag", "landed"),
    [
        ("awq", "awq", "auto_awq"),
        ("awq", "awq_marlin", "auto_awq"),
        ("gptq", "gptq", "auto_gptq"),
        ("gptq", "gptq_marlin", "auto_gptq"),
        ("compressed-tensors", "compressed-tensors", "compressed-tensors"),
        ("fp8", "fp8", "fp8"),
    ],
)
def test_vllm_accepts_quantization_on_its_checkpoint_kind(
    vllm: None, checkpoints: dict[str | None, Path], kind: str, flag: str, landed: str
) -> None:
    assert vllm_resolve([str(checkpoints[kind]), "--quantization", flag])["quantization"] == landed


def test_vllm_does_not_know_bitsandbytes(vllm: None, checkpoints: dict[str | None, Path]) -> None:
    with pytest.raises(EngineRejected, match="Unknown quantization method: bitsandbytes"):
        vllm_resolve([str(checkpoints["bitsandbytes"])])


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_vllm_online_fp8_is_deprecated_for_fp8_per_tensor(vllm: None, bf16: str) -> None:
    records = _Records()
    logger = logging.getLogger("vllm")
    logger.addHandler(records)
    try:
        assert vllm_resolve([bf16, "--quantization", "fp8"])["quantization"] == "fp8"
        assert any("fp8 is deprecated" in m and "fp8_per_tensor" in m for m in records.messages)
        records.messages.clear()
        per_tensor = vllm_resolve([bf16, "--quantization", "fp8_per_tensor"])
        assert per_tensor["quantization"] == "fp8_per_tensor"
        assert not any("deprecated" in m for m in records.messages)
    finally:
        logger.removeHandler(records)


VLLM_KV_DTYPES = [
    "auto",
    "bfloat16",
    "fp8",
    "fp8_e4m3",
    "fp8_e5m2",
    "int8_per_token_head",
    "int4_per_token_head",
]


@pytest.mark.parametrize("dtype", VLLM_KV_DTYPES)
def test_vllm_kv_cache_dtypes_land(vllm: None, bf16: str, dtype: str) -> None:
    assert vllm_resolve([bf16, "--kv-cache-dtype", dtype])["kv_cache_dtype"] == dtype


@pytest.mark.parametrize("dtype", ["int8", "int4", "fp4"])
def test_vllm_rejects_plain_integer_kv_dtypes(vllm: None, bf16: str, dtype: str) -> None:
    with pytest.raises(EngineRejected, match="Invalid kv_cache_dtype"):
        vllm_resolve([bf16, "--kv-cache-dtype", dtype])


@pytest.mark.parametrize("block", [16, 32, 64, 128, 256])
def test_vllm_block_sizes_land(vllm: None, bf16: str, block: int) -> None:
    assert vllm_resolve([bf16, "--block-size", str(block)])["block_size"] == block


def test_vllm_has_no_swap_preemption_flag(vllm: None, bf16: str) -> None:
    with pytest.raises(EngineRejected, match="unrecognized arguments: --preemption-mode"):
        vllm_resolve([bf16, "--preemption-mode", "swap"])


def test_vllm_config_file_must_be_yaml(vllm: None, bf16: str, tmp_path: Path) -> None:
    yaml_file = tmp_path / "serve.yaml"
    yaml_file.write_text("max-num-seqs: 64\nmax_num_batched_tokens: 4096\n")
    landed = vllm_resolve([bf16, "--config", str(yaml_file)])
    assert (landed["max_num_seqs"], landed["max_num_batched_tokens"]) == (64, 4096)
    json_file = tmp_path / "serve.json"
    json_file.write_text('{"max-num-seqs": 64}')
    with pytest.raises(EngineRejected, match="must be of a yaml/yml type"):
        vllm_resolve([bf16, "--config", str(json_file)])


# --------------------------------------------------------------------------------------
# SGLang 0.5.23


@pytest.mark.parametrize(
    ("gpu", "chunk", "fraction"),
    [("h100", 8192, 0.83), ("a100", 8192, 0.83), ("h200", 8192, None), ("l40s", 4096, 0.843)],
)
def test_sglang_defaults_per_gpu(
    sglang: None, bf16: str, gpu: str, chunk: int, fraction: float | None
) -> None:
    defaults = sglang_defaults(bf16, gpu)
    assert defaults["chunked_prefill_size"] == chunk
    assert defaults["max_prefill_tokens"] == 16384
    assert defaults["max_running_requests"] is None  # sized from the KV pool at startup
    assert defaults["page_size"] == 1
    assert defaults["disable_radix_cache"] is False
    assert defaults["kv_cache_dtype"] == "auto"
    assert defaults["schedule_policy"] == "fcfs"
    assert (defaults["tp_size"], defaults["ep_size"]) == (1, 1)
    if fraction is not None:  # depends on the model and the GPU's memory
        assert defaults["mem_fraction_static"] == fraction


def test_sglang_values_land(sglang: None, bf16: str) -> None:
    landed = sglang_resolve(
        [
            "--model-path",
            bf16,
            "--chunked-prefill-size",
            "512",
            "--max-prefill-tokens",
            "4096",
            "--max-running-requests",
            "64",
            "--page-size",
            "16",
            "--disable-radix-cache",
            "--kv-cache-dtype",
            "fp8_e4m3",
            "--mem-fraction-static",
            "0.8",
            "--tp-size",
            "2",
            "--schedule-policy",
            "lpm",
            "--context-length",
            "8192",
        ]
    )
    assert landed["chunked_prefill_size"] == 512
    assert landed["max_prefill_tokens"] == 4096
    assert landed["max_running_requests"] == 64
    assert landed["page_size"] == 16
    assert landed["disable_radix_cache"] is True
    assert landed["kv_cache_dtype"] == "fp8_e4m3"
    assert landed["mem_fraction_static"] == 0.8
    assert landed["tp_size"] == 2
    assert landed["schedule_policy"] == "lpm"
    assert landed["context_length"] == 8192


def test_sglang_has_no_plain_gptq_on_cuda(
    sglang: None, checkpoints: dict[str | None, Path]
) -> None:
    gptq = str(checkpoints["gptq"])
    for path in (str(checkpoints[None]), gptq):
        with pytest.raises(EngineRejected, match="Unknown quantization method: gptq"):
            sglang_resolve(["--model-path", path, "--quantization", "gptq"])
    assert (
        sglang_resolve(["--model-path", gptq, "--quantization", "gptq_marlin"])["quantization"]
        == "gptq_marlin"
    )


def test_sglang_refuses_a_method_that_does_not_match_the_checkpoint(
    sglang: None, checkpoints: dict[str | None, Path]
) -> None:
    with pytest.raises(EngineRejected, match=r"model config \(awq\) does not match"):
        sglang_resolve(["--model-path", str(checkpoints["awq"]), "--quantization", "gptq_marlin"])


@pytest.mark.parametrize(
    ("kind", "flag"),
    [
        ("awq", "awq"),
        ("awq", "awq_marlin"),
        ("gptq", "gptq_marlin"),
        ("compressed-tensors", "compressed-tensors"),
        ("fp8", "fp8"),
        ("bitsandbytes", "bitsandbytes"),
    ],
)
def test_sglang_accepts_quantization_on_its_checkpoint_kind(
    sglang: None, checkpoints: dict[str | None, Path], kind: str, flag: str
) -> None:
    argv = ["--model-path", str(checkpoints[kind]), "--quantization", flag]
    assert sglang_resolve(argv)["quantization"] == flag


@pytest.mark.parametrize("dtype", ["int8", "fp8", "fp4_e2m1", "int8_per_token_head"])
def test_sglang_kv_cache_dtype_choices(sglang: None, bf16: str, dtype: str) -> None:
    with pytest.raises(EngineRejected, match="invalid choice"):
        sglang_resolve(["--model-path", bf16, "--kv-cache-dtype", dtype])


def test_sglang_has_no_prefill_first_policy(sglang: None, bf16: str) -> None:
    with pytest.raises(EngineRejected, match="invalid choice: 'prefill_first'"):
        sglang_resolve(["--model-path", bf16, "--schedule-policy", "prefill_first"])


# --------------------------------------------------------------------------------------
# Whole printed lines


def test_launch_lines_dispatch_to_their_engine(vllm: None, sglang: None, bf16: str) -> None:
    engine, landed = resolve_launch_line(
        f"vllm serve {bf16} \\\n  --max-num-seqs 48 \\\n  --long-prefill-token-threshold 256",
        gpu="a100",
    )
    assert engine == "vllm"
    assert (landed["max_num_seqs"], landed["long_prefill_token_threshold"]) == (48, 256)
    engine, landed = resolve_launch_line(
        f"python -m sglang.launch_server --model-path '{bf16}' --max-running-requests 48"
    )
    assert (engine, landed["max_running_requests"]) == ("sglang", 48)


def test_launch_line_of_another_program_is_refused() -> None:
    with pytest.raises(ValueError, match="not a vllm or sglang launch line"):
        resolve_launch_line("trtllm-serve /m --max_batch_size 8")


def test_expert_parallel_lands_on_a_moe_checkpoint(
    vllm: None, sglang: None, bf16: str, tmp_path: Path
) -> None:
    moe = str(make_hf_checkpoint(tmp_path / "moe", moe=True))
    landed = vllm_resolve([moe, "--tensor-parallel-size", "2", "--enable-expert-parallel"])
    assert (landed["tensor_parallel_size"], landed["enable_expert_parallel"]) == (2, True)
    with pytest.raises(EngineRejected, match="Number of experts in the model must be greater"):
        vllm_resolve([bf16, "--tensor-parallel-size", "2", "--enable-expert-parallel"])
    landed = sglang_resolve(["--model-path", moe, "--tp-size", "2", "--ep-size", "2"])
    assert (landed["tp_size"], landed["ep_size"]) == (2, 2)
