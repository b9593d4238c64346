"""Whisper end to end as people run it, beside transformers' ASR pipeline on the same weights.

    PYTHONPATH=src python bench/whisper_e2e.py --clips DIR [--model PATH] [--long PATH]
        [--batch-size 16] [--repeats 2] [--configs greedy-b16 defaults-b16 greedy-b1 words-b16 chunked-b16]
        [--ttft-sizes tiny large-v3] [--steps-per-replay K] [--no-prime] [--no-pipeline | --pipeline-for NAME ...]
        [--device cuda] [--out DIR]

The audio is every clip in ``--clips`` (*.npy int16 or float32 samples, as dev/export_device_bundle.py
writes them, or audio files) and one long recording (``--long``, else the clips end to end, repeated
to at least five minutes). The model is a checkpoint ostinato loads (default: the embedded tiny.en);
the pipeline (``pipeline("automatic-speech-recognition")``, chunked at 30 s, the recipe of
insanely-fast-whisper) gets the same tensors through transformers' Whisper and the checkpoint's
tokenizer.json. Half precision on CUDA, float32 on the CPU.

Every run is a fresh process (this script calling itself with ``--worker``), so a first call costs
what it costs a user: graph captures, kernel compiles, bucket warm-ups. It prints:

1. throughput (audio-s/s) per configuration: ostinato's first call in its process and its best warm
   call, the pipeline's likewise, warm over warm; the words the two agree on (a sanity check: they
   decode differently, the pipeline without temperature fallback). The first calls read Triton's
   kernels from an on-disk cache that an untimed run of each configuration filled (``--no-prime``:
   an empty one);
2. time to the first transcript in a fresh process, 15 s of speech: ``import torch``, what ``import
   ostinato`` adds, the load, the first transcribe (to its first segment and to its end), and the
   same clip again in that process (the work alone: random weights ramble, so it can be most of
   the first call), with Triton's kernel cache cold (a fresh cache folder) and then warm (the folder
   the cold run filled); for the given model and for random large-v3 weights (``--ttft-sizes``);
3. peak GPU memory over each whole run (allocated and reserved), and ostinato's per phase (features,
   encoder, prefill = an admission's cross-attention K/V and prompt, decode, word alignment): the
   highest allocation while that phase ran, everything resident included (per phase from one more
   call after the timed ones: reading the counters at every phase would slow the timed calls).
"""
from __future__ import annotations

import argparse
import difflib
import functools
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np

HERE = Path(__file__).resolve().parent
SAMPLE_RATE = 16000
LONG_SECONDS = 300.0
TTFT_SECONDS = 15.0

# name -> what ostinato and the pipeline are asked for
CONFIGS = {
    "greedy-b16": dict(label="greedy, batch 16", options=dict(beam_size=1, temperature=0.0), batch=16, beams=1),
    "defaults-b16": dict(label="the defaults (beam 5, fallback), batch 16", options={}, batch=16, beams=5),
    "greedy-b1": dict(label="greedy, one audio at a time", options=dict(beam_size=1, temperature=0.0), batch=1,
                      beams=1),
    "words-b16": dict(label="the defaults + word timestamps, batch 16", options=dict(word_timestamps=True), batch=16,
                      beams=5, words=True),
    # The pipeline's own way with long audio: chunks decoded side by side, none prompted by the text before
    # (ostinato's cuts are the VAD's silences, faster-whisper's batched pipeline; the pipeline's, every 30 s
    # with overlaps). Timestamps kept, as the pipeline returns them. Its pipeline run is greedy-b16's.
    "chunked-b16": dict(label="greedy, batch 16, chunked (batched=True: VAD chunks side by side)",
                        options=dict(beam_size=1, temperature=0.0, batched=True, without_timestamps=False),
                        batch=16, beams=1, pipeline_as="greedy-b16"),
}
PHASES = ("features", "encoder", "prefill", "decode", "word alignment")


# -- audio --------------------------------------------------------------------------------------
def load_clips(folder) -> List[np.ndarray]:
    """16-kHz float32 clips from ``folder``: *.npy samples (int16 scaled by 1/32768) or audio files."""
    from ostinato.audio import load_audio

    clips = []
    for path in sorted(Path(folder).iterdir()):
        if path.suffix == ".npy":
            a = np.load(path).reshape(-1)
            clips.append((a.astype(np.float32) / 32768.0) if a.dtype == np.int16 else a.astype(np.float32))
        elif path.suffix in (".wav", ".flac", ".mp3", ".ogg", ".m4a"):
            clips.append(load_audio(str(path)))
    if not clips:
        raise SystemExit(f"no clips (*.npy or audio files) in {folder}")
    return clips


def long_recording(clips: Sequence[np.ndarray], seconds: float = LONG_SECONDS) -> np.ndarray:
    """The clips end to end with half a second of silence between them, repeated to ``seconds``."""
    gap = np.zeros(SAMPLE_RATE // 2, dtype=np.float32)
    parts, total = [], 0
    while total < seconds * SAMPLE_RATE:
        for clip in clips:
            parts += [clip, gap]
            total += len(clip) + len(gap)
    return np.concatenate(parts)


def audio_set(clips_dir: str, long: Optional[str] = None, long_seconds: float = LONG_SECONDS) -> List[np.ndarray]:
    """The benchmark's audio: the clips, then the long recording (``long``'s file, else the clips
    joined to ``long_seconds``)."""
    from ostinato.audio import load_audio

    clips = load_clips(clips_dir)
    return clips + [load_audio(long) if long else long_recording(clips, long_seconds)]


# -- measuring ----------------------------------------------------------------------------------
def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def timed(fn, device: str):
    _sync(device)
    start = time.perf_counter()
    out = fn()
    _sync(device)
    return time.perf_counter() - start, out


class PhasePeaks:
    """The peak GPU memory allocated while each phase ran, over a whole run, and the time the
    thread that runs the model (the engine's, or the caller's for one audio at a time) spent in
    each phase since ``reset_times``.

    Methods are wrapped on their classes (``wrap``). While ``memory`` is on, entering or leaving a
    phase folds the peak so far into every open phase and the overall peak, then resets PyTorch's
    peak counter; a phase nested in another (an admission inside a decode step) counts for both.
    Reading the counters (``memory_stats`` builds a dict of every counter) on the thread that runs
    the model slowed the calls it timed (session 36's code, tiny.en greedy b16, H100: 0.69 s warm
    with them, 0.55 s without on a slower host), so timed calls run with ``memory`` off. Times are
    wall-clock, without synchronizing: a graph replay returns once launched, so the GPU's decode
    time shows where the host waits for it (``collect``, which reads the rows' done flags).
    """

    def __init__(self, memory: bool = True):
        self.memory = memory
        self.peaks: Dict[str, int] = {}
        self.seconds: Dict[str, float] = {}
        self.overall = self.overall_reserved = 0
        self._open: List[str] = []

    def wrap(self, owner, name: str, phase: str) -> None:
        original = getattr(owner, name)

        @functools.wraps(original)
        def wrapped(*args, **kwargs):
            self._enter(phase)
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - start
                self._leave()

        setattr(owner, name, wrapped)

    def reset_times(self) -> None:
        self.seconds = {}

    def _fold(self) -> None:
        if not self.memory:
            return
        import torch

        peak = torch.cuda.max_memory_allocated()
        self.overall = max(self.overall, peak)
        self.overall_reserved = max(self.overall_reserved, torch.cuda.max_memory_reserved())
        for phase in self._open:
            self.peaks[phase] = max(self.peaks.get(phase, 0), peak)
        torch.cuda.reset_peak_memory_stats()

    def _enter(self, phase: str) -> None:
        self._fold()
        self._open.append(phase)

    def _leave(self) -> None:
        self._fold()
        self._open.pop()

    def result(self) -> dict:
        self._fold()
        return dict(self.peaks)


def install_phases(tracker: PhasePeaks) -> None:
    """Wrap the methods of ostinato's Whisper path that make up each phase."""
    from ostinato.models.whisper.beam import BeamRun
    from ostinato.models.whisper.decoding import GreedyRun, WindowDecoder
    from ostinato.models.whisper.model import WhisperModel

    tracker.wrap(WhisperModel, "features", "features")
    tracker.wrap(WhisperModel, "encode", "encoder")
    tracker.wrap(WindowDecoder, "admit_rows", "prefill")
    tracker.wrap(GreedyRun, "advance", "decode")
    tracker.wrap(BeamRun, "advance", "decode")
    tracker.wrap(GreedyRun, "collect", "collect")
    tracker.wrap(BeamRun, "collect", "collect")
    tracker.wrap(WhisperModel, "align", "word alignment")


def memory_totals(device: str) -> dict:
    if not device.startswith("cuda"):
        return {}
    import torch

    return dict(peak_allocated=torch.cuda.max_memory_allocated(), peak_reserved=torch.cuda.max_memory_reserved())


# -- workers (each in its own process) -----------------------------------------------------------
def ours_worker(args, config: dict) -> dict:
    start = time.perf_counter()
    from ostinato import WhisperModel

    on_gpu = args.device.startswith("cuda")
    tracker = PhasePeaks(memory=False)  # the timed calls: phase times only (see PhasePeaks)
    install_phases(tracker)
    model = WhisperModel(args.model, device=args.device, compute_type=args.dtype,
                         steps_per_replay=args.steps_per_replay)
    _sync(args.device)
    load = time.perf_counter() - start
    audios = audio_set(args.clips, args.long, args.long_seconds)
    options, batch = config["options"], config["batch"]

    def run():
        if batch == 1:
            results = [model.transcribe(a, **options) for a in audios]
            return [" ".join(s.text.strip() for s in segments) for segments, _ in results]
        return [" ".join(s.text.strip() for s in segments)
                for segments, _ in model.transcribe_batch(audios, batch_size=batch, **options)]

    first, texts = timed(run, args.device)
    first_seconds = tracker.seconds
    warm = []
    for _ in range(args.repeats):
        tracker.reset_times()
        warm.append(timed(run, args.device)[0])
    out = dict(load=load, first=first, warm=min(warm, default=first), texts=texts,
               audio=sum(map(len, audios)) / SAMPLE_RATE, first_seconds=first_seconds,
               last_seconds=dict(tracker.seconds), last_wall=warm[-1] if warm else first)
    if on_gpu:
        overall = memory_totals(args.device)  # the peaks since the process began, loading included
        tracker.memory = True  # one more call, untimed, for each phase's peak
        tracker.reset_times()
        run()
        out["phases"] = tracker.result()
        out.update(peak_allocated=max(overall["peak_allocated"], tracker.overall),
                   peak_reserved=max(overall["peak_reserved"], tracker.overall_reserved))
    return out


def pipeline_generation_config(model_ostinato):
    """The generation config Whisper's hub checkpoints carry, from the checkpoint's own tokenizer."""
    from transformers import GenerationConfig

    tok, dims = model_ostinato.tokenizer, model_ostinato.dims
    extra = {}
    if dims.is_multilingual:
        extra = dict(lang_to_id={f"<|{c}|>": i for c, i in zip(tok.language_codes, tok.language_token_ids)},
                     task_to_id={"transcribe": tok.transcribe, "translate": tok.translate})
    heads = model_ostinato.alignment_heads or [(layer, h) for layer in range(dims.n_text_layer // 2, dims.n_text_layer)
                                               for h in range(dims.n_text_head)]
    return GenerationConfig(
        decoder_start_token_id=tok.sot, eos_token_id=tok.eot, pad_token_id=tok.eot, bos_token_id=tok.eot,
        max_length=dims.n_text_ctx, no_timestamps_token_id=tok.no_timestamps, prev_sot_token_id=tok.sot_prev,
        is_multilingual=dims.is_multilingual, suppress_tokens=list(tok.non_speech_tokens),
        begin_suppress_tokens=[tok.encode(" ")[0], tok.eot], max_initial_timestamp_index=50,
        alignment_heads=[list(h) for h in heads], **extra,
    )


def pipeline_worker(args, config: dict) -> dict:
    import torch
    from transformers import WhisperFeatureExtractor, WhisperTokenizerFast, pipeline

    sys.path.insert(0, str(HERE))
    from whisper_peers import build_hf_model
    from ostinato import WhisperModel
    from ostinato.models.whisper.loaders import load_checkpoint

    # The checkpoint's tensors in OpenAI's names (a CTranslate2 one converted by ostinato's loader,
    # untimed: the pipeline would read a hub checkpoint as it is).
    reference = WhisperModel(args.model, device="cpu")
    checkpoint = load_checkpoint(str(reference.model_path))
    dtype = torch.float16 if args.dtype == "float16" else torch.float32
    start = time.perf_counter()
    model = build_hf_model(checkpoint.dims, checkpoint.state_dict, args.device, dtype)
    model.generation_config = pipeline_generation_config(reference)
    tokenizer = WhisperTokenizerFast(tokenizer_file=str(checkpoint.tokenizer_file))
    tokenizer.pad_token = "<|endoftext|>"  # as the hub's Whisper tokenizers set it (batching pads with it)
    extractor = WhisperFeatureExtractor(feature_size=checkpoint.dims.n_mels)
    asr = pipeline("automatic-speech-recognition", model=model, tokenizer=tokenizer, feature_extractor=extractor,
                   device=args.device, dtype=dtype, chunk_length_s=30)
    _sync(args.device)
    load = time.perf_counter() - start
    del reference, checkpoint
    audios = audio_set(args.clips, args.long, args.long_seconds)
    kwargs = dict(batch_size=config["batch"], return_timestamps="word" if config.get("words") else True,
                  generate_kwargs=dict(num_beams=config["beams"]))

    def run():
        inputs = [{"raw": a, "sampling_rate": SAMPLE_RATE} for a in audios]
        return [o["text"].strip() for o in asr(inputs, **kwargs)]

    if args.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    first, texts = timed(run, args.device)
    warm = [timed(run, args.device)[0] for _ in range(args.repeats)]
    return dict(load=load, first=first, warm=min(warm), texts=texts, audio=sum(map(len, audios)) / SAMPLE_RATE,
                **memory_totals(args.device))


def ttft_worker(args, model_path: str) -> dict:
    """Marks (time.time(), comparable with the parent's) of a first transcript in this fresh process."""
    marks = {"start": time.time()}
    import torch  # noqa: F401

    marks["torch"] = time.time()
    from ostinato import WhisperModel

    marks["ostinato"] = time.time()
    model = WhisperModel(model_path, device=args.device, compute_type=args.dtype,
                         steps_per_replay=args.steps_per_replay)
    _sync(args.device)
    marks["load"] = time.time()
    clip = audio_set(args.clips, args.long, args.long_seconds)[-1][: int(TTFT_SECONDS * SAMPLE_RATE)]
    marks["audio ready"] = time.time()
    segments, _ = model.transcribe(clip)
    next(segments, None)
    marks["first segment"] = time.time()
    list(segments)
    _sync(args.device)
    marks["transcribed"] = time.time()
    list(model.transcribe(clip)[0])  # the same clip again: what the first call's work alone costs
    _sync(args.device)
    marks["again"] = time.time()
    return marks


# -- the parent -----------------------------------------------------------------------------------
def spawn(args, role: str, name: str, env: Optional[dict] = None, model: Optional[str] = None,
          repeats: Optional[int] = None, long_seconds: Optional[float] = None) -> dict:
    """Run one worker in a fresh Python process; its result (the last stdout line, JSON) with the
    parent's spawn time."""
    repeats = args.repeats if repeats is None else repeats
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", role, "--name", name,
               "--clips", args.clips, "--device", args.device, "--dtype", args.dtype, "--repeats", str(repeats),
               "--model", model or args.model, "--long-seconds", str(long_seconds or args.long_seconds)]
    if args.steps_per_replay:
        command += ["--steps-per-replay", str(args.steps_per_replay)]
    if args.long and long_seconds is None:
        command += ["--long", args.long]
    spawned = time.time()
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **(env or {})})
    if done.returncode != 0:
        print(f"{role} {name} failed:\n{done.stderr[-3000:]}", flush=True)
        return {}
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["spawned"] = spawned
    return result


def agreement(a: Sequence[str], b: Sequence[str]) -> float:
    """The share of words two transcript lists agree on (difflib's ratio over the word sequences)."""
    words_a = " ".join(a).lower().split()
    words_b = " ".join(b).lower().split()
    return difflib.SequenceMatcher(None, words_a, words_b, autojunk=False).ratio()


def random_checkpoint(size: str, folder: str) -> str:
    from ostinato.testing.random_models import save_random_whisper_checkpoint

    return save_random_whisper_checkpoint(size, f"{folder}/{size}.pt")


def gib(n) -> str:
    return f"{n / 2**30:.2f}" if n else "-"


def table(header: Sequence[str], rows: Sequence[Sequence]) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    for row in [header, *rows]:
        print(" | ".join(str(x).ljust(w) for x, w in zip(row, widths)), flush=True)


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(torch.device(device))
    return f"{platform.processor() or platform.machine()} CPU, {os.cpu_count()} threads"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clips", required=True)
    parser.add_argument("--model", default=None, help="default: the embedded tiny.en")
    parser.add_argument("--long", default=None)
    parser.add_argument("--long-seconds", type=float, default=LONG_SECONDS, help="without --long: its length")
    parser.add_argument("--repeats", type=int, default=2, help="warm calls after the first (the best is kept)")
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--ttft-sizes", nargs="*", default=["tiny", "large-v3"],
                        help="'tiny' is --model; other names are random weights of that shape")
    parser.add_argument("--no-pipeline", action="store_true")
    parser.add_argument("--pipeline-for", nargs="+", default=None, choices=list(CONFIGS),
                        help="run the pipeline for these configurations only (default: every one)")
    parser.add_argument("--no-prime", action="store_true",
                        help="first runs with an empty Triton kernel cache (default: filled by an untimed run)")
    parser.add_argument("--steps-per-replay", type=int, default=None,
                        help="ostinato's decode steps between looks (default: the model's own choice)")
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--out", default=None)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--name", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.model is None:
        from ostinato.models.whisper.model import default_model_path

        args.model = str(default_model_path())
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    args.dtype = args.dtype or ("float16" if args.device.startswith("cuda") else "float32")

    if args.worker:
        if args.worker == "ours":
            result = ours_worker(args, CONFIGS[args.name])
        elif args.worker == "pipeline":
            result = pipeline_worker(args, CONFIGS[args.name])
        else:
            result = ttft_worker(args, args.model)
        print(json.dumps(result))
        return

    audio = audio_set(args.clips, args.long, args.long_seconds)
    seconds = sum(map(len, audio)) / SAMPLE_RATE
    print(f"device: {device_name(args.device)}; model {args.model} ({args.dtype}); {len(audio) - 1} clips + one "
          f"{len(audio[-1]) / SAMPLE_RATE:.0f}-s recording = {seconds:.0f} s of audio; warm = best of "
          f"{args.repeats} after the first call; each run its own process", flush=True)
    # Every throughput run reads one Triton kernel cache, filled first by an untimed run of each
    # configuration (clips and 30 s of the long recording): a first run is then what a user's
    # second command costs, kernels from disk; the time-to-first-transcript table shows a cold cache.
    kernels = tempfile.mkdtemp(prefix="ostinato-e2e-triton-")
    os.environ["TRITON_CACHE_DIR"] = kernels
    if not args.no_prime:
        for name in args.configs:
            primed = spawn(args, "ours", name, repeats=0, long_seconds=30.0)
            print(f"  kernel cache primed for {name}: {primed.get('first', float('nan')):.1f} s", flush=True)
    results, peers = {}, {}
    for name in args.configs:
        ours = spawn(args, "ours", name)
        peer_name = CONFIGS[name].get("pipeline_as", name)  # a configuration whose pipeline run is another's
        wanted = not args.no_pipeline and (args.pipeline_for is None or peer_name in args.pipeline_for)
        if wanted and peer_name not in peers:
            peers[peer_name] = spawn(args, "pipeline", peer_name)
        peer = peers.get(peer_name, {})
        results[name] = dict(ours=ours, pipeline=peer)
        print(f"  {name}: ostinato first {ours.get('first', float('nan')):.2f} s warm {ours.get('warm', float('nan')):.2f} s"
              f"; pipeline first {peer.get('first', float('nan')):.2f} s warm {peer.get('warm', float('nan')):.2f} s",
              flush=True)

    print("\n== throughput, audio-s/s ==")
    rows = []
    for name in args.configs:
        ours, peer = results[name]["ours"], results[name]["pipeline"]
        rate = lambda r, k: f"{r['audio'] / r[k]:.0f}" if r else "-"  # noqa: E731
        ratio = f"{peer['warm'] / ours['warm']:.1f}x" if ours and peer else "-"
        first_vs_warm = f"{ours['first'] / ours['warm']:.2f}x" if ours else "-"
        agree = f"{100 * agreement(ours['texts'], peer['texts']):.0f}%" if ours and peer else "-"
        rows.append([CONFIGS[name]["label"], rate(ours, "first"), rate(ours, "warm"), first_vs_warm,
                     rate(peer, "first"), rate(peer, "warm"), ratio, agree])
    table(["configuration", "ostinato first run", "ostinato warm", "first / warm", "pipeline first run",
           "pipeline warm", "ostinato vs pipeline (warm)", "words agreeing"], rows)

    print("\n== peak GPU memory over the run, GiB (allocated / reserved); ostinato's per phase ==")
    rows = []
    for name in args.configs:
        ours, peer = results[name]["ours"], results[name]["pipeline"]
        phases = ours.get("phases", {})
        rows.append([CONFIGS[name]["label"], f"{gib(ours.get('peak_allocated'))} / {gib(ours.get('peak_reserved'))}",
                     f"{gib(peer.get('peak_allocated'))} / {gib(peer.get('peak_reserved'))}",
                     *[gib(phases.get(p)) for p in PHASES]])
    table(["configuration", "ostinato", "pipeline", *PHASES], rows)

    print("\n== where ostinato's calls went on the thread that runs the model, seconds: the first call, then the"
          " last warm one ==")
    timed_phases = ("features", "encoder", "prefill", "decode", "collect", "word alignment")
    rows = []
    for name in args.configs:
        ours = results[name]["ours"]
        for label, seconds, wall in (("first", ours.get("first_seconds"), ours.get("first")),
                                     ("warm", ours.get("last_seconds"), ours.get("last_wall"))):
            if seconds is None:
                continue
            rows.append([CONFIGS[name]["label"], label, f"{wall:.3f}",
                         *[f"{seconds.get(p, 0.0):.3f}" for p in timed_phases],
                         f"{wall - sum(seconds.values()):.3f}"])
    table(["configuration", "call", "wall", *timed_phases, "elsewhere (waiting for workers, Python)"], rows)

    print(f"\n== a fresh process: the first transcript of {TTFT_SECONDS:.0f} s of speech, seconds ==")
    ttft = {}
    with tempfile.TemporaryDirectory() as folder:
        rows = []
        for size in args.ttft_sizes:
            model = args.model if size == "tiny" else random_checkpoint(size, folder)
            env = {"TRITON_CACHE_DIR": tempfile.mkdtemp(dir=folder)}  # empty, then filled by the cold run
            for cache in ("cold", "warm"):
                marks = spawn(args, "ttft", size, env=env, model=model)
                ttft[f"{size} {cache}"] = marks
                if not marks:
                    continue
                label = f"{Path(args.model).parent.name}/{Path(args.model).name}" if size == "tiny" else f"random {size}"
                rows.append([label, cache,
                             f"{marks['start'] - marks['spawned']:.2f}", f"{marks['torch'] - marks['start']:.2f}",
                             f"{marks['ostinato'] - marks['torch']:.2f}", f"{marks['load'] - marks['ostinato']:.2f}",
                             f"{marks['first segment'] - marks['audio ready']:.2f}",
                             f"{marks['transcribed'] - marks['audio ready']:.2f}",
                             f"{marks['again'] - marks['transcribed']:.2f}",
                             f"{marks['load'] - marks['ostinato'] + marks['transcribed'] - marks['audio ready']:.2f}"])
            if size != "tiny":
                os.remove(model)
        table(["model", "Triton cache", "python start", "import torch", "import ostinato (beyond torch)", "load",
               "to first segment", "transcribe", "again (warm)", "load + transcribe"], rows)

    shutil.rmtree(kernels, ignore_errors=True)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        for r in results.values():
            for side in r.values():
                side.pop("texts", None)
        (out / "whisper_e2e.json").write_text(json.dumps(dict(device=device_name(args.device), model=args.model,
                                                              results=results, ttft=ttft), indent=1))


if __name__ == "__main__":
    main()
