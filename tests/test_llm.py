"""LanguageModel's behaviour on the CPU: batching and refill, sampling, stop tokens, dtypes, the
checkpoint layouts it must read, one copy of the weights, bad input, and `ostinato generate`."""
from __future__ import annotations

import json
import logging
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from ostinato import LanguageModel, load_model
from ostinato.cli import main
from ostinato.errors import InvalidOptionError, ModelLoadError, UnsupportedCheckpointError
from ostinato.runtime import duplicated_parameters, storage_bytes

DATA = os.path.join(os.path.dirname(__file__), "data", "llm")


def path(name):
    return os.path.join(DATA, name)


@pytest.fixture(scope="module")
def qwen3():
    return LanguageModel(path("qwen3"), device="cpu")


@pytest.fixture(scope="module")
def hybrid():
    return LanguageModel(path("qwen3_5_moe"), device="cpu")


def some_prompts(count, seed=0, longest=40):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 320, (int(n),), generator=g).tolist()
            for n in torch.randint(1, longest, (count,), generator=g)]


def test_rows_refill_and_results_do_not_depend_on_the_batch(hybrid):
    batch = some_prompts(7)
    alone = [hybrid.generate([p], max_new_tokens=9)[0] for p in batch]
    together = hybrid.generate(batch, max_new_tokens=9, batch_size=3)  # 7 prompts through 3 rows
    assert [list(g) for g in together] == [list(g) for g in alone]
    assert [g.text for g in together] == [hybrid.tokenizer.decode(list(g)) for g in alone]


def test_max_new_tokens_limits_each_row(qwen3):
    outs = qwen3.generate(some_prompts(3), max_new_tokens=4)
    assert all(len(o) <= 4 for o in outs)
    assert all(o.finish_reason == "length" for o in outs if len(o) == 4 and o[-1] not in qwen3.config.eos_token_ids)


def test_stop_tokens_end_a_row_and_are_returned_like_eos(qwen3):
    prompt = some_prompts(1, seed=3)[0]
    free = qwen3.generate([prompt], max_new_tokens=10)[0]
    stop_at = free[4]
    cut = qwen3.generate([prompt], max_new_tokens=10, stop=[stop_at])[0]
    first = list(free).index(stop_at)
    assert list(cut) == list(free)[: first + 1] and cut.finish_reason == "stop"
    token_text = qwen3.tokenizer._tokenizer.id_to_token(stop_at)
    assert list(qwen3.generate([prompt], max_new_tokens=10, stop=token_text)[0]) == list(cut)


def test_a_growing_conversation_reallocates_its_state_a_few_times(monkeypatch):
    """Each call's prompt is the last one plus its answer and a new turn: the state (and on CUDA the
    graphs that address it) is made again only when the context doubles, and the tokens are those
    of a model that meets the final prompt first."""
    model = LanguageModel(path("qwen3_5_text"), device="cpu")
    made = []
    allocate = type(model.decoder)._allocate

    def counted(*sizes):
        made.append(sizes)
        allocate(model.decoder, *sizes)

    monkeypatch.setattr(model.decoder, "_allocate", counted)
    prompt, turns = some_prompts(1, seed=5)[0], 0
    while len(prompt) + 8 <= 900:
        out = model.generate([prompt], max_new_tokens=8)[0]
        prompt = prompt + list(out) + some_prompts(1, seed=turns, longest=60)[0]
        turns += 1
    prompt = prompt[:892]
    last = model.generate([prompt], max_new_tokens=8)[0]
    assert turns >= 20 and [capacity for _, capacity, _ in made] == [128, 256, 512, 1024]
    assert list(last) == list(LanguageModel(path("qwen3_5_text"), device="cpu").generate([prompt], max_new_tokens=8)[0])


def test_more_rows_do_not_double_the_context():
    model = LanguageModel(path("qwen3"), device="cpu")
    model.generate([list(range(3, 200))], max_new_tokens=8)
    model.generate([list(range(3, 200))] * 5, max_new_tokens=8)
    assert (model.decoder.rows, model.decoder.capacity, model.decoder.max_new) == (8, 256, 64)


def test_a_doubled_state_that_does_not_fit_falls_back_to_what_the_call_needs(monkeypatch):
    model = LanguageModel(path("qwen3"), device="cpu")
    model.generate([list(range(3, 200))], max_new_tokens=8)  # 256 positions
    allocate = type(model.decoder)._allocate
    asked = []

    def room_for_384(rows, capacity, max_new):
        asked.append(capacity)
        if capacity > 384:
            raise torch.OutOfMemoryError("CUDA out of memory (test)")
        allocate(model.decoder, rows, capacity, max_new)

    monkeypatch.setattr(model.decoder, "_allocate", room_for_384)
    prompt = list(range(3, 290))
    out = model.generate([prompt], max_new_tokens=8)[0]
    assert asked == [512, 384] and model.decoder.capacity == 384
    assert list(out) == list(LanguageModel(path("qwen3"), device="cpu").generate([prompt], max_new_tokens=8)[0])
    with pytest.raises(torch.OutOfMemoryError):
        model.generate([list(range(3, 300)) * 2], max_new_tokens=8)  # more than fits, doubled or not


def test_sampling_is_seeded_and_independent_of_batching(hybrid):
    batch = some_prompts(5, seed=4)
    options = dict(max_new_tokens=8, temperature=1.5, top_p=0.95, seed=11)
    a = hybrid.generate(batch, **options)
    b = hybrid.generate(batch, batch_size=2, **options)
    assert [list(x) for x in a] == [list(x) for x in b]
    c = hybrid.generate(batch, **dict(options, seed=12))
    assert [list(x) for x in a] != [list(x) for x in c]
    greedy = hybrid.generate(batch, max_new_tokens=8)
    assert [list(x) for x in hybrid.generate(batch, max_new_tokens=8, temperature=2.0, top_k=1, seed=1)] == \
        [list(x) for x in greedy]
    assert [list(x) for x in hybrid.generate(batch, max_new_tokens=8, temperature=2.0, top_p=1e-6, seed=1)] == \
        [list(x) for x in greedy]


def test_sampling_follows_the_distribution():
    """Gumbel-max over the counter-based noise draws tokens with the softmax's probabilities."""
    from ostinato.models.llm.sampling import choose

    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(4000, 1)
    draws = choose(logits, True, torch.ones(4000), torch.zeros(4000, dtype=torch.int64), torch.ones(4000),
                   torch.full((4000,), 7, dtype=torch.int64), torch.arange(4000))
    freq = torch.bincount(draws, minlength=4).float() / 4000
    torch.testing.assert_close(freq, torch.tensor([0.5, 0.3, 0.15, 0.05]), atol=0.03, rtol=0)
    top2 = choose(logits, True, torch.ones(4000), torch.full((4000,), 2), torch.ones(4000),
                  torch.full((4000,), 7, dtype=torch.int64), torch.arange(4000))
    assert set(top2.tolist()) == {0, 1}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_runs_and_stays_close(dtype):
    full = LanguageModel(path("qwen3_next"), device="cpu")
    half = LanguageModel(path("qwen3_next"), device="cpu", dtype=dtype)
    assert half.net.model.embed_tokens.weight.dtype == dtype
    ids = torch.tensor([some_prompts(1, seed=5, longest=60)[0]])
    rows = torch.tensor([0])
    for m in (full, half):
        m.decoder.ensure(1, ids.shape[1], 1)
    with torch.no_grad():
        a = full.net.logits(full.net.prefill(ids, rows, 0, full.decoder.state)[:, -1])
        b = half.net.logits(half.net.prefill(ids, rows, 0, half.decoder.state)[:, -1])
    assert torch.softmax(a, -1).sub(torch.softmax(b, -1)).abs().max() < 0.05
    out = half.generate([ids[0].tolist()], max_new_tokens=5)[0]
    assert len(out) >= 1


def test_one_copy_of_every_weight():
    for name in ("qwen3", "qwen3_5", "qwen3_5_moe"):
        model = LanguageModel(path(name), device="cpu")
        params = list(model.net.parameters())
        weights = load_file(os.path.join(path(name), "model.safetensors"))
        text = {k: v for k, v in weights.items() if not k.startswith("model.visual.")}
        assert storage_bytes(params) == sum(v.numel() * v.element_size() for v in text.values())
        assert duplicated_parameters(model.net) == {}
        if model.config.tie_word_embeddings:
            assert model.net.lm_head.weight is model.net.model.embed_tokens.weight


def test_the_vision_tower_is_left_out_with_a_note(caplog):
    with caplog.at_level(logging.INFO, logger="ostinato.models.llm.checkpoint"):
        LanguageModel(path("qwen3_5"), device="cpu")
    assert any("vision tower is not loaded" in r.getMessage() for r in caplog.records)


def test_stacked_experts_and_shards_load_the_same(tmp_path, hybrid):
    """Experts stacked as [E, 2I, H] / [E, H, I] (as some exports store them), in two shards."""
    weights = load_file(os.path.join(path("qwen3_5_moe"), "model.safetensors"))
    stacked, layers = {}, {}
    for name, value in weights.items():
        if ".mlp.experts." in name:
            prefix, rest = name.split(".mlp.experts.")
            expert, proj = rest.split(".")[:2]
            layers.setdefault(prefix, {})[(int(expert), proj)] = value
        else:
            stacked[name] = value
    for prefix, parts in layers.items():
        count = max(e for e, _ in parts) + 1
        stacked[prefix + ".mlp.experts.gate_up_proj"] = torch.stack(
            [torch.cat([parts[(e, "gate_proj")], parts[(e, "up_proj")]]) for e in range(count)])
        stacked[prefix + ".mlp.experts.down_proj"] = torch.stack([parts[(e, "down_proj")] for e in range(count)])
    folder = tmp_path / "stacked"
    shutil.copytree(path("qwen3_5_moe"), folder)
    os.remove(folder / "model.safetensors")
    names = sorted(stacked)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    for shard, members in shards.items():
        save_file({n: stacked[n].contiguous() for n in members}, str(folder / shard))
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {n: s for s, ms in shards.items() for n in ms}}))
    batch = some_prompts(3, seed=6)
    again = LanguageModel(str(folder), device="cpu")
    assert [list(x) for x in again.generate(batch, max_new_tokens=6)] == \
        [list(x) for x in hybrid.generate(batch, max_new_tokens=6)]
    os.remove(folder / "model-00002-of-00002.safetensors")
    with pytest.raises(ModelLoadError, match="weight shard model-00002-of-00002.safetensors is missing"):
        LanguageModel(str(folder), device="cpu")


def test_load_model_picks_the_language_model():
    model = load_model(path("llama"), device="cpu")
    assert isinstance(model, LanguageModel) and model.config.kind == "llama"


def _copy(tmp_path, name="qwen3"):
    folder = tmp_path / name
    shutil.copytree(path(name), folder)
    return folder


def test_bad_checkpoints_get_one_clear_error(tmp_path):
    folder = _copy(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(config, architectures=["GPT2LMHeadModel"])))
    with pytest.raises(UnsupportedCheckpointError, match="architecture GPT2LMHeadModel is not supported"):
        LanguageModel(str(folder), device="cpu")
    folder = _copy(tmp_path / "b")
    os.remove(folder / "tokenizer.json")
    with pytest.raises(ModelLoadError, match="no tokenizer.json"):
        LanguageModel(str(folder), device="cpu")
    folder = _copy(tmp_path / "c")
    os.remove(folder / "model.safetensors")
    with pytest.raises(ModelLoadError, match="no weights"):
        LanguageModel(str(folder), device="cpu")
    folder = _copy(tmp_path / "d")
    weights = load_file(str(folder / "model.safetensors"))
    weights.pop("model.layers.1.mlp.up_proj.weight")
    save_file(weights, str(folder / "model.safetensors"))
    with pytest.raises(UnsupportedCheckpointError, match="1 weights are missing .* model.layers.1.mlp.up_proj.weight"):
        LanguageModel(str(folder), device="cpu")


def test_bad_prompts_and_options_get_one_clear_error(qwen3):
    cases = [
        (dict(prompts=[]), "no prompts given"),
        (dict(prompts=[[]]), "prompt 0 is empty"),
        (dict(prompts=[[1, 2], [5, 99999]]), "prompt 1 has token id 99999 outside the vocabulary"),
        (dict(prompts=[[1] * 1000], max_new_tokens=100), "prompt 0 has 1000 tokens: .* exceeds the model's context of 1024"),
        (dict(prompts="hello"), "prompts must be a list"),
        (dict(prompts=[[1]], max_new_tokens=0), "max_new_tokens must be a positive integer"),
        (dict(prompts=[[1]], temperature=-1), "temperature must be 0"),
        (dict(prompts=[[1]], top_p=0), "top_p must be in"),
        (dict(prompts=[[1]], top_k=-2), "top_k must be 0"),
        (dict(prompts=[[1]], stop=["two words"]), "stop must name token ids or single tokens"),
    ]
    for kwargs, message in cases:
        with pytest.raises(InvalidOptionError, match=message):
            qwen3.generate(**kwargs)


def test_generate_command_streams_the_text(capsys, qwen3):
    prompt = "the quick brown fox"
    want = qwen3.generate([prompt], max_new_tokens=7)[0].text
    assert main(["generate", "--model", path("qwen3"), "--device", "cpu", "--max-new-tokens", "7", prompt]) == 0
    assert capsys.readouterr().out == want + "\n"
    messages = [{"role": "user", "content": prompt}]
    want = qwen3.chat(messages, max_new_tokens=5).text
    assert main(["generate", "--model", path("qwen3"), "--device", "cpu", "--max-new-tokens", "5", "--chat", prompt]) == 0
    assert capsys.readouterr().out == want + "\n"


def test_generate_command_errors_are_one_line(capsys, tmp_path):
    assert main(["generate", "--model", str(tmp_path), "hi"]) == 1
    assert main(["generate", "--model", path("qwen3"), "--top-p", "2", "hi"]) == 2
    assert main(["generate", "--model", path("qwen3"), "--device", "cpu", "--max-new-tokens", "2000", "hi"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("ostinato: error: ") for line in err)
    assert "no config.json" in err[0] and "--top-p" in err[1] and "context of 1024" in err[2]


def test_grouped_experts_equal_the_loop_over_experts(hybrid):
    """The experts through grouped products (tokens sorted by expert, their rows put back in token
    order and each token's k rows weighted and summed) equal the loop over experts, expert by expert,
    with and without renormalised routing weights."""
    if not hasattr(torch, "_grouped_mm"):
        pytest.skip("this torch has no grouped matmul")
    moe = next(layer.mlp for layer in hybrid.net.model.layers if layer.moe)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(37, moe.experts_gate_up.shape[-1], generator=g)
    configured = moe.normalize
    try:
        for normalize in (True, False):
            moe.normalize = normalize
            weights, chosen = moe.route(x)
            assert len(chosen.unique()) > 1
            torch.testing.assert_close(moe._grouped(x, weights, chosen), moe._per_expert(x, weights, chosen),
                                       rtol=1e-5, atol=1e-5)
    finally:
        moe.normalize = configured
