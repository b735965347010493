import json
import shutil
from pathlib import Path

from typer.testing import CliRunner

from slotune.cli.app import app
from slotune.engine.sim.profile import PROFILE_DIR

OPS = {"qkv_proj", "o_proj", "mlp_up", "mlp_act", "mlp_down", "attention", "norms", "allreduce"}


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output


def test_estimate_json_has_the_per_layer_ops_and_the_step() -> None:
    code, out = _run(
        "estimate",
        "--gpu",
        "h100",
        "--model",
        "llama-3-8b",
        "--tokens",
        "512",
        "--context",
        "1024",
        "--decode-batch",
        "16",
        "--decode-context",
        "900",
        "--json",
    )
    assert code == 0, out
    data = json.loads(out)
    assert set(data["per_layer_ms"]) >= OPS
    assert all(v >= 0 for v in data["per_layer_ms"].values())
    assert data["per_layer_ms"]["attention"] > 0 and data["per_layer_ms"]["allreduce"] == 0
    assert data["step_ms"] > data["num_layers"] * data["per_layer_ms"]["mlp_up"]


def test_estimate_with_tp_has_allreduce_and_the_table_prints() -> None:
    code, out = _run(
        "estimate",
        "--gpu",
        "a100-80g",
        "--model",
        "llama-2-70b",
        "--tp",
        "4",
        "--tokens",
        "256",
        "--json",
    )
    assert code == 0, out
    assert json.loads(out)["per_layer_ms"]["allreduce"] > 0
    code, out = _run("estimate", "--gpu", "h100", "--model", "llama-2-7b", "--tokens", "128")
    assert code == 0 and "qkv_proj" in out and "step" in out


def test_estimate_accepts_a_profile_path(tmp_path: Path) -> None:
    path = tmp_path / "my-gpu.json"
    shutil.copy(PROFILE_DIR / "h100.json", path)
    code, out = _run(
        "estimate", "--gpu", str(path), "--model", "llama-2-7b", "--tokens", "64", "--json"
    )
    assert code == 0, out
    assert json.loads(out)["gpu"] == "h100"


def test_unknown_names_exit_2_and_list_the_known_ones() -> None:
    code, out = _run("estimate", "--gpu", "h900", "--model", "llama-2-7b", "--tokens", "8")
    assert code == 2 and "h100" in out and "a100-80g" in out
    code, out = _run("estimate", "--gpu", "h100", "--model", "llama-5", "--tokens", "8")
    assert code == 2 and "llama-2-7b" in out and "qwen2.5-7b" in out
    code, out = _run("estimate", "--gpu", "h100", "--model", "llama-2-7b", "--tokens", "0")
    assert code == 2 and "empty" in out


def test_gpus_and_models_list_the_catalogues() -> None:
    code, out = _run("gpus", "--json")
    assert code == 0
    names = {g["name"] for g in json.loads(out)}
    assert {
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
    } <= names
    code, out = _run("models", "--json")
    assert code == 0
    by_name = {m["name"]: m for m in json.loads(out)}
    assert by_name["llama-2-7b"]["kv_kib_per_token"] == 512
    code, out = _run("models")
    assert code == 0 and "qwen2.5-72b" in out


def _estimate(*extra: str) -> dict:  # type: ignore[type-arg]
    code, out = _run(
        "estimate", "--gpu", "h100", "--tokens", "0", "--decode-batch", "32", "--json", *extra
    )
    assert code == 0, out
    return json.loads(out)


def test_estimate_prices_moe_quantized_weights_and_kv_dtype() -> None:
    base = ("--model", "mixtral-8x7b", "--tp", "2", "--decode-context", "8000")
    bf16 = _estimate(*base)
    assert bf16["weight_dtype"] == "bf16" and bf16["per_layer_ms"]["moe_up"] > 0
    assert "mlp_up" not in bf16["per_layer_ms"]  # no dense MLP layer in Mixtral
    fp8 = _estimate(*base, "--quantization", "fp8")
    assert fp8["weight_dtype"] == "fp8"
    assert fp8["per_layer_ms"]["moe_up"] < 0.7 * bf16["per_layer_ms"]["moe_up"]
    kv = _estimate(*base, "--kv-cache-dtype", "fp8")
    assert kv["per_layer_ms"]["attention"] < 0.8 * bf16["per_layer_ms"]["attention"]
    ep = _estimate(*base, "--ep", "2")
    assert ep["per_layer_ms"]["alltoall"] > 0


def test_bad_precision_and_ep_flags_exit_2() -> None:
    for extra, message in (
        (("--quantization", "fp4"), "unknown weight quantization 'fp4'"),
        (("--kv-cache-dtype", "fp4"), "--kv-cache-dtype"),
        (("--tp", "2", "--ep", "2"), "needs a MoE model"),
    ):
        code, out = _run(
            "estimate", "--gpu", "h100", "--model", "llama-3-8b", "--tokens", "8", *extra
        )
        assert code == 2 and message in out, out


def test_models_lists_the_moe_catalogue() -> None:
    code, out = _run("models", "--json")
    assert code == 0
    rows = {r["name"]: r for r in json.loads(out)}
    assert rows["mixtral-8x7b"]["experts"] == "2/8" and rows["llama-3-8b"]["experts"] is None
    assert rows["gpt-oss-20b"]["weight_dtype"] == "bf16"
    assert rows["gpt-oss-20b"]["expert_weight_dtype"] == "mxfp4"
