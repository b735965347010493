"""The real executor: a paged-KV Llama-family model in PyTorch with pluggable attention."""

from slotune.engine.model.executor import TorchExecutor

__all__ = ["TorchExecutor"]
