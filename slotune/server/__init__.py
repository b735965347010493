"""slotune's OpenAI-compatible HTTP server over the embedded engine.

engine, served = local_model(EngineConfig(max_model_len=2048), "tiny-model/")
serve(engine, served, port=8000)   # or: slotune serve --model tiny-model/
"""

from slotune.server.app import create_app, serve
from slotune.server.async_engine import AsyncEngine
from slotune.server.served import ServedModel, local_model, simulated_model

__all__ = ["AsyncEngine", "ServedModel", "create_app", "local_model", "serve", "simulated_model"]
