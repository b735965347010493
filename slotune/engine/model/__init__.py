"""The real executor: a paged-KV Llama-family model in PyTorch with pluggable attention.

Needs the ``engine`` extra (torch); without it, importing anything here raises
``MissingExtra`` naming ``pip install 'slotune[engine]'``.
"""

from slotune._extras import require

require("torch", extra="engine")

from slotune.engine.model.executor import TorchExecutor  # noqa: E402

__all__ = ["TorchExecutor"]
