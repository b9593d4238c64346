"""``testing.measure.llm_prefill_flops`` (the work behind bench/llm_gpu.py's prefill rate) against the
matrix products a real prefill runs on the CPU, counted by PyTorch's FlopCounterMode."""
import torch
from torch.utils.flop_counter import FlopCounterMode

from ostinato.testing.measure import llm_prefill_flops
from ostinato.testing.random_llms import random_network

LLAMA = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 300,
         "rope_theta": 10000.0, "max_position_embeddings": 256, "tie_word_embeddings": False, "rms_norm_eps": 1e-6}


def test_prefill_work_is_what_a_prefill_multiplies():
    tokens = 40
    net = random_network(LLAMA, "cpu", torch.float32)
    state = {name: torch.zeros(shape, dtype=dtype) for name, (shape, dtype) in net.state_spec(1, 64).items()}
    ids = torch.randint(0, LLAMA["vocab_size"], (1, tokens))
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        hidden = net.prefill(ids, torch.tensor([0]), 0, state)
        net.logits(hidden[:, -1])  # what generate projects: the last token only
    # the projections as PyTorch ran them (aten.mm: attention runs as its own kernel, not counted here)
    products = {"mm", "addmm", "bmm"}
    counted = sum(n for op, n in counter.get_flop_counts()["Global"].items() if op.__name__.split(".")[-1] in products)
    heads, dim, layers = LLAMA["num_attention_heads"], LLAMA["head_dim"], LLAMA["num_hidden_layers"]
    # causal attention's score and value products: a query at position p reads p + 1 keys
    attention = layers * 2 * 2 * heads * dim * tokens * (tokens + 1) // 2
    assert llm_prefill_flops(net, tokens) == counted + attention
    # the projections by hand: every layer's for every token, the vocabulary once (the last token's)
    d, ff, kv, vocab = 64, 96, 2 * 16, 300
    per_token = layers * (d * heads * dim + 2 * d * kv + heads * dim * d + 3 * d * ff)
    assert counted == 2 * tokens * per_token + 2 * vocab * d
