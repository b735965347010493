"""gpt-oss's sliding-window layers as vLLM V1's hybrid KV cache manager serves them: the
pool holds the full-attention layers' KV, and those layers alone read a context longer
than the window. Expectations come from the config.json files' own fields
(``tests/sim/hf_configs``), not from the code under test."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from slotune.engine.config import EngineConfig
from slotune.engine.sim import CostModel, determine_capacity, get_model, load_profile
from slotune.engine.sim.capacity import activation_workspace_bytes, kv_bytes
from slotune.engine.sim.cost_model import window_pairs

CONFIGS = Path(__file__).parent / "hf_configs"
GIB = 1 << 30


def published(name: str) -> dict:
    return json.loads((CONFIGS / name / "config.json").read_text())


def layer_counts(name: str) -> tuple[int, int, int]:
    """(layers, full-attention layers, window) as the published file states them."""
    data = published(name)
    kinds = data["layer_types"]
    return len(kinds), kinds.count("full_attention"), data["sliding_window"]


def all_full(name: str):
    """The model as it was priced before: every layer attending to the whole context."""
    return replace(get_model(name), num_sliding_layers=0, sliding_window=None)


@pytest.mark.parametrize("name", ["gpt-oss-20b", "gpt-oss-120b"])
def test_the_catalogue_and_the_file_give_the_sliding_layers(name: str) -> None:
    layers, full, window = layer_counts(name)
    for model in (get_model(name), get_model(str(CONFIGS / name / "config.json"))):
        assert (model.num_layers, model.num_full_layers) == (layers, full)
        assert model.num_sliding_layers == layers - full and model.sliding_window == window


def test_a_window_on_every_layer_or_without_layer_types_is_priced_as_full(
    tmp_path: Path,
) -> None:
    data = published("gpt-oss-20b")
    path = tmp_path / "config.json"
    every = data | {"layer_types": ["sliding_attention"] * data["num_hidden_layers"]}
    for variant in (every, {k: v for k, v in data.items() if k != "layer_types"}):
        path.write_text(json.dumps(variant))
        assert get_model(str(path)).num_sliding_layers == 0
    with pytest.raises(ValueError, match="at least one layer must attend to the full"):
        replace(get_model("gpt-oss-20b"), num_sliding_layers=24)


@pytest.mark.parametrize(("name", "gpu"), [("gpt-oss-20b", "h100"), ("gpt-oss-120b", "h100")])
def test_the_pool_holds_layers_over_full_layers_times_the_tokens(name: str, gpu: str) -> None:
    layers, full, _ = layer_counts(name)
    profile, config = load_profile(gpu), EngineConfig(num_gpu_blocks=None)
    model = get_model(name)
    blocks = determine_capacity(profile, model, 1, config).num_gpu_blocks
    before = determine_capacity(profile, all_full(name), 1, config).num_gpu_blocks
    assert blocks / before == pytest.approx(layers / full, rel=1e-3)
    # By hand: what is left after weights, reserve and activations, over a block of 16
    # tokens' K and V (8 heads of 64, bf16) in each full-attention layer.
    free = (
        config.gpu_memory_utilization * profile.gpu.memory_bytes
        - model.weight_bytes
        - profile.system.reserved_gib * GIB
        - activation_workspace_bytes(model, 1, config.max_num_batched_tokens, config.max_num_seqs)
    )
    assert blocks == int(free // (full * 16 * 2 * 8 * 64 * 2))


def test_a_prompts_kv_to_move_has_only_the_window_of_the_sliding_layers() -> None:
    layers, full, window = layer_counts("gpt-oss-20b")
    per_layer_token = 2 * 8 * 64 * 2
    model = get_model("gpt-oss-20b")
    assert kv_bytes(model, 5000, 16) == per_layer_token * (full * 5000 + (layers - full) * window)
    assert kv_bytes(model, 100, 16) == per_layer_token * layers * 100


@pytest.mark.parametrize("name", ["gpt-oss-20b", "gpt-oss-120b"])
def test_decode_grows_with_a_long_context_through_the_full_layers_only(name: str) -> None:
    layers, full, window = layer_counts(name)
    h100 = load_profile("h100")
    swa, ref = CostModel(h100, get_model(name)), CostModel(h100, all_full(name))
    n = 32
    for short, long in ((window, 4 * window), (1000, 30000)):

        def growth(cm: CostModel, lo: int = short, hi: int = long) -> float:
            return cm.decode_step_seconds(n, n * hi) - cm.decode_step_seconds(n, n * lo)

        assert growth(swa) == pytest.approx(growth(ref) * full / layers, rel=1e-9)
    # Within the window every layer reads the whole context, as full attention does.
    for context in (1, 64, window):
        assert swa.decode_step_seconds(n, n * context) == pytest.approx(
            ref.decode_step_seconds(n, n * context), rel=1e-12
        )
    assert swa.decode_step_seconds(n, n * 30000) < 0.8 * ref.decode_step_seconds(n, n * 30000)


def test_a_prefill_chunk_grows_with_its_prior_context_through_the_full_layers_only() -> None:
    layers, full, _ = layer_counts("gpt-oss-120b")
    h100 = load_profile("h100")
    swa, ref = CostModel(h100, get_model("gpt-oss-120b")), CostModel(h100, all_full("gpt-oss-120b"))
    for chunk in (512, 2048, 8192):
        grown = swa.prefill_chunk_seconds(chunk, 24000) - swa.prefill_chunk_seconds(chunk, 8000)
        ref_grown = ref.prefill_chunk_seconds(chunk, 24000) - ref.prefill_chunk_seconds(chunk, 8000)
        assert grown == pytest.approx(ref_grown * full / layers, rel=1e-9)
    # A first chunk shorter than the window is the same causal square in every layer.
    assert swa.prefill_chunk_seconds(100, 0) == pytest.approx(ref.prefill_chunk_seconds(100, 0))


def brute_pairs(chunk: int, prior: int, window: int) -> tuple[int, int]:
    """Each query at position i attends to keys i - window < k <= i: (prior, in-chunk)."""
    with_prior = within = 0
    for i in range(prior, prior + chunk):
        for k in range(max(0, i - window + 1), i + 1):
            if k < prior:
                with_prior += 1
            else:
                within += 1
    return with_prior, within


@pytest.mark.parametrize(
    ("chunk", "prior", "window"),
    [(50, 0, 128), (300, 0, 128), (64, 40, 128), (200, 1000, 128), (100, 90, 128), (700, 60, 64)],
)
def test_window_pairs_count_a_chunks_query_key_pairs(chunk: int, prior: int, window: int) -> None:
    prefix, causal = window_pairs(chunk, prior, window)
    want_prefix, want_causal = brute_pairs(chunk, prior, window)
    # Counted as full attention's chunk²/2 is: within one pair a query of the exact count.
    assert abs(prefix - want_prefix) <= chunk and abs(causal - want_causal) <= chunk
    assert prefix + causal < chunk * window + 1


def test_window_pairs_are_full_attentions_when_the_window_covers_everything() -> None:
    for chunk, prior in ((1, 0), (100, 0), (512, 3000), (8192, 24000)):
        assert window_pairs(chunk, prior, 10**6) == (chunk * prior, chunk * chunk / 2)


def test_a_pipeline_stage_keeps_its_share_of_sliding_layers(tmp_path: Path) -> None:
    from slotune.engine.sim.pipeline import stage_model

    kinds = ["sliding_attention", "full_attention", "full_attention"] * 4  # 4 of 12 sliding
    dense = {
        "model_type": "llama",
        "hidden_size": 1024,
        "intermediate_size": 4096,
        "num_hidden_layers": 12,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "vocab_size": 32000,
        "sliding_window": 512,
        "layer_types": kinds,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(dense))
    model = get_model(str(path))
    assert (model.num_sliding_layers, model.sliding_window) == (4, 512)
    stage = stage_model(model, 5)  # ceil(12 / 5) = 3 layers, one of them sliding
    assert (stage.num_layers, stage.num_sliding_layers) == (3, 1)
