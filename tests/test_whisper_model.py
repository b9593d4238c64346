"""WhisperModel on the CPU with the random-weight tiny checkpoints: formats agree, the KV-cached
decoder matches a naive full-recompute decoder, one copy of the weights, dtypes, fixed state.

The checkpoints under tests/data/checkpoints come from dev/make_checkpoints.py, which rounds the
source model through float16 once, so every format stores exactly the same values: in float32
compute they must give bit-identical tokens. The reference decoder below is written with plain
torch ops (no nn.Module calls, no scaled_dot_product_attention) in float64, on the model's own
parameter tensors.
"""
from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import List, Tuple

import numpy as np
import pytest
import torch

import ostinato
from ostinato.errors import InvalidOptionError
from ostinato.models.whisper.decoding import SearchOptions, WindowDecoder, WindowRequest, default_steps_per_replay
from ostinato.runtime import duplicated_parameters

DATA = Path(__file__).parent / "data"
CKPT = DATA / "checkpoints"
OPENAI_PT = CKPT / "openai" / "tiny-random.pt"
HF_DIR = CKPT / "huggingface"
CT2_F16 = CKPT / "ctranslate2" / "float16"
CT2_F32 = CKPT / "ctranslate2" / "float32"
CLIP = DATA / "clips" / "c01_hello_short.flac"
SAMPLE = Path(__file__).resolve().parents[1] / "examples" / "sample.flac"

# Greedy decoding only (transcribe's defaults are beam search with a temperature fallback).
GREEDY = dict(beam_size=1, temperature=0.0)
# Short and deterministic: no timestamps, no skipping of "silent" windows by the random model.
SHORT = dict(GREEDY, without_timestamps=True, max_new_tokens=20, no_speech_threshold=None)
# Plain greedy argmax: no suppressed ids at all, so the naive reference needs no logit rules.
PLAIN = dict(SHORT, suppress_tokens=None, suppress_blank=False)


def load(path, compute_type="float32", **kw) -> "ostinato.WhisperModel":
    return ostinato.WhisperModel(str(path), device="cpu", compute_type=compute_type, **kw)


@pytest.fixture(scope="module")
def model():
    return load(OPENAI_PT)


@pytest.fixture(scope="module")
def ct2_float32(tmp_path_factory):
    # The float32 CT2 fixture is stored without tokenizer.json (to stay small); give it the
    # float16 copy's, which is the same vocabulary.
    target = tmp_path_factory.mktemp("ct2") / "float32"
    shutil.copytree(CT2_F32, target)
    shutil.copy(CT2_F16 / "tokenizer.json", target / "tokenizer.json")
    return target


def tokens_of(segments) -> List[List[int]]:
    return [list(s.tokens) for s in segments]


# --- a naive decoder: full recompute of the whole sequence every step, plain torch ops ----------


def _ln(x, ln):
    w, b = ln.weight.double(), ln.bias.double()
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + ln.eps) * w + b


def _linear(x, lin):
    y = x @ lin.weight.double().T
    return y + lin.bias.double() if lin.bias is not None else y


def _attention(x, source, attn, n_head, causal):
    q, k, v = _linear(x, attn.query), _linear(source, attn.key), _linear(source, attn.value)
    t, s, d = q.shape[0], k.shape[0], q.shape[1] // n_head
    q = q.view(t, n_head, d).transpose(0, 1)
    k = k.view(s, n_head, d).transpose(0, 1)
    v = v.view(s, n_head, d).transpose(0, 1)
    scores = q @ k.transpose(1, 2) / math.sqrt(d)
    if causal:
        future = torch.ones(t, s, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    weights = torch.exp(scores - scores.amax(-1, keepdim=True))
    weights = weights / weights.sum(-1, keepdim=True)
    out = (weights @ v).transpose(0, 1).reshape(t, n_head * d)
    return _linear(out, attn.out)


def _gelu(x):
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def naive_logits(whisper, tokens: List[int], audio_features: torch.Tensor) -> torch.Tensor:
    """float64 logits [len(tokens), n_vocab] for one sequence; audio_features [n_audio_ctx, d]."""
    dec = whisper.decoder
    n_head = whisper.dims.n_text_head
    audio = audio_features.double()
    embedding = dec.token_embedding.weight.double()
    ids = torch.tensor(tokens, dtype=torch.long)
    x = embedding[ids] + dec.positional_embedding.double()[: len(tokens)]
    for block in dec.blocks:
        x = x + _attention(_ln(x, block.attn_ln), _ln(x, block.attn_ln), block.attn, n_head, causal=True)
        x = x + _attention(_ln(x, block.cross_attn_ln), audio, block.cross_attn, n_head, causal=False)
        fc1, fc2 = block.mlp[0], block.mlp[2]
        x = x + _linear(_gelu(_linear(_ln(x, block.mlp_ln), fc1)), fc2)
    return _ln(x, dec.ln) @ embedding.T


def naive_greedy(whisper, prompt: List[int], audio_features, steps: int, eot: int) -> Tuple[List[int], List[torch.Tensor]]:
    """Greedy tokens (up to and including end-of-text) and the logits each one was picked from."""
    sequence, picked, logits_per_step = list(prompt), [], []
    for _ in range(steps):
        logits = naive_logits(whisper, sequence, audio_features)[-1]
        token = int(logits.argmax())
        picked.append(token)
        logits_per_step.append(logits)
        sequence.append(token)
        if token == eot:
            break
    return picked, logits_per_step


def encode_audio(m, path) -> torch.Tensor:
    from ostinato.audio import load_audio, whisper_input_features
    from ostinato.models.whisper.transcribe import N_FRAMES, pad_window

    features = whisper_input_features(load_audio(str(path)), m.dims.n_mels, device=m.device)
    return m.encode(pad_window(features, 0, min(N_FRAMES, features.shape[-1] - 1))[None])


class LogitRecorder:
    """Records every output of the decoder module (prefill and each step) through a forward hook."""

    def __init__(self, module):
        self.calls: List[torch.Tensor] = []
        self._handle = module.register_forward_hook(lambda mod, args, out: self.calls.append(out.detach().clone()))

    def close(self):
        self._handle.remove()


# --- the formats give the same model -----------------------------------------------------------


FORMAT_RUNS = [(CLIP, SHORT), (SAMPLE, dict(GREEDY, max_new_tokens=30))]  # the second with timestamps


@pytest.fixture(scope="module")
def reference_runs(model):
    """Tokens and duration of each run with the OpenAI checkpoint, computed once."""
    runs = []
    for audio, options in FORMAT_RUNS:
        segments, info = model.transcribe(str(audio), **options)
        tokens = tokens_of(segments)
        assert tokens and all(tokens), "the random model should produce some tokens"
        runs.append((tokens, info.duration))
    return runs


@pytest.mark.parametrize("source", ["huggingface", "ct2-float16", "ct2-float32"])
def test_formats_transcribe_identically(model, ct2_float32, reference_runs, source):
    path = {"huggingface": HF_DIR, "ct2-float16": CT2_F16, "ct2-float32": ct2_float32}[source]
    other = load(path)
    assert other.dims == model.dims
    for name, p in other.model.state_dict().items():
        assert p.dtype == torch.float32, name
        assert torch.equal(p, model.model.state_dict()[name]), f"{name} differs from the OpenAI checkpoint"
    # Whatever the format's layout on disk (fused q/k/v, shards), the device holds the same bytes.
    assert other.memory_report().parameter_bytes == model.memory_report().parameter_bytes
    assert duplicated_parameters(other.model) == {}
    for (audio, options), (expected, duration) in zip(FORMAT_RUNS, reference_runs):
        got, other_info = other.transcribe(str(audio), **options)
        assert tokens_of(got) == expected
        assert other_info.duration == duration


def test_transcribe_is_plain_greedy_decoding(model):
    # Without suppression or timestamps, transcribe must give exactly the naive greedy tokens.
    segments, _ = model.transcribe(str(CLIP), **PLAIN)
    (segment,) = list(segments)
    tok = model.tokenizer
    features = encode_audio(model, CLIP)[0]
    expected, _ = naive_greedy(model.model, [tok.sot, tok.no_timestamps], features, 20, tok.eot)
    expected = [t for t in expected if t != tok.eot]
    assert 1 <= len(segment.tokens) <= 20
    assert segment.tokens == expected[: len(segment.tokens)]
    assert segment.text == tok.decode(segment.tokens)


@pytest.mark.parametrize("steps", [1, 3])
def test_steps_per_replay_does_not_change_results(model, steps):
    """Fewer or more steps between looks at the done flags: the naive greedy tokens, and the beam
    search's tokens at the default 8 (3 leaves a partial last replay of most windows)."""
    other = load(OPENAI_PT, steps_per_replay=steps)
    assert other.decoder.steps_per_replay == steps
    (segment,) = list(other.transcribe(str(CLIP), **PLAIN)[0])
    tok = model.tokenizer
    expected, _ = naive_greedy(model.model, [tok.sot, tok.no_timestamps], encode_audio(model, CLIP)[0], 20, tok.eot)
    assert segment.tokens == [t for t in expected if t != tok.eot][: len(segment.tokens)]
    beam = dict(SHORT, beam_size=3)
    assert [s.tokens for s in other.transcribe(str(CLIP), **beam)[0]] == \
        [s.tokens for s in model.transcribe(str(CLIP), **beam)[0]]
    with pytest.raises(InvalidOptionError, match="steps_per_replay"):
        load(OPENAI_PT, steps_per_replay=0)


def test_steps_per_replay_follows_the_decoders_depth(model):
    """Without the option, shallow decoders (tiny's 4 layers, large-v3-turbo's) take 8 steps a trip
    and deep ones (medium's 24, large's 32) one: their loops' instantiation grows with the kernels."""
    assert [default_steps_per_replay(n) for n in (2, 4, 6, 12, 24, 32)] == [8, 8, 5, 2, 1, 1]
    assert model.dims.n_text_layer <= 4 and model.steps_per_replay == model.decoder.steps_per_replay == 8


# --- the KV-cached decoder against the naive decoder -----------------------------------------


def test_window_decoder_matches_naive_decoder(model):
    tok = model.tokenizer
    features = encode_audio(model, CLIP)
    prompt = [tok.sot, tok.no_timestamps]
    steps = 8
    request = WindowRequest(prompt=prompt, timestamps=False, max_initial_timestamp_index=50, max_new_tokens=steps)
    recorder = LogitRecorder(model.model.decoder)
    try:
        (result,) = model.decode(features, [request], [], [])
    finally:
        recorder.close()

    expected, expected_logits = naive_greedy(model.model, prompt, features[0], steps, tok.eot)
    assert result.tokens == [t for t in expected if t != tok.eot]
    assert len(expected) >= 2

    # Call 0 is the prefill of prompt[:-1]; each later call is one decode step on one row.
    prefill, step_logits = recorder.calls[0], recorder.calls[1:]
    assert prefill.shape == (1, len(prompt) - 1, model.dims.n_vocab)
    reference_prefill = naive_logits(model.model, prompt[:-1], features[0])
    torch.testing.assert_close(prefill[0].double(), reference_prefill, atol=1e-4, rtol=1e-5)
    assert len(step_logits) >= len(expected)
    for i, want in enumerate(expected_logits):
        got = step_logits[i]
        assert got.shape == (1, 1, model.dims.n_vocab) and got.dtype == torch.float32
        torch.testing.assert_close(got[0, 0].double(), want, atol=1e-4, rtol=1e-5)

    # The result's statistics come from the same logits.
    logprob = sum(float(torch.log_softmax(lg, -1)[t]) for lg, t in zip(expected_logits, expected))
    assert result.sum_logprob == pytest.approx(logprob, abs=1e-3)
    no_speech = float(torch.softmax(reference_prefill[0], -1)[tok.no_speech])
    assert result.no_speech_prob == pytest.approx(no_speech, rel=1e-4, abs=1e-9)


def test_window_decoder_rows_are_independent(model):
    # Several rows of one batch with different prompts, audio and budgets: each must match its own
    # naive decode, and share the model's weights.
    tok = model.tokenizer
    decoder = WindowDecoder(model.model, tok, model.device, use_graphs=False, buckets=(1, 2, 4))
    assert decoder.model is model.model
    audio = torch.cat([encode_audio(model, CLIP), encode_audio(model, SAMPLE), encode_audio(model, CLIP)])
    previous = tok.encode(" Hello there, general Kenobi.")
    prompts = [
        [tok.sot, tok.no_timestamps],
        [tok.sot_prev, *previous, tok.sot, tok.no_timestamps],
        [tok.sot_prev, *previous[:2], tok.sot, tok.no_timestamps],
    ]
    budgets = [6, 3, 9]
    requests = [WindowRequest(p, False, 50, n) for p, n in zip(prompts, budgets)]
    with torch.inference_mode():
        results = decoder.decode(audio, requests, [], [])
    for row, (prompt, budget, result) in enumerate(zip(prompts, budgets, results)):
        expected, _ = naive_greedy(model.model, prompt, audio[row], budget, tok.eot)
        assert result.tokens == [t for t in expected if t != tok.eot], f"row {row}"
        assert len(result.tokens) <= budget


def test_launching_once_leaves_no_trace_in_the_decoder(model):
    """What a model's load runs on a helper thread to load the decode's kernels (a previous text's
    head prefilled with its rows as device tensors, as a prefill graph's first call runs it; two
    steps of a window of zeros; the loop guard) leaves the rows reset: the decoder's next windows
    are a naive decoder's."""
    tok = model.tokenizer
    decoder = WindowDecoder(model.model, tok, model.device, use_graphs=False, buckets=(1, 2))
    audio = torch.cat([encode_audio(model, CLIP), encode_audio(model, SAMPLE)])
    heads = []  # (tokens, rows): a previous text's head, indexed as a prefill graph's inputs are
    prefill_head = decoder._prefill_head

    def spy(key, tokens, positions, rows, slots, logits_at=None):
        heads.append((tokens.tolist(), rows))
        return prefill_head(key, tokens, positions, rows, slots, logits_at)

    decoder._prefill_head = spy
    with torch.inference_mode():
        decoder.launch_once(torch.zeros_like(audio[:1]), [tok.sot])
        (tokens, rows), = heads
        assert tokens[0][0] == tok.sot_prev and len(tokens[0]) > 8 and isinstance(rows, torch.Tensor)
        del decoder._prefill_head
        assert bool(decoder.state["done"].all()) and int(decoder.state["n_generated"].abs().sum()) == 0
        requests = [WindowRequest([tok.sot, tok.no_timestamps], False, 50, 7)] * 2
        results = decoder.decode(audio, requests, [], [])
    for row, result in enumerate(results):
        expected, _ = naive_greedy(model.model, [tok.sot, tok.no_timestamps], audio[row], 7, tok.eot)
        assert result.tokens == [t for t in expected if t != tok.eot], f"row {row}"


def test_a_window_may_end_on_the_context_s_last_position(model):
    """A long prompt head (225 tokens) leaves 223 steps: the last token lands on position 447, the
    context's last. The window ends inside a call of 8 steps, whose remaining step still runs the
    finished row: it must not address position 448 (an IndexError on the CPU; out-of-bounds cache
    reads and writes on CUDA). With end-of-text suppressed the window runs to the limit; its tokens
    are the naive decoder's with end-of-text masked."""
    tok = model.tokenizer
    n_ctx = model.dims.n_text_ctx
    decoder = WindowDecoder(model.model, tok, model.device, use_graphs=False, steps_per_replay=8)
    prompt = [tok.sot_prev, *([tok.encode(" so")[0]] * 223), tok.sot, tok.no_timestamps]
    budget = n_ctx - (len(prompt) - 1)  # steps from the start token (position 225) to the end
    assert budget == 223 and budget % 8 != 0  # the window ends before its call's last step
    audio = encode_audio(model, CLIP)
    with torch.inference_mode():
        (result,) = decoder.decode(audio, [WindowRequest(prompt, False, 50, budget)], [tok.eot], [])
    sequence, expected = list(prompt), []
    for _ in range(budget):
        logits = naive_logits(model.model, sequence, audio[0])[-1]
        logits[tok.eot] = -math.inf
        expected.append(int(logits.argmax()))
        sequence.append(expected[-1])
    assert len(sequence) == n_ctx + 1  # the last token is never fed: no position 448
    assert result.tokens == expected
    assert int(decoder.state["position"].max()) == n_ctx - 1


def test_suppression_masks_follow_each_call_s_tokens(model):
    """A mask is rewritten only when a run asks for other tokens; whatever the order of calls, each
    holds exactly the tokens its run asked for."""
    decoder = WindowDecoder(model.model, model.tokenizer, model.device, use_graphs=False)
    first, second = [5, 9, 300], [7]
    for suppress, at_begin in ((first, second), (first, second), (second, []), (first, second)):
        decoder.set_rules(suppress, at_begin, SearchOptions())
        for name, ids in (("suppress", suppress), ("suppress_at_begin", at_begin)):
            assert decoder.state[name].nonzero().flatten().tolist() == sorted(ids), name


def test_prefill_equals_step_by_step(model):
    # TextDecoder on caller-owned caches: one call over T tokens equals T one-token calls.
    tok = model.tokenizer
    dims = model.dims
    dec = model.model.decoder
    audio = encode_audio(model, CLIP)
    tokens = [tok.sot_prev, *tok.encode(" one two three"), tok.sot, tok.no_timestamps, 440, 2068]
    head_dim = dims.n_text_state // dims.n_text_head

    def fresh_caches():
        shape = (1, dims.n_text_head, dims.n_text_ctx, head_dim)
        # Garbage in the caches: positions after a query's own must never be read.
        return ([torch.randn(shape) for _ in range(dims.n_text_layer)],
                [torch.randn(shape) for _ in range(dims.n_text_layer)])

    with torch.inference_mode():
        cross = dec.cross_kv(audio)
        cross_k, cross_v = [k for k, _ in cross], [v for _, v in cross]
        k, v = fresh_caches()
        ids = torch.tensor([tokens])
        full = dec(ids, torch.arange(len(tokens))[None], k, v, cross_k, cross_v)[0]
        k, v = fresh_caches()
        steps = torch.stack([
            dec(ids[:, i : i + 1], torch.tensor([[i]]), k, v, cross_k, cross_v)[0, 0] for i in range(len(tokens))
        ])
    assert full.shape == (len(tokens), dims.n_vocab) and full.dtype == torch.float32
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(full.double(), naive_logits(model.model, tokens, audio[0]), atol=1e-4, rtol=1e-5)


# --- one copy of the weights, and the memory report ----------------------------------------


def packed_zero_bytes(whisper) -> int:
    """The bytes that packing the self-attention q/k/v adds: the key's zero bias, one per decoder layer."""
    return sum(b.attn.key.weight.shape[0] * b.attn.key.weight.element_size() for b in whisper.decoder.blocks)


def test_one_copy_of_the_weights(model):
    whisper = model.model
    assert duplicated_parameters(whisper) == {}
    dec = whisper.decoder
    embedding = dec.token_embedding.weight
    shape = (model.dims.n_vocab, model.dims.n_text_state)
    # No separate output projection: the embedding is the only vocabulary-sized tensor...
    vocab_sized = [n for n, t in whisper.state_dict(keep_vars=True).items() if tuple(t.shape) == shape]
    assert vocab_sized == ["decoder.token_embedding.weight"]
    # ...and the logits are the final hidden state times that very tensor.
    # No parameter overlaps another; the self-attention q/k/v weights (and the q/v biases) are views
    # of one packed tensor per layer, whose only extra bytes are the key's zero bias.
    params = list(whisper.parameters())
    storages = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in params}
    assert sum(storages.values()) == sum(p.numel() * p.element_size() for p in params) + packed_zero_bytes(whisper)
    assert len(storages) == len(params) - 3 * len(dec.blocks)  # q, k, v weights in one storage, q, v biases in one
    hidden = []
    handle = dec.ln.register_forward_hook(lambda mod, args, out: hidden.append(out.detach().clone()))
    recorder = LogitRecorder(dec)
    try:
        tok = model.tokenizer
        audio = encode_audio(model, CLIP)
        model.decode(audio, [WindowRequest([tok.sot, tok.no_timestamps], False, 50, 2)], [], [])
    finally:
        handle.remove()
        recorder.close()
    assert len(hidden) == len(recorder.calls) >= 2
    for h, logits in zip(hidden, recorder.calls):
        torch.testing.assert_close(h @ embedding.T, logits, atol=1e-5, rtol=1e-5)
    # The window decoder and its step (eager here, a graph on CUDA) use the same module object.
    assert model.decoder.model is whisper
    assert model.decoder.graph.step.__self__ is model.decoder
    assert model.decoder.state["self_k"].dtype == embedding.dtype


def test_memory_report(model):
    report = model.memory_report()
    tensors = list(model.model.parameters()) + list(model.model.buffers())
    # Every parameter and buffer is float32 after placement: bytes = numel * 4, plus the packed zeros.
    expected = sum(t.numel() * t.element_size() for t in tensors)
    assert report.parameter_bytes == expected + packed_zero_bytes(model.model)
    dims = model.dims
    n_params = sum(t.numel() for t in tensors)
    emb = dims.n_vocab * dims.n_text_state
    assert n_params > emb and expected == 4 * n_params
    # The state holds at least the four K/V buffers of one row.
    kv = 2 * dims.n_text_layer * dims.n_text_state * (dims.n_text_ctx + dims.n_audio_ctx) * 4
    assert report.state_bytes >= kv > 0
    # ...and every persistent decode buffer (beam search may add its own once used).
    assert report.state_bytes >= sum(model.decoder.state[n].numel() * model.decoder.state[n].element_size()
                                     for n in model.decoder.state)
    assert report.peak_bytes is None
    assert report.device == "cpu"


def test_cross_attention_kv_is_held_once_per_window(model):
    """The K/V caches by hand: self-attention per row (5 beams of one window, or 16 windows x 5 beams
    in an engine's state), cross-attention per window, since a window's beams and samples share it."""
    dims = model.dims
    per_position = 2 * dims.n_text_layer * dims.n_text_state * 4  # keys and values, float32
    for decoder, rows, windows in ((model.decoder, 5, 1), (model.batch_decoder(16, 80), 80, 16)):
        st = decoder.state
        kv = sum(st[n].numel() * st[n].element_size() for n in ("self_k", "self_v", "cross_k", "cross_v"))
        assert kv == per_position * (rows * dims.n_text_ctx + windows * dims.n_audio_ctx)


# --- compute types -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_on_cpu(dtype):
    # by name, half precision on the CPU falls back to float32 (test_runtime); a torch dtype forces it
    m = load(OPENAI_PT, dtype)
    assert m.dtype == dtype
    assert {p.dtype for p in m.model.parameters()} == {dtype}
    assert m.decoder.state["self_k"].dtype == dtype
    assert m.memory_report().parameter_bytes == sum(
        t.numel() * t.element_size() for t in [*m.model.parameters(), *m.model.buffers()]
    ) + packed_zero_bytes(m.model)
    for options in (dict(GREEDY, max_new_tokens=20), SHORT):
        segments, info = m.transcribe(str(CLIP), **options)
        segments = list(segments)
        assert info.duration == pytest.approx(1.055375)
        for s in segments:
            assert s.tokens and all(isinstance(t, int) and 0 <= t < m.dims.n_vocab for t in s.tokens)
            assert math.isfinite(s.avg_logprob) and 0.0 <= s.no_speech_prob <= 1.0


@pytest.mark.parametrize("compute_type", ["int8", "float64", "int8_float16", "fp32", "nonsense", ""])
def test_unsupported_compute_type(compute_type):
    with pytest.raises(InvalidOptionError, match="compute type"):
        load(OPENAI_PT, compute_type)


def test_unsupported_device():
    with pytest.raises(InvalidOptionError):
        ostinato.WhisperModel(str(OPENAI_PT), device="tpu", compute_type="float32")


# --- persistent device state -----------------------------------------------------------------


def test_state_buffers_keep_their_addresses(model):
    state = model.decoder.state
    before = state.addresses()
    assert {"self_k", "self_v", "cross_k", "cross_v", "token", "out_tokens"} <= set(before)
    first = tokens_of(model.transcribe(str(CLIP), **GREEDY, max_new_tokens=20)[0])
    assert state.addresses() == before
    tokens_of(model.transcribe(np.zeros(16000 * 2, np.float32), **SHORT)[0])
    assert state.addresses() == before
    # The state is reused, not leaked between calls: the first audio decodes the same again.
    assert tokens_of(model.transcribe(str(CLIP), **GREEDY, max_new_tokens=20)[0]) == first
    assert state.addresses() == before
    # Beam search may add buffers of its own on first use, but never moves the existing ones...
    beam = dict(beam_size=3, temperature=0.0, max_new_tokens=10)
    tokens_of(model.transcribe(str(CLIP), **beam)[0])
    after_beam = state.addresses()
    assert {name: after_beam[name] for name in before} == before
    # ...and keeps its own where they are on the next call.
    tokens_of(model.transcribe(np.zeros(16000 * 2, np.float32), **beam)[0])
    assert state.addresses() == after_beam


def test_language_detection_on_a_multilingual_model(tmp_path):
    """language=None on a multilingual model: the language token most likely after
    <|startoftranscript|> on the first window, checked against the float64 naive decoder."""
    checkpoint = torch.load(OPENAI_PT, map_location="cpu", weights_only=True)
    sd = checkpoint["model_state_dict"]
    emb = sd["decoder.token_embedding.weight"]
    sd["decoder.token_embedding.weight"] = torch.cat([emb, emb[:1]])  # 51865: 99 languages
    checkpoint["dims"] = dict(checkpoint["dims"], n_vocab=51865)
    torch.save(checkpoint, tmp_path / "multi.pt")
    model = load(tmp_path / "multi.pt")  # Whisper's own multilingual vocabulary
    audio = (0.1 * np.random.default_rng(5).standard_normal(16000 * 4)).astype(np.float32)

    audio_features = model.encode(_first_window(model, audio))
    pairs = model.detect_language(audio_features)
    logits = naive_logits(model.model, [model.tokenizer.sot], audio_features[0])[0]
    ids = torch.tensor(model.tokenizer.language_token_ids)
    probs = torch.softmax(logits[ids], dim=-1)
    best = int(probs.argmax())
    assert pairs[0][0] == model.tokenizer.language_codes[best]
    assert pairs[0][1] == pytest.approx(float(probs[best]), abs=1e-5)
    assert len(pairs) == 99 and sum(p for _, p in pairs) == pytest.approx(1.0, abs=1e-5)

    _, info = model.transcribe(audio, beam_size=1, temperature=0.0, max_new_tokens=4)
    assert info.language == pairs[0][0]
    assert info.language_probability == pytest.approx(pairs[0][1], abs=1e-6)


def _first_window(model, audio):
    from ostinato.audio import whisper_input_features
    from ostinato.models.whisper.transcribe import N_FRAMES, pad_window

    features = whisper_input_features(audio, model.dims.n_mels)
    return pad_window(features, 0, min(N_FRAMES, features.shape[-1] - 1))[None]
