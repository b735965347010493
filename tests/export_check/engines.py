"""The real engines as an independent reference for slotune's exported launch lines.

vLLM's `vllm serve` parser + `EngineArgs.create_engine_config()` and SGLang's
`prepare_server_args()` + `ServerArgs.resolve_once()`, run in this process on a CPU-only
machine: the engines' compiled extensions are replaced by empty modules (no kernel ever runs)
and a CUDA GPU is faked (name, memory, compute capability; see GPUS). Install the engines with
`scripts/install_engines.sh` (`make check-export`). This module imports without them; call
`vllm_available()` / `sglang_available()` or use `pytest.importorskip`.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.abc
import importlib.machinery
import importlib.util
import io
import json
import os
import shlex
import sys
import types
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from unittest import mock

MiB = 1 << 20


@dataclass(frozen=True)
class FakeGpu:
    name: str  # as torch.cuda.get_device_name / nvidia-smi report it
    memory_mib: int  # as nvidia-smi reports memory.total
    capability: tuple[int, int]


GPUS: dict[str, FakeGpu] = {
    "h100": FakeGpu("NVIDIA H100 80GB HBM3", 81559, (9, 0)),
    "h200": FakeGpu("NVIDIA H200", 143771, (9, 0)),
    "a100": FakeGpu("NVIDIA A100-SXM4-80GB", 81920, (8, 0)),
    "l40s": FakeGpu("NVIDIA L40S", 46068, (8, 9)),
}
FAKE_GPU_COUNT = 8


class EngineRejected(Exception):
    """The engine's parser or config builder refused the line; str() is its own message."""


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def sglang_available() -> bool:
    return importlib.util.find_spec("sglang") is not None


# --------------------------------------------------------------------------------------
# No kernels: the engines' compiled extensions import as empty modules.


class _EmptyModuleLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return types.ModuleType(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        pass


class _NoExtensionsFinder(importlib.abc.MetaPathFinder):
    PACKAGES = ("vllm.", "sglang.", "sgl_kernel")

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if not fullname.startswith(self.PACKAGES):
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or not (spec.origin or "").endswith(".so"):
            return None
        return importlib.machinery.ModuleSpec(fullname, _EmptyModuleLoader(), origin=spec.origin)


class _AnyAttributeType(type):
    """A stand-in class whose attributes are stand-in classes too (`scalar_types.uint4b8`)."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _stand_in(name)


def _stand_in(name: str) -> Any:
    return _AnyAttributeType(name, (), {"__init__": lambda self, *a, **k: None})


class _AnyAttributeModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _stand_in(name)


class _StandInFinder(importlib.abc.MetaPathFinder):
    """Kernel-only packages (SGLang's sgl_kernel) that are not installed: names import, unused."""

    PACKAGES = ("sgl_kernel",)

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname.split(".")[0] not in self.PACKAGES:
            return None
        return importlib.machinery.ModuleSpec(fullname, _StandInLoader(), is_package=True)


class _StandInLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        if spec.name == "sgl_kernel.scalar_type" and vllm_available():
            # Pure Python in sgl_kernel, the same file as vLLM's: SGLang's Marlin checks
            # (can this GPTQ/AWQ checkpoint run as gptq_marlin?) read real types from it.
            return importlib.import_module("vllm.scalar_type")
        module = _AnyAttributeModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


_prepared = False


def _prepare_imports() -> None:
    """Once per process: empty extension modules, and a torchvision stand-in for SGLang.

    SGLang's config package imports torchvision.transforms (for VLM image preprocessing) at
    import time; PyPI's torchvision is built for CUDA torch and cannot load next to CPU torch.
    transformers is asked first, so it keeps treating torchvision as absent.
    """
    global _prepared
    if _prepared:
        return
    os.environ.setdefault("VLLM_CACHE_ROOT", str(Path(sys.prefix) / "vllm-cache"))
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.meta_path.insert(0, _NoExtensionsFinder())
    sys.meta_path.append(_StandInFinder())  # after the real path: only when not installed
    try:
        import torchvision  # noqa: F401
    except Exception:
        for name in [n for n in sys.modules if n.split(".")[0] == "torchvision"]:
            del sys.modules[name]
        from transformers.utils import import_utils

        if import_utils.is_torchvision_available():
            raise RuntimeError("torchvision is installed but cannot be imported") from None
        for name in ("torchvision", "torchvision.transforms", "torchvision.transforms.functional"):
            module = _AnyAttributeModule(name)
            module.__path__ = []
            module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
            sys.modules[name] = module
    _prepared = True


@contextlib.contextmanager
def _rejections(engine: str) -> Iterator[None]:
    """Turn what the engine raises (argparse's SystemExit included) into EngineRejected."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            yield
    except ImportError:
        raise  # the harness lacks a module: not the engine's verdict
    except SystemExit as exc:
        message = stderr.getvalue().strip().splitlines()
        raise EngineRejected(f"{engine}: {message[-1] if message else exc}") from exc
    except Exception as exc:
        raise EngineRejected(f"{engine}: {type(exc).__name__}: {exc}") from exc


# --------------------------------------------------------------------------------------
# vLLM


_vllm_gpu: FakeGpu = GPUS["h100"]


def _install_vllm_platform() -> None:
    import vllm.platforms
    from vllm.model_executor.models import registry
    from vllm.platforms import cuda
    from vllm.platforms.interface import DeviceCapability

    if isinstance(vllm.platforms._current_platform, cuda.CudaPlatformBase):
        return

    class FakeCudaPlatform(cuda.CudaPlatformBase):
        @classmethod
        def get_device_capability(cls, device_id: int = 0) -> DeviceCapability:
            return DeviceCapability(*_vllm_gpu.capability)

        @classmethod
        def get_device_name(cls, device_id: int = 0) -> str:
            return _vllm_gpu.name

        @classmethod
        def get_device_total_memory(cls, device_id: int = 0) -> int:
            return _vllm_gpu.memory_mib * MiB

        @classmethod
        def is_fully_connected(cls, physical_device_ids: list[int]) -> bool:
            return True

        @classmethod
        def device_count(cls) -> int:
            return FAKE_GPU_COUNT

    vllm.platforms._current_platform = FakeCudaPlatform()

    # Kernel capability queries answered by the compiled extension, asked at import time by
    # the quantization modules: CUTLASS's rules (fp8 from sm89, block fp8 sm90, fp4 sm100).
    from vllm import _custom_ops as ops

    ops.cutlass_scaled_mm_supports_fp8 = lambda capability: capability >= 89
    ops.cutlass_scaled_mm_supports_block_fp8 = lambda capability: capability >= 90
    ops.cutlass_scaled_mm_supports_fp4 = lambda capability: capability >= 100
    ops.cutlass_group_gemm_supported = lambda capability: 90 <= capability < 110

    # The model-info cache writer imports vLLM's model loader (kernels at import time); the
    # same JSON, written without it, keeps the model inspection subprocess to the first call.
    def save_modelinfo(self: Any, mi: Any, module_hash: str) -> None:
        cache_dir = self._get_cache_dir()
        cache_dir.mkdir(parents=True, exist_ok=True)
        payload = {"hash": module_hash, "modelinfo": asdict(mi)}
        (cache_dir / self._get_cache_filename()).write_text(json.dumps(payload))

    registry._LazyRegisteredModel._save_modelinfo_to_cache = save_modelinfo


def _vllm_parse(argv: list[str]) -> argparse.Namespace:
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    # As `vllm serve` builds it (vllm.entrypoints.cli.main).
    parser = FlexibleArgumentParser(description="vLLM CLI")
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    command = ServeSubcommand()
    command.subparser_init(subparsers).set_defaults(dispatch_function=command.cmd)
    args = parser.parse_args(["serve", *argv])
    command.validate(args)
    if getattr(args, "model_tag", None) is not None:
        args.model = args.model_tag
    return args


def vllm_resolve(argv: list[str], *, gpu: str = "h100") -> dict[str, object]:
    """Build `vllm serve ARGV` (model path first) into a VllmConfig; the values that landed."""
    global _vllm_gpu
    _prepare_imports()
    if GPUS[gpu] != _vllm_gpu:
        _clear_device_caches("vllm")
    _vllm_gpu = GPUS[gpu]
    _install_vllm_platform()
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.usage.usage_lib import UsageContext

    with _rejections("vllm"):
        args = _vllm_parse(list(argv))
        engine_args = AsyncEngineArgs.from_cli_args(args)
        config = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    scheduler, cache = config.scheduler_config, config.cache_config
    parallel, model = config.parallel_config, config.model_config
    return {
        "max_num_batched_tokens": scheduler.max_num_batched_tokens,
        "max_num_seqs": scheduler.max_num_seqs,
        "long_prefill_token_threshold": scheduler.long_prefill_token_threshold,
        "enable_chunked_prefill": scheduler.enable_chunked_prefill,
        "scheduling_policy": scheduler.policy,
        "async_scheduling": scheduler.async_scheduling,
        "block_size": cache.block_size,
        "enable_prefix_caching": cache.enable_prefix_caching,
        "prefix_caching_hash_algo": cache.prefix_caching_hash_algo,
        "kv_cache_dtype": cache.cache_dtype,
        "gpu_memory_utilization": cache.gpu_memory_utilization,
        "num_gpu_blocks_override": cache.num_gpu_blocks_override,
        "tensor_parallel_size": parallel.tensor_parallel_size,
        "enable_expert_parallel": parallel.enable_expert_parallel,
        "quantization": model.quantization,
        "max_model_len": model.max_model_len,
        "speculative_method": getattr(config.speculative_config, "method", None),
        "num_speculative_tokens": getattr(
            config.speculative_config, "num_speculative_tokens", None
        ),
        "speculative_model": getattr(config.speculative_config, "model", None),
    }


def vllm_defaults(model_dir: str | os.PathLike[str], gpu: str = "h100") -> dict[str, object]:
    """What a bare `vllm serve MODEL` runs with on that GPU: the baseline a target declares."""
    return vllm_resolve([str(model_dir)], gpu=gpu)


# --------------------------------------------------------------------------------------
# SGLang


@contextlib.contextmanager
def _sglang_gpu(gpu: FakeGpu) -> Iterator[None]:
    """SGLang asks torch.cuda (and nvidia-smi, absent here) directly: answer as that GPU."""
    props = types.SimpleNamespace(
        name=gpu.name,
        total_memory=gpu.memory_mib * MiB,
        major=gpu.capability[0],
        minor=gpu.capability[1],
        multi_processor_count=132,
    )
    import torch

    patches = [
        mock.patch.object(torch.version, "cuda", "12.9"),
        mock.patch("torch.cuda.is_available", lambda: True),
        mock.patch("torch.cuda.device_count", lambda: FAKE_GPU_COUNT),
        mock.patch("torch.cuda.get_device_name", lambda device=None: gpu.name),
        mock.patch("torch.cuda.get_device_capability", lambda device=None: gpu.capability),
        mock.patch("torch.cuda.get_device_properties", lambda device=None: props),
        mock.patch("torch.cuda.mem_get_info", lambda device=None: (props.total_memory,) * 2),
        mock.patch("torch.cuda.current_device", lambda: 0),
    ]
    with contextlib.ExitStack() as stack:
        for patch in patches:
            stack.enter_context(patch)
        _clear_device_caches("sglang")
        try:
            yield
        finally:
            _clear_device_caches("sglang")


def _clear_device_caches(package: str) -> None:
    """Device answers an engine caches per process (lru_cache: capability, memory, `is_sm90`...)
    are asked again under another fake GPU."""
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] != package or module is None:
            continue
        for value in list(vars(module).values()):
            if isinstance(value, functools._lru_cache_wrapper):
                value.cache_clear()


SGLANG_FIELDS = (
    "chunked_prefill_size",
    "max_prefill_tokens",
    "max_running_requests",
    "max_total_tokens",
    "page_size",
    "disable_radix_cache",
    "kv_cache_dtype",
    "tp_size",
    "ep_size",
    "mem_fraction_static",
    "quantization",
    "context_length",
    "schedule_policy",
    "enable_priority_scheduling",
    "schedule_low_priority_values_first",
    "schedule_conservativeness",
    "cuda_graph_max_bs",
    "attention_backend",
    "device",
    "enable_mixed_chunk",
    "speculative_algorithm",
    "speculative_draft_model_path",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
)


def sglang_resolve(argv: list[str], *, gpu: str = "h100") -> dict[str, object]:
    """`sglang serve ARGV` (ARGV holds `--model-path`): prepare_server_args + resolve_once."""
    _prepare_imports()
    with _sglang_gpu(GPUS[gpu]):
        from sglang.srt.server_args import prepare_server_args

        with _rejections("sglang"):
            server_args = prepare_server_args(list(argv))
            server_args.resolve_once()
            resolved = server_args.resolved_dict()
    return {name: resolved.get(name) for name in SGLANG_FIELDS}


def sglang_defaults(model_dir: str | os.PathLike[str], gpu: str = "h100") -> dict[str, object]:
    return sglang_resolve(["--model-path", str(model_dir)], gpu=gpu)


def resolve_launch_line(line: str, *, gpu: str = "h100") -> tuple[str, dict[str, object]]:
    """A whole printed command (`vllm serve ...`, `sglang serve ...` or
    `python -m sglang.launch_server ...`, shell-quoted, `\\`-continued): (engine, landed)."""
    words = shlex.split(line.replace("\\\n", " "))
    if words[:2] == ["vllm", "serve"]:
        return "vllm", vllm_resolve(words[2:], gpu=gpu)
    if words[:2] == ["sglang", "serve"]:
        return "sglang", sglang_resolve(words[2:], gpu=gpu)
    if len(words) > 2 and words[1:3] == ["-m", "sglang.launch_server"]:
        return "sglang", sglang_resolve(words[3:], gpu=gpu)
    raise ValueError(f"not a vllm or sglang launch line: {line[:80]!r}")


# --------------------------------------------------------------------------------------
# A checkpoint both engines accept: config (and tokenizer) only, no weights.

_LLAMA_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "num_hidden_layers": 4,
    "vocab_size": 1024,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-5,
    "rope_theta": 1000000.0,
    "torch_dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
}

_GROUP_W4A16 = {
    "targets": ["Linear"],
    "weights": {
        "num_bits": 4,
        "type": "int",
        "symmetric": True,
        "strategy": "group",
        "group_size": 128,
        "dynamic": False,
        "actorder": None,
        "observer": "minmax",
    },
    "input_activations": None,
    "output_activations": None,
}

# What the config.json of a real pre-quantized checkpoint of each kind carries (AutoAWQ,
# AutoGPTQ/GPTQModel, llm-compressor W4A16, an FP8 checkpoint, bitsandbytes 4-bit).
QUANTIZATION_CONFIGS: dict[str, dict[str, Any]] = {
    "awq": {
        "quant_method": "awq",
        "bits": 4,
        "group_size": 128,
        "zero_point": True,
        "version": "gemm",
        "modules_to_not_convert": None,
    },
    "gptq": {
        "quant_method": "gptq",
        "bits": 4,
        "group_size": 128,
        "desc_act": False,
        "sym": True,
        "damp_percent": 0.01,
        "true_sequential": True,
        "static_groups": False,
        "lm_head": False,
        "checkpoint_format": "gptq",
    },
    "compressed-tensors": {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "config_groups": {"group_0": _GROUP_W4A16},
        "ignore": ["lm_head"],
        "quantization_status": "compressed",
        "kv_cache_scheme": None,
    },
    "fp8": {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]},
    "bitsandbytes": {
        "quant_method": "bitsandbytes",
        "load_in_4bit": True,
        "load_in_8bit": False,
        "bnb_4bit_quant_type": "nf4",
        "bnb_4bit_compute_dtype": "bfloat16",
        "bnb_4bit_use_double_quant": False,
        "bnb_4bit_quant_storage": "uint8",
    },
}


_MIXTRAL_CHANGES: dict[str, Any] = {
    "architectures": ["MixtralForCausalLM"],
    "model_type": "mixtral",
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
}


def make_hf_checkpoint(
    directory: str | os.PathLike[str],
    *,
    quantization: str | None = None,
    moe: bool = False,
    layers: int | None = None,
) -> Path:
    """A tiny Llama checkpoint directory, built locally: config.json and a word-level tokenizer.

    With `quantization`, config.json carries the `quantization_config` of a pre-quantized
    checkpoint of that kind (keys of QUANTIZATION_CONFIGS). `moe`: a Mixtral (8 experts, top 2),
    for expert-parallel lines. `layers`: fewer decoder layers (a draft model's checkpoint).
    """
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    config = dict(_LLAMA_CONFIG) | (_MIXTRAL_CHANGES if moe else {})
    if layers is not None:
        config["num_hidden_layers"] = layers
    if quantization is not None:
        if quantization not in QUANTIZATION_CONFIGS:
            raise ValueError(
                f"no checkpoint kind {quantization!r}; one of {list(QUANTIZATION_CONFIGS)}"
            )
        config["quantization_config"] = QUANTIZATION_CONFIGS[quantization]
        if quantization != "bitsandbytes":
            config["torch_dtype"] = "float16" if quantization in ("awq", "gptq") else "bfloat16"
    (path / "config.json").write_text(json.dumps(config, indent=2))
    _write_tokenizer(path, config["vocab_size"])
    return path


def _write_tokenizer(path: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    specials = ["<unk>", "<s>", "</s>"]
    vocab = {token: i for i, token in enumerate(specials)}
    for i in range(len(specials), vocab_size):
        vocab[f"w{i}"] = i
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "model_max_length": _LLAMA_CONFIG["max_position_embeddings"],
            },
            indent=2,
        )
    )
