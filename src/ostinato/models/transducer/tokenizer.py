"""SentencePiece decoding (ids -> text) without the sentencepiece library.

A SentencePiece ``.model`` file is a ``ModelProto`` protobuf; decoding needs only its piece table
(field 1: repeated ``SentencePiece {string piece = 1; float score = 2; Type type = 3}``). This
reads that table with a minimal protobuf wire-format walker and decodes the way
``SentencePieceProcessor.decode_ids`` does: pieces joined, "▁" turned into spaces, the leading
space of the text dropped, byte pieces (``<0xNN>``) gathered into UTF-8, control pieces dropped and
the unknown piece shown as " ⁇ ".
"""
from __future__ import annotations

import re
from typing import List, Sequence, Tuple

from ...errors import UnsupportedCheckpointError

SPACE = "\u2581"
UNKNOWN_SURFACE = " \u2047 "
# SentencePiece.Type
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
_BYTE_PIECE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def _varint(data: bytes, pos: int) -> Tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated varint")
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _fields(data: bytes):
    """Yield (field number, wire type, value) of one protobuf message."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 1:
            value, pos = data[pos:pos + 8], pos + 8
        elif wire == 2:
            n, pos = _varint(data, pos)
            value, pos = data[pos:pos + n], pos + n
        elif wire == 5:
            value, pos = data[pos:pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        if pos > len(data):
            raise ValueError("truncated message")
        yield number, wire, value


def parse_pieces(data: bytes) -> List[Tuple[str, int]]:
    """(piece, type) for every piece of a serialized SentencePiece ModelProto."""
    pieces = []
    for number, wire, value in _fields(data):
        if number == 1 and wire == 2:
            piece, kind = "", NORMAL
            for n, w, v in _fields(value):
                if n == 1 and w == 2:
                    piece = v.decode("utf-8")
                elif n == 3 and w == 0:
                    kind = v
            pieces.append((piece, kind))
    return pieces


class SentencePieceDecoder:
    """Turns token ids of a SentencePiece vocabulary into text."""

    def __init__(self, pieces: Sequence[Tuple[str, int]]):
        if not pieces:
            raise ValueError("no pieces")
        self.pieces = [p for p, _ in pieces]
        self.types = [t for _, t in pieces]
        # ids whose text is their piece (no byte merging, nothing dropped): most transcripts hold only these
        self._plain = frozenset(i for i, t in enumerate(self.types) if t not in (BYTE, CONTROL, UNUSED, UNKNOWN))

    @classmethod
    def from_bytes(cls, data: bytes, name: str = "tokenizer.model") -> "SentencePieceDecoder":
        try:
            pieces = parse_pieces(data)
            if not pieces:
                raise ValueError("it holds no pieces")
            return cls(pieces)
        except (ValueError, UnicodeDecodeError) as exc:
            raise UnsupportedCheckpointError(f"{name} is not a readable SentencePiece model: {exc}") from None

    @property
    def vocab_size(self) -> int:
        return len(self.pieces)

    def id_to_piece(self, i: int) -> str:
        return self.pieces[i]

    def decode(self, ids: Sequence[int]) -> str:
        ids = [int(i) for i in ids]
        if self._plain.issuperset(ids):  # the rules below, in one join
            text = "".join([self.pieces[i] for i in ids])
            return (text[1:] if text.startswith(SPACE) else text).replace(SPACE, " ")
        out: List[str] = []
        pending = bytearray()
        at_start = True  # the dummy-prefix space of the first word is not part of the text

        def emit(text: str, from_piece: bool):
            nonlocal at_start
            if at_start and from_piece and text.startswith(SPACE):
                text = text[1:]
            at_start = False
            out.append(text)

        def flush():
            if pending:
                emit(pending.decode("utf-8", errors="replace"), False)
                pending.clear()

        for i in ids:
            i = int(i)
            if not 0 <= i < len(self.pieces):
                raise ValueError(f"token id {i} is outside the vocabulary of {len(self.pieces)}")
            kind, piece = self.types[i], self.pieces[i]
            if kind == BYTE:
                m = _BYTE_PIECE.match(piece)
                if m:
                    pending.append(int(m.group(1), 16))
                    continue
            flush()
            if kind in (CONTROL, UNUSED):
                continue
            if kind == UNKNOWN:
                emit(UNKNOWN_SURFACE, False)
            else:
                emit(piece, True)
        flush()
        return "".join(out).replace(SPACE, " ")

    def starts_word(self, i: int) -> bool:
        """Whether token ``i`` begins a new word (its piece starts with the space mark)."""
        return self.pieces[int(i)].startswith(SPACE)


