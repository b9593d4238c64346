"""Language models against transformers (CPU, float32): the tiny random checkpoints in
tests/data/llm were written by transformers itself (dev/make_tiny_llms.py) in each real layout."""
from __future__ import annotations

import os

import pytest
import torch

from ostinato import LanguageModel

transformers = pytest.importorskip("transformers")

DATA = os.path.join(os.path.dirname(__file__), "data", "llm")
NAMES = ["llama", "qwen3", "qwen3_moe", "qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe"]
# across the delta rule's 64-token chunks, and the prefill's own chunks (prefill_chunk=48 below)
LENGTHS = [1, 2, 17, 47, 48, 63, 64, 65, 129, 200]
NEW_TOKENS = 12


def reference(name):
    path = os.path.join(DATA, name)
    loader = transformers.AutoModelForImageTextToText if name in ("qwen3_5", "qwen3_5_moe") else \
        transformers.AutoModelForCausalLM
    return loader.from_pretrained(path, dtype=torch.float32).eval()


def prompts(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 320, (n,), generator=g).tolist() for n in LENGTHS]


@pytest.mark.parametrize("name", NAMES)
def test_greedy_tokens_equal_transformers_generate(name):
    ref = reference(name)
    model = LanguageModel(os.path.join(DATA, name), device="cpu", prefill_chunk=48, max_batch_size=4)
    batch = prompts()
    got = model.generate(batch, max_new_tokens=NEW_TOKENS)  # all in one call: rows refill as prompts finish
    for prompt, out in zip(batch, got):
        with torch.no_grad():
            want = ref.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False)
        want = want[0, len(prompt):].tolist()
        assert list(out) == want, f"{name}: prompt of {len(prompt)} tokens"
        assert out.finish_reason == ("stop" if want[-1] in model.config.eos_token_ids else "length")
        assert out.prompt_tokens == len(prompt)


def exact_logits(ref, ids):
    """transformers' logits in float32 and in float64 (the exact answer, near enough): how far its own
    float32 run lands from the exact one sets what "within float32 tolerance" means for a model."""
    with torch.no_grad():
        want32 = ref(ids).logits[0].double()
        ref.double()
        if hasattr(ref, "set_experts_implementation"):  # the grouped-mm experts take no float64
            ref.set_experts_implementation("eager")
        want64 = ref(ids).logits[0]
    return want64, (want32 - want64).abs().max().item()


def assert_float32_close(got, want64, ref_error):
    """As close to the exact logits as transformers' float32 run is, give or take rounding order
    (fusing projections into one GEMM reorders sums; a 200-token recurrence amplifies that)."""
    error = (got.double() - want64).abs().max().item()
    assert error <= 3 * ref_error + 2e-5, f"max error {error:.2e} against transformers' own {ref_error:.2e}"


@pytest.mark.parametrize("name", NAMES)
def test_logits_equal_transformers_within_float32_tolerance(name):
    ref = reference(name)
    model = LanguageModel(os.path.join(DATA, name), device="cpu")
    ids = torch.tensor([prompts(1)[-1]])  # 200 tokens
    want, ref_error = exact_logits(ref, ids)
    model.decoder.ensure(1, ids.shape[1], 1)
    rows = torch.tensor([0])
    with torch.no_grad():
        got = model.net.logits(model.net.prefill(ids, rows, 0, model.decoder.state))[0]
    assert_float32_close(got, want, ref_error)
    # the same prompt prefilled in three chunks: attention over the chunk plus the cache, the delta
    # rule and the conv window carried across chunks
    model.net.reset_rows(model.decoder.state, rows)
    with torch.no_grad():
        parts = [model.net.prefill(ids[:, s:e], rows, s, model.decoder.state) for s, e in ((0, 70), (70, 71), (71, 200))]
    assert_float32_close(model.net.logits(torch.cat(parts, dim=1))[0], want, ref_error)


def test_decode_step_logits_equal_transformers():
    """Each decode step's logits (the recurrent delta rule, the conv window, the KV cache) against
    transformers run over the whole sequence so far."""
    ref = reference("qwen3_next")
    model = LanguageModel(os.path.join(DATA, "qwen3_next"), device="cpu")
    prompt = prompts(2)[3]
    out = model.generate([prompt], max_new_tokens=6)[0]
    seq = torch.tensor([prompt + list(out)])
    with torch.no_grad():
        want = ref(seq).logits[0, len(prompt) - 1:-1]
    assert want.argmax(-1).tolist() == list(out)
    st = model.decoder.state
    model.decoder.ensure(1, seq.shape[1] + 1, 1)
    st = model.decoder.state
    rows = torch.tensor([0])
    model.net.reset_rows(st, rows)
    with torch.no_grad():
        got = [model.net.logits(model.net.prefill(torch.tensor([prompt]), rows, 0, st)[:, -1])[0]]
        for i, token in enumerate(list(out)[:-1]):
            got.append(model.net.decode(torch.tensor([token]), torch.tensor([len(prompt) + i]), st, 1)[0])
    torch.testing.assert_close(torch.stack(got), want.float(), rtol=1e-4, atol=5e-4)


def test_chat_template_renders_as_transformers():
    tokenizer = transformers.AutoTokenizer.from_pretrained(os.path.join(DATA, "qwen3"))
    model = LanguageModel(os.path.join(DATA, "qwen3"), device="cpu")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "the quick brown fox"}]
    want = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert model.tokenizer.apply_chat_template(messages) == want
    assert model.chat_prompt(messages) == tokenizer(want, add_special_tokens=False)["input_ids"]
    reply = model.chat(messages, max_new_tokens=5)
    assert list(reply) == model.generate([model.chat_prompt(messages)], max_new_tokens=5)[0]
    assert reply.text == tokenizer.decode(list(reply), skip_special_tokens=True)
