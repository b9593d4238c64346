"""Decoder-only language models: Llama, Qwen3, Qwen3-MoE, and the Qwen3-Next / Qwen3.5 hybrids."""
from .config import LLMConfig, parse_config, read_config
from .model import Generation, LanguageModel

__all__ = ["Generation", "LLMConfig", "LanguageModel", "parse_config", "read_config"]
