"""Whisper's tokenizer: text <-> ids through a ``tokenizer.json``, plus the special tokens decoding needs."""
from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from ...errors import InvalidOptionError, ModelLoadError
from .segments import TIME_PRECISION

# Symbols Whisper's decoders keep out of transcripts (speaker tags, music notes, bracketed
# annotations); basic punctuation stays allowed. The rule is Whisper's own.
_NON_SPEECH_SYMBOLS = list('"#()*+/:;<=>@[\\]^_`{|}~「」『』') + (
    "<< >> <<< >>> -- --- -( -[ (' (\" (( )) ((( ))) [[ ]] {{ }} ♪♪ ♪♪♪".split()
)
# Music symbols span several byte-level tokens; suppressing their first token is enough.
_MUSIC_SYMBOLS = set("♩♪♫♬♭♮♯")


class WhisperTokenizer:
    def __init__(self, tokenizer_file: Path | str, multilingual: bool, num_languages: int = 99):
        try:
            from tokenizers import Tokenizer
        except ImportError as exc:  # pragma: no cover - a hard dependency
            raise ModelLoadError("the 'tokenizers' package is required") from exc
        try:
            self._tok = Tokenizer.from_file(str(tokenizer_file))
        except Exception as exc:
            raise ModelLoadError(f"cannot read tokenizer file {tokenizer_file}: {exc}") from None
        self.multilingual = multilingual
        self.num_languages = num_languages
        ids = self._special_ids()
        self.eot = ids["<|endoftext|>"]
        self.sot = ids["<|startoftranscript|>"]
        self.sot_prev = ids["<|startofprev|>"]
        self.sot_lm = ids["<|startoflm|>"]
        self.no_timestamps = ids["<|notimestamps|>"]
        self.transcribe = ids["<|transcribe|>"]
        self.translate = ids["<|translate|>"]
        self.no_speech = self._tok.token_to_id("<|nospeech|>")
        if self.no_speech is None:
            self.no_speech = ids["<|nocaptions|>"]
        self.timestamp_begin = self.no_timestamps + 1

    def _special_ids(self) -> Dict[str, int]:
        names = [
            "<|endoftext|>", "<|startoftranscript|>", "<|startofprev|>", "<|startoflm|>",
            "<|notimestamps|>", "<|transcribe|>", "<|translate|>",
        ]
        out = {}
        for name in names:
            i = self._tok.token_to_id(name)
            if i is None:
                raise ModelLoadError(f"tokenizer has no {name} token: not a Whisper tokenizer")
            out[name] = i
        if self._tok.token_to_id("<|nospeech|>") is None:
            i = self._tok.token_to_id("<|nocaptions|>")
            if i is None:
                raise ModelLoadError("tokenizer has neither <|nospeech|> nor <|nocaptions|>: not a Whisper tokenizer")
            out["<|nocaptions|>"] = i
        return out

    # -- languages -----------------------------------------------------------------------------
    @cached_property
    def language_codes(self) -> Tuple[str, ...]:
        """Language codes in vocabulary order (the tokens right after <|startoftranscript|>)."""
        codes = []
        for i in range(self.sot + 1, self.sot + 1 + self.num_languages):
            token = self._tok.id_to_token(i)
            if token is None or not (token.startswith("<|") and token.endswith("|>")):
                break
            codes.append(token[2:-2])
        return tuple(codes)

    @cached_property
    def language_token_ids(self) -> Tuple[int, ...]:
        return tuple(self.sot + 1 + i for i in range(len(self.language_codes)))

    def language_token(self, code: str) -> int:
        try:
            return self.sot + 1 + self.language_codes.index(code)
        except ValueError:
            raise InvalidOptionError(
                f"unknown language {code!r}: use a Whisper language code such as en, de, fr, ja"
            ) from None

    def sot_sequence(self, language: Optional[str], task: str) -> List[int]:
        seq = [self.sot]
        if self.multilingual:
            seq.append(self.language_token(language or "en"))
            seq.append(self.translate if task == "translate" else self.transcribe)
        return seq

    # -- text ----------------------------------------------------------------------------------
    def encode(self, text: str) -> List[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode([i for i in ids if i < self.eot])

    def decode_with_timestamps(self, ids: Sequence[int]) -> str:
        out, text = [], []
        for i in ids:
            if i >= self.timestamp_begin:
                if text:
                    out.append(self.decode(text))
                    text = []
                out.append(f"<|{(i - self.timestamp_begin) * TIME_PRECISION:.2f}|>")
            else:
                text.append(i)
        if text:
            out.append(self.decode(text))
        return "".join(out)

    @cached_property
    def non_speech_tokens(self) -> Tuple[int, ...]:
        # Hyphens and apostrophes are fine inside words but not as a word's first token.
        result = {self.encode(" -")[0], self.encode(" '")[0]}
        for symbol in _NON_SPEECH_SYMBOLS + sorted(_MUSIC_SYMBOLS):
            for ids in (self.encode(symbol), self.encode(" " + symbol)):
                if len(ids) == 1 or symbol in _MUSIC_SYMBOLS:
                    result.add(ids[0])
        return tuple(sorted(result))

    def suppressed_tokens(self, suppress_tokens: Optional[Sequence[int]]) -> Tuple[int, ...]:
        """The ids never to emit: user ids (-1 stands for the non-speech set) and the task tokens."""
        ids = set()
        for t in suppress_tokens or ():
            if t == -1:
                ids.update(self.non_speech_tokens)
            elif t >= 0:
                ids.add(int(t))
            else:
                raise InvalidOptionError(f"invalid suppress token id {t}")
        ids.update([self.transcribe, self.translate, self.sot, self.sot_prev, self.sot_lm, self.no_speech])
        return tuple(sorted(ids))
