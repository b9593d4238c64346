"""Check ostinato.ops.embedding against PyTorch's ``token_weight[tokens] + position_weight[positions]``, bit for bit.

    TRITON_INTERPRET=1 PYTHONPATH=src:/path/to/triton python dev/embedding_check.py   # CPU
    PYTHONPATH=src python dev/embedding_check.py                                     # on a GPU

Rows of one token each (a decode step: tokens [B, 1] as views of wider per-row buffers) and of several
(a prompt's prefill: [B, T]); int64 and int32 indices; a width that is not a power of two; the key
counts ``positions + 1`` in the positions' dtype. Ends with ``embedding == torch: True`` (exit 1 otherwise).
"""
import sys

import torch

from ostinato.ops import embedding
from decode_attention_check import run_half_cases

VOCAB, CONTEXT = 51864, 448


def check(device, dtype, rows, tokens_per_row, width, index_dtype) -> bool:
    token_weight = torch.randn(VOCAB, width, device=device).to(dtype)
    position_weight = torch.randn(CONTEXT, width, device=device).to(dtype)
    # a decode step's inputs are the first rows of its per-row buffers, [B, 1] views
    tokens = torch.randint(0, VOCAB, (rows + 3, tokens_per_row), device=device, dtype=index_dtype)[:rows]
    positions = torch.randint(0, CONTEXT, (rows + 3, tokens_per_row), device=device, dtype=index_dtype)[:rows]
    tokens[0, 0], positions[0, 0] = VOCAB - 1, CONTEXT - 1  # the last rows of both tables
    x, lengths = embedding.embed_rows(tokens, positions, token_weight, position_weight)
    want = (token_weight[tokens] + position_weight[positions]).reshape(-1, width)
    ok = (x.dtype == dtype and torch.equal(x.view(torch.uint8), want.view(torch.uint8))
          and lengths.dtype == index_dtype and torch.equal(lengths, positions.reshape(-1) + 1))
    print(f"rows {rows} x {tokens_per_row} width {width} {str(dtype)[6:]} indices {str(index_dtype)[6:]}: "
          f"{'ok' if ok else 'FAIL'}")
    return ok


def main() -> int:
    cases = [(1, 1, 384, torch.int64), (16, 1, 384, torch.int64), (5, 1, 1280, torch.int32),
             (3, 7, 384, torch.int64), (2, 3, 1000, torch.int64)]
    return run_half_cases(embedding.HAVE_TRITON, cases, check, "embedding == torch")


if __name__ == "__main__":
    sys.exit(main())
