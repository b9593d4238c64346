"""Half precision on CUDA runs the fused kernels: graph == eager for greedy, beam and timestamps on
real tiny.en and on a random model of a larger size, and batched transcription == one at a time."""
import pytest
import torch

from ostinato import WhisperModel
from ostinato.models.whisper.decoding import GreedyKey, SearchOptions, WindowDecoder, WindowRequest
from ostinato.testing.random_models import random_whisper_checkpoint
from ostinato.models.whisper.loaders.vocab import vocabulary_layout, whisper_tokenizer_file
from ostinato.models.whisper.modules import Whisper, fused_step_enabled
from ostinato.models.whisper.tokenizer import WhisperTokenizer
from ostinato.runtime import device_loop as device_loop_module

from test_whisper_gpu import clip_samples

pytestmark = pytest.mark.gpu
CLIPS = ("c01_hello_short", "c02_numbers", "c05_white20_m3", "c08_story_long", "c13_nyc_white15",
         "c17_cut_two_windows")


def _texts(result):
    segments, info = result
    return [(s.start, s.end, s.tokens) for s in segments]


@pytest.fixture(scope="module")
def tiny_fp16(tiny_en_path):
    graph = WhisperModel(str(tiny_en_path), device="cuda", compute_type="float16")
    eager = WhisperModel(str(tiny_en_path), device="cuda", compute_type="float16", use_graphs=False)
    return graph, eager


def test_fused_path_is_on_for_half_precision(tiny_fp16):
    graph, _ = tiny_fp16
    x = torch.zeros(1, 384, device="cuda", dtype=torch.float16)
    if not fused_step_enabled(x, 64):
        pytest.skip("Triton is not installed: the plain path runs")
    assert graph.decoder._fused_rules


@pytest.mark.parametrize("clip", ["c02_numbers", "c17_cut_two_windows"])
def test_beam_search_graph_equals_eager_fp16(tiny_fp16, data_dir, clip):
    graph, eager = tiny_fp16
    audio = clip_samples(data_dir, clip)
    assert _texts(graph.transcribe(audio)) == _texts(eager.transcribe(audio))  # defaults: beam 5, fallback


@pytest.mark.parametrize("beam_size", [1, 5])
def test_batch_equals_one_at_a_time_fp16(tiny_fp16, data_dir, beam_size):
    graph, _ = tiny_fp16
    audios = [clip_samples(data_dir, c) for c in CLIPS]
    alone = [_texts(graph.transcribe(a, beam_size=beam_size)) for a in audios]
    batched = [_texts(r) for r in graph.transcribe_batch(audios, batch_size=4, beam_size=beam_size)]
    assert batched == alone


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_random_tiny_size_model_graph_equals_eager(dtype):
    dims, state = random_whisper_checkpoint("tiny", dtype=dtype, device="cuda", std=0.05)
    model = Whisper.from_state_dict(dims, state).to("cuda", dtype).eval().requires_grad_(False)
    multilingual, languages = vocabulary_layout(dims.n_vocab)
    tok = WhisperTokenizer(whisper_tokenizer_file(dims.n_vocab), multilingual, languages)
    features = torch.randn(3, dims.n_audio_ctx, dims.n_audio_state, device="cuda", dtype=dtype)
    prompt = tok.sot_sequence("en", "transcribe")
    requests = [WindowRequest(prompt, True, 50, 40), WindowRequest(prompt, False, 50, 30),
                WindowRequest(prompt + [tok.timestamp_begin], True, 50, 40)]
    suppress, begin = list(tok.suppressed_tokens([-1])), [tok.encode(" ")[0], tok.eot]
    results, rungs = {}, {}
    # The device loop (rows finish at different steps, so it stops and is re-entered), the K-step
    # graph, and eager.
    for use_graphs, device_loop in ((True, True), (True, False), (False, False)):
        loop = "eager" if not use_graphs else ("auto" if device_loop else "kstep")
        decoder = WindowDecoder(model, tok, "cuda", buckets=(4,), capacity=15, decode_loop=loop)
        with torch.inference_mode():
            results[use_graphs, device_loop] = [
                [r.tokens for r in decoder.decode(features, requests, suppress, begin, options)]
                for options in (SearchOptions(), SearchOptions(beam_size=5))
            ]
        rungs[use_graphs, device_loop] = decoder.graph.rung(GreedyKey(4))
    assert results[True, True] == results[False, False]
    assert results[True, False] == results[False, False]
    assert all(any(tokens) for tokens in results[True, True][0])
    looping = device_loop_module.unavailable_reason("cuda") is None
    assert rungs[True, True] == ("device loop" if looping else "K steps per replay")
    assert rungs[True, False] == "K steps per replay" and rungs[False, False] == "eager"
