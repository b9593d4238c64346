"""Where an OpenAI checkpoint's tokenizer comes from (a .pt carries no vocabulary).

A tokenizer.json beside the checkpoint wins. Otherwise the vocabulary is Whisper's own:
ostinato ships openai-whisper's two byte-pair vocabularies (GPT-2's for English-only models,
the multilingual one for the others) as gzipped tokenizer.json files built by
dev/make_vocabularies.py, and appends Whisper's special tokens here with openai-whisper's
exact ids and order. How many language tokens there are follows from the checkpoint's
n_vocab, exactly as openai-whisper derives it, so every official checkpoint (English-only
51864, multilingual 51865 with 99 languages, large-v3 and turbo 51866 with 100) gets its
vocabulary. The result is written once to a cache file, since the rest of the runtime reads
tokenizers from files.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import tempfile
from importlib import resources
from pathlib import Path
from typing import List, Tuple

from ostinato import settings
from ostinato.errors import ModelLoadError
from ostinato.models.whisper.segments import TIME_PRECISION, WINDOW_SECONDS

ENGLISH_VOCAB_SIZE = 51864

# openai-whisper's LANGUAGES, in its order: a vocabulary with N language tokens holds the first N.
LANGUAGE_CODES: Tuple[str, ...] = (
    "en", "zh", "de", "es", "ru", "ko", "fr", "ja", "pt", "tr", "pl", "ca", "nl", "ar", "sv",
    "it", "id", "hi", "fi", "vi", "he", "uk", "el", "ms", "cs", "ro", "da", "hu", "ta", "no",
    "th", "ur", "hr", "bg", "lt", "la", "mi", "ml", "cy", "sk", "te", "fa", "lv", "bn", "sr",
    "az", "sl", "kn", "et", "mk", "br", "eu", "is", "hy", "ne", "mn", "bs", "kk", "sq", "sw",
    "gl", "mr", "pa", "si", "km", "sn", "yo", "so", "af", "oc", "ka", "be", "tg", "sd", "gu",
    "am", "yi", "lo", "uz", "fo", "ht", "ps", "tk", "nn", "mt", "sa", "lb", "my", "bo", "tl",
    "mg", "as", "tt", "haw", "ln", "ha", "ba", "jw", "su", "yue",
)

# Package data (ostinato/models/whisper/assets/): byte-level BPE plus <|endoftext|> only.
_BASE_FILES = {False: "english.tokenizer.json.gz", True: "multilingual.tokenizer.json.gz"}
_BASE_SIZES = {False: 50256, True: 50257}  # byte-pair tokens before <|endoftext|>
_NUM_TIMESTAMPS = round(WINDOW_SECONDS / TIME_PRECISION) + 1  # <|0.00|> .. <|30.00|>
_FORMAT = 1  # bump when the generated file changes for the same package data


def find_tokenizer(directory: Path, n_vocab: int) -> Path:
    """tokenizer.json beside the checkpoint; else Whisper's own vocabulary for n_vocab."""
    local = Path(directory) / "tokenizer.json"
    if local.is_file():
        return local
    return whisper_tokenizer_file(n_vocab)


def vocabulary_layout(n_vocab: int) -> Tuple[bool, int]:
    """(multilingual, number of language tokens) of the openai-whisper vocabulary of size n_vocab.

    openai-whisper's own rule: multilingual when n_vocab >= 51865, and
    num_languages = n_vocab - 51765 - int(multilingual).
    """
    multilingual = n_vocab >= 51865
    num_languages = n_vocab - 51765 - int(multilingual)
    if not 0 <= num_languages <= len(LANGUAGE_CODES):
        raise ModelLoadError(
            f"n_vocab {n_vocab} is no Whisper vocabulary size (51864 English-only, 51865 or 51866 "
            "multilingual): put the checkpoint's tokenizer.json beside it"
        )
    return multilingual, num_languages


def special_tokens(num_languages: int) -> List[str]:
    """Whisper's special tokens in id order, from <|endoftext|> on (openai-whisper's get_encoding)."""
    return [
        "<|endoftext|>",
        "<|startoftranscript|>",
        *[f"<|{code}|>" for code in LANGUAGE_CODES[:num_languages]],
        "<|translate|>",
        "<|transcribe|>",
        "<|startoflm|>",
        "<|startofprev|>",
        "<|nospeech|>",
        "<|notimestamps|>",
        *[f"<|{i * TIME_PRECISION:.2f}|>" for i in range(_NUM_TIMESTAMPS)],
    ]


def _base_bytes(multilingual: bool) -> bytes:
    name = _BASE_FILES[multilingual]
    try:
        return resources.files("ostinato.models.whisper").joinpath("assets").joinpath(name).read_bytes()
    except (FileNotFoundError, OSError) as exc:
        raise ModelLoadError(
            f"ostinato's packaged Whisper vocabulary {name} is missing ({exc}): reinstall ostinato "
            "or put the checkpoint's tokenizer.json beside it"
        ) from None


def build_tokenizer_json(n_vocab: int, base: bytes | None = None) -> dict:
    """The tokenizer.json (as a dict) of openai-whisper's vocabulary of size n_vocab."""
    multilingual, num_languages = vocabulary_layout(n_vocab)
    data = json.loads(gzip.decompress(base if base is not None else _base_bytes(multilingual)))
    eot = _BASE_SIZES[multilingual]
    if len(data["model"]["vocab"]) != eot + 1 or data["model"]["vocab"].get("<|endoftext|>") != eot:
        raise ModelLoadError(f"ostinato's packaged vocabulary {_BASE_FILES[multilingual]} is damaged")
    names = special_tokens(num_languages)
    data["added_tokens"] = [
        {"id": eot + i, "content": name, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for i, name in enumerate(names)
    ]
    assert eot + len(names) == n_vocab
    ids = {name: eot + i for i, name in enumerate(names)}
    # As in HF's Whisper tokenizer.json: encode(..., add_special_tokens=True) frames the text.
    frame = ["<|startoftranscript|>", "<|notimestamps|>"]
    data["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [*({"SpecialToken": {"id": t, "type_id": 0}} for t in frame),
                   {"Sequence": {"id": "A", "type_id": 0}},
                   {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}],
        "pair": [*({"SpecialToken": {"id": t, "type_id": 0}} for t in frame),
                 {"Sequence": {"id": "A", "type_id": 0}},
                 {"Sequence": {"id": "B", "type_id": 1}},
                 {"SpecialToken": {"id": "<|endoftext|>", "type_id": 1}}],
        "special_tokens": {t: {"id": t, "ids": [ids[t]], "tokens": [t]}
                           for t in ("<|endoftext|>", "<|notimestamps|>", "<|startoftranscript|>")},
    }
    return data


def _cache_dirs() -> List[Path]:
    return [folder / "vocab" for folder in settings.cache_dirs()]


def whisper_tokenizer_file(n_vocab: int) -> Path:
    """A tokenizer.json holding openai-whisper's vocabulary of size n_vocab, built once and cached.

    The file name carries n_vocab and a digest of the packaged vocabulary, so a new ostinato
    release never reads a stale file. Written atomically; an unwritable cache falls back to
    the temp directory.
    """
    multilingual, _ = vocabulary_layout(n_vocab)
    base = _base_bytes(multilingual)
    digest = hashlib.sha256(base + f"/{_FORMAT}".encode()).hexdigest()[:16]
    name = f"whisper-{n_vocab}-{digest}.tokenizer.json"
    dirs = _cache_dirs()
    for d in dirs:
        if (d / name).is_file():
            return d / name
    text = json.dumps(build_tokenizer_json(n_vocab, base), ensure_ascii=False, separators=(",", ":"))
    errors = []
    for d in dirs:
        try:
            d.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=name + ".", suffix=".tmp", dir=d)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    f.write(text)
                os.replace(tmp, d / name)
            except BaseException:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
                raise
            return d / name
        except OSError as exc:
            errors.append(f"{d}: {exc.strerror or exc}")
    raise ModelLoadError(
        f"cannot write Whisper's vocabulary to a cache directory ({'; '.join(errors)}): "
        "set OSTINATO_CACHE to a writable directory or put tokenizer.json beside the checkpoint"
    )
