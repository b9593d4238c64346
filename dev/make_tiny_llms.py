"""Build the tiny random language-model checkpoints the tests load (tests/data/llm/<name>/).

Each is made by transformers itself from a small config in the real layout (config.json,
model.safetensors, tokenizer.json, tokenizer_config.json with a chat template, generation_config.json),
so the loader meets exactly what transformers writes. Weights are drawn at a scale where every layer
moves the residual stream (so a wrong layer changes the tokens) and the output projection is large
enough that greedy choices are far from ties.

    python dev/make_tiny_llms.py            # needs transformers (pip install 'ostinato[bench]')
"""
from __future__ import annotations

import argparse
import json
import os
import shutil

import torch

VOCAB = 320
HIDDEN = 64
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "a small model reads tokens one at a time and writes the next",
    "graphs replay the same kernels without the host in the loop",
    "hello world, this is a tiny language model made for tests",
    "numbers like 12, 345 and 6789 appear in text too",
    "rows finish at different times and new prompts take their place",
]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def tokenizer_files(folder: str) -> dict:
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - 8, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 20, trainer)
    tok.save(os.path.join(folder, "tokenizer.json"))
    ids = {s: tok.token_to_id(s) for s in SPECIALS}
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "chat_template": CHATML,
                   "tokenizer_class": "PreTrainedTokenizerFast"}, f, indent=1)
    return ids


def common(ids: dict) -> dict:
    return dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=1024, rms_norm_eps=1e-6, initializer_range=HIDDEN ** -0.5,
                eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]], bos_token_id=None,
                pad_token_id=ids["<|endoftext|>"])


def build(name: str, ids: dict):
    import transformers as tf

    c = common(ids)
    hybrid = dict(head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                  linear_value_head_dim=16, linear_conv_kernel_dim=4, num_hidden_layers=4,
                  layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"])
    moe = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)
    if name == "llama":
        rope = dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                    original_max_position_embeddings=64)
        config = tf.LlamaConfig(**c, intermediate_size=128, num_hidden_layers=2, rope_parameters=rope,
                                tie_word_embeddings=False)
        return tf.LlamaForCausalLM(config)
    if name == "qwen3":
        config = tf.Qwen3Config(**c, intermediate_size=128, num_hidden_layers=2, head_dim=32,
                                tie_word_embeddings=True)
        return tf.Qwen3ForCausalLM(config)
    if name == "qwen3_moe":
        config = tf.Qwen3MoeConfig(**c, **moe, intermediate_size=96, num_hidden_layers=3, head_dim=16,
                                   decoder_sparse_step=1, mlp_only_layers=[1], norm_topk_prob=True,
                                   tie_word_embeddings=False)
        return tf.Qwen3MoeForCausalLM(config)
    if name == "qwen3_next":
        config = tf.Qwen3NextConfig(**c, **hybrid, **moe, intermediate_size=96, shared_expert_intermediate_size=48,
                                    decoder_sparse_step=1, mlp_only_layers=[2], norm_topk_prob=True,
                                    tie_word_embeddings=False)
        return tf.Qwen3NextForCausalLM(config)
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=4,
                  out_hidden_size=HIDDEN, num_position_embeddings=16)
    if name == "qwen3_5":
        text = dict(**c, **hybrid, intermediate_size=96, tie_word_embeddings=True)
        config = tf.Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=True)
        return tf.Qwen3_5ForConditionalGeneration(config)
    if name == "qwen3_5_text":
        config = tf.Qwen3_5TextConfig(**c, **hybrid, intermediate_size=96, tie_word_embeddings=False)
        return tf.Qwen3_5ForCausalLM(config)
    if name == "qwen3_5_moe":
        text = dict(**c, **hybrid, **moe, shared_expert_intermediate_size=48, tie_word_embeddings=False)
        config = tf.Qwen3_5MoeConfig(text_config=text, vision_config=vision, tie_word_embeddings=False)
        return tf.Qwen3_5MoeForConditionalGeneration(config)
    raise SystemExit(f"unknown checkpoint {name}")


NAMES = ["llama", "qwen3", "qwen3_moe", "qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe"]


@torch.no_grad()
def spread(model) -> None:
    """Scale the output projection so the top logits stand well apart; give norms and the delta rule's
    decay parameters values away from their neutral init so a mistake in them shows."""
    head = model.get_output_embeddings().weight
    head.normal_(0.0, 0.5)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.add_(torch.randn_like(p) * 0.1)
        elif name.endswith("dt_bias"):
            p.copy_(torch.randn_like(p) * 0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "data", "llm"))
    parser.add_argument("names", nargs="*", default=NAMES)
    args = parser.parse_args()
    for i, name in enumerate(args.names):
        folder = os.path.join(args.out, name)
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)
        ids = tokenizer_files(folder)
        torch.manual_seed(1000 + NAMES.index(name))
        model = build(name, ids).eval()
        spread(model)
        model.save_pretrained(folder)
        size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
        print(f"{name}: {type(model).__name__}, {sum(p.numel() for p in model.parameters())} parameters, "
              f"{size / 1e6:.2f} MB in {folder}")


if __name__ == "__main__":
    main()
