import json
from pathlib import Path

import pytest

from slotune.engine.sim import GPUS, MODELS, UnknownNameError, get_gpu, get_model, load_profile

REQUIRED_GPUS = (
    "h100",
    "h100-pcie",
    "h200",
    "a100-80g",
    "a100-40g",
    "l40s",
    "a10g",
    "l4",
    "b200",
    "mi300x",
    "rtx4090",
)
REQUIRED_MODELS = (
    "llama-2-7b",
    "llama-2-13b",
    "llama-2-70b",
    "llama-3-8b",
    "llama-3-70b",
    "mistral-7b",
    "qwen2.5-7b",
    "qwen2.5-32b",
    "qwen2.5-72b",
    "mixtral-8x7b",
    "mixtral-8x22b",
    "qwen1.5-moe-a2.7b",
    "qwen2-moe-57b-a14b",
    "qwen3-30b-a3b",
    "deepseek-v2-lite",
    "deepseek-v3",
    "gpt-oss-20b",
    "gpt-oss-120b",
    "llama-4-scout",
    "llama-4-maverick",
)


def test_catalogues_hold_the_required_names() -> None:
    assert set(REQUIRED_GPUS) <= set(GPUS)
    assert set(REQUIRED_MODELS) <= set(MODELS)


@pytest.mark.parametrize("name", REQUIRED_GPUS)
def test_every_gpu_has_a_loadable_profile_that_names_its_origin(name: str) -> None:
    profile = load_profile(name)
    assert profile.gpu == get_gpu(name)
    assert ("Fitted" in profile.note) or ("datasheet" in profile.note)
    assert profile.gpu.source


def test_unknown_gpu_lists_the_known_ones() -> None:
    with pytest.raises(UnknownNameError) as e:
        get_gpu("h900")
    assert "h100" in str(e.value) and "mi300x" in str(e.value)


def test_unknown_model_lists_the_known_ones() -> None:
    with pytest.raises(UnknownNameError) as e:
        get_model("llama-9-1b")
    assert "llama-2-7b" in str(e.value) and "qwen2.5-72b" in str(e.value)


def test_llama_2_7b_shape_weights_and_kv() -> None:
    m = get_model("llama-2-7b")
    assert m.kv_bytes_per_token == 2 * 32 * 32 * 128 * 2 == 512 * 1024  # ~0.5 MB
    assert 6.7e9 < m.num_params < 6.8e9
    assert 13.4e9 < m.weight_bytes < 13.6e9


@pytest.mark.parametrize(
    ("name", "billions"),
    [
        ("llama-2-13b", 13.0),
        ("llama-2-70b", 69.0),
        ("llama-3-8b", 8.0),
        ("llama-3-70b", 70.6),
        ("mistral-7b", 7.2),
        ("qwen2.5-7b", 7.6),
        ("qwen2.5-32b", 32.8),
        ("qwen2.5-72b", 72.7),
    ],
)
def test_parameter_counts_match_the_published_sizes(name: str, billions: float) -> None:
    assert get_model(name).num_params / 1e9 == pytest.approx(billions, rel=0.01)


def test_gqa_kv_bytes() -> None:
    assert get_model("llama-3-8b").kv_bytes_per_token == 2 * 32 * 8 * 128 * 2
    assert get_model("qwen2.5-7b").kv_bytes_per_token == 2 * 28 * 4 * 128 * 2


def test_hf_config_path_is_read(tmp_path: Path) -> None:
    cfg = {
        "architectures": ["Qwen2ForCausalLM"],
        "hidden_size": 896,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "intermediate_size": 4864,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
        "max_position_embeddings": 32768,
        "eos_token_id": 151643,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    for ref in (tmp_path, tmp_path / "config.json"):
        m = get_model(str(ref))
        assert (m.hidden_size, m.num_layers, m.num_heads, m.num_kv_heads) == (896, 24, 14, 2)
        assert m.head_dim == 64 and m.tie_word_embeddings and m.qkv_bias
        assert m.eos_token_ids == (151643,)
        assert m.kv_bytes_per_token == 2 * 24 * 2 * 64 * 2


def test_hf_config_of_another_family_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "n_embd": 768}))
    with pytest.raises(ValueError, match="not supported"):
        get_model(str(path))


def test_tp_must_divide_heads() -> None:
    with pytest.raises(ValueError, match="divide"):
        get_model("qwen2.5-7b").check_tp(8)


def test_qwen3_config_is_read_with_its_own_head_dim(tmp_path) -> None:
    """Qwen3 names head_dim apart from hidden / heads (Qwen3-0.6B: 1024 / 16 heads, 128)."""
    import json

    from slotune.engine.sim.models import get_model

    cfg = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
        "max_position_embeddings": 40960,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    spec = get_model(str(path))
    assert (spec.head_dim, spec.num_heads, spec.num_kv_heads) == (128, 16, 8)
    assert spec.kv_bytes_per_token == 2 * 28 * 8 * 128 * 2
    path.write_text(json.dumps(cfg | {"model_type": "gemma3", "architectures": ["X"]}))
    with pytest.raises(ValueError, match="model_type 'gemma3' is not supported"):
        get_model(str(path))


@pytest.mark.parametrize(
    ("device_name", "gpu"),
    [
        # as torch.cuda.get_device_name reports the cards (nvidia-smi's names)
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA H100 NVL", None),  # 94 GB, 3.9 TB/s: not the catalogue's H100
        ("NVIDIA H200", "h200"),
        ("NVIDIA H200 NVL", None),
        ("NVIDIA A100-SXM4-80GB", "a100-80g"),
        ("NVIDIA A100-SXM4-40GB", "a100-40g"),
        ("NVIDIA A100 80GB PCIe", None),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA A10G", "a10g"),
        ("NVIDIA L4", "l4"),
        ("NVIDIA B200", "b200"),
        ("AMD Instinct MI300X", "mi300x"),
        ("NVIDIA GeForce RTX 4090", "rtx4090"),
        ("NVIDIA GeForce RTX 3090", None),
        ("Tesla T4", None),
    ],
)
def test_a_cuda_device_name_finds_its_datasheet_or_none(device_name: str, gpu: str | None) -> None:
    from slotune.engine.sim.hardware import gpu_for_device

    found = gpu_for_device(device_name)
    assert (found.name if found else None) == gpu
