"""coldkv: long-context LLM inference with compressed, paged KV caches."""
from pathlib import Path

__version__ = "0.1.0"

# The small checkpoint coldkv trains and ships itself (see coldkv/models/*/MODEL_CARD.md).
DEFAULT_MODEL: Path = Path(__file__).parent / "models" / "coldkv-tiny"
