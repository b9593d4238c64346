"""The ``ostinato`` command line.

User mistakes (bad options, missing files, unloadable models) end in one ``ostinato: error:``
line and a non-zero exit code, never a traceback. torch and the model are imported only once a
command needs them, so ``ostinato --help`` stays fast.
"""
from __future__ import annotations

import argparse
import math
import os
import re
import sys
from pathlib import Path
from typing import List, Optional, Sequence

from .errors import InvalidOptionError, OstinatoError
from .writers import FORMATS, SubtitleOptions, format_timestamp, write_result

PROG = "ostinato"
EXIT_OK = 0
EXIT_FAILURE = 1  # input or model errors
EXIT_USAGE = 2  # bad command line or option values
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it

_DEVICE_RE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


class _UsageError(Exception):
    """A command-line mistake found by argparse or by option validation."""


class _ArgumentParser(argparse.ArgumentParser):
    # argparse prints the usage block and exits on a mistake; raising instead lets main() report
    # it as one line and return the code, which also keeps main() callable in-process.
    def error(self, message: str):
        raise _UsageError(message)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ostinato")
    except PackageNotFoundError:  # running from a source tree, not installed
        return getattr(sys.modules.get(__package__), "__version__", "0+unknown")


def _build_parser() -> argparse.ArgumentParser:
    parser = _ArgumentParser(prog=PROG, description="Whisper transcription on PyTorch.")
    parser.add_argument("--version", action="version", version=f"{PROG} {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_ArgumentParser)

    t = commands.add_parser(
        "transcribe",
        help="transcribe audio files",
        description="Transcribe audio files, print the segments and write transcript files.",
    )
    t.add_argument("files", nargs="+", metavar="FILE", help="audio or video files")
    t.add_argument("--model", default=None, metavar="PATH_OR_ID",
                   help="checkpoint directory or model id (default: the embedded tiny.en)")
    t.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default: auto)")
    t.add_argument("--compute-type", default="auto", choices=("auto", "float32", "float16", "bfloat16"))
    t.add_argument("--language", default=None, help="spoken language code, e.g. en (default: detect)")
    t.add_argument("--task", default="transcribe", choices=("transcribe", "translate"))
    search = t.add_argument_group("decoding (defaults as faster-whisper's)")
    search.add_argument("--beam-size", type=int, default=5, metavar="N",
                        help="beams of the search at temperature 0; 1 = greedy (default: 5)")
    search.add_argument("--best-of", type=int, default=5, metavar="N",
                        help="samples per window at temperatures above 0 (default: 5)")
    search.add_argument("--patience", type=float, default=1.0, metavar="P",
                        help="beam search stops after beam-size x P finished hypotheses (default: 1)")
    search.add_argument("--length-penalty", type=float, default=1.0, metavar="A",
                        help="hypotheses are ranked by log-probability / length^A (default: 1)")
    search.add_argument("--temperature", default=None, metavar="T[,T...]",
                        help="a temperature, or comma-separated temperatures to fall back through when a "
                             "window looks wrong (default: 0,0.2,0.4,0.6,0.8,1)")
    search.add_argument("--condition-on-previous-text", action=argparse.BooleanOptionalAction, default=True,
                        help="prompt each window with the text before it (default: on)")
    search.add_argument("--seed", type=int, default=None, metavar="N",
                        help="seed for sampling at temperatures above 0: the same seed, the same output "
                             "(default: 0)")
    search.add_argument("--clip-timestamps", default="0", metavar="START,END,...",
                        help="transcribe only these spans, in seconds: start,end,start,end,... "
                             "(an open last end runs to the end of the audio; default: all)")
    search.add_argument("--hotwords", default=None, metavar="TEXT",
                        help="words or phrases to prompt the model with (ignored with --prefix)")
    search.add_argument("--prefix", default=None, metavar="TEXT",
                        help="text the first window's transcript must start with")
    t.add_argument("--initial-prompt", default=None, metavar="TEXT", help="text to condition the first window on")
    t.add_argument("--without-timestamps", action="store_true", help="decode without timestamp tokens")
    t.add_argument("--no-graphs", action="store_true", help="do not capture or replay CUDA graphs")
    t.add_argument("--batch-size", type=int, default=1, metavar="N",
                   help="decode up to N windows of the given files together, refilling rows as windows "
                        "finish (Whisper models; default: 1, one file at a time)")
    words = t.add_argument_group("word timestamps")
    words.add_argument("--word-timestamps", action="store_true",
                       help="time every word (cross-attention alignment), as faster-whisper does")
    words.add_argument("--hallucination-silence-threshold", type=float, default=None, metavar="SECONDS",
                       help="with --word-timestamps, skip silences longer than this around likely hallucinations")
    words.add_argument("--highlight-words", action="store_true",
                       help="underline each word as it is spoken in srt and vtt files (needs --word-timestamps)")
    words.add_argument("--max-line-width", type=int, default=None, metavar="N",
                       help="characters per subtitle line before a break (needs --word-timestamps)")
    words.add_argument("--max-line-count", type=int, default=None, metavar="N",
                       help="lines per subtitle cue, with --max-line-width (needs --word-timestamps)")
    words.add_argument("--max-words-per-line", type=int, default=None, metavar="N",
                       help="words per subtitle cue (needs --word-timestamps)")
    t.add_argument("--output-format", "-f", default="all", choices=FORMATS + ("all",),
                   help="transcript file format (default: all)")
    t.add_argument("--output-dir", "-o", default=".", metavar="DIR", help="where to write transcripts (default: .)")
    talk = t.add_mutually_exclusive_group()
    talk.add_argument("--verbose", "-v", action="store_true", help="show the progress bar even when stderr is not a terminal")
    talk.add_argument("--quiet", "-q", action="store_true", help="do not print segments")
    return parser


def _validate(args: argparse.Namespace) -> None:
    """Reject bad option values before the (slow) model load."""
    if args.beam_size < 1:
        raise _UsageError(f"--beam-size must be at least 1, got {args.beam_size}")
    if args.best_of < 1:
        raise _UsageError(f"--best-of must be at least 1, got {args.best_of}")
    if args.batch_size < 1:
        raise _UsageError(f"--batch-size must be at least 1, got {args.batch_size}")
    if not (math.isfinite(args.patience) and args.patience > 0):
        raise _UsageError(f"--patience must be a number > 0, got {args.patience}")
    if math.floor(args.beam_size * args.patience + 0.5) < 1:
        raise _UsageError(f"--patience ({args.patience}) times --beam-size ({args.beam_size}) must round to at least 1")
    if not math.isfinite(args.length_penalty):
        raise _UsageError(f"--length-penalty must be a finite number, got {args.length_penalty}")
    args.temperature = _parse_temperature(args.temperature)
    if args.seed is not None and not 0 <= args.seed < 2**64:
        raise _UsageError(f"--seed must be an integer in [0, 2**64), got {args.seed}")
    args.clip_timestamps = _parse_clip_timestamps(args.clip_timestamps)
    if not _DEVICE_RE.match(args.device):
        raise _UsageError(f"--device must be auto, cpu, cuda or cuda:N, got {args.device!r}")
    if args.language is not None and not args.language.strip():
        raise _UsageError("--language must not be empty (leave it out to detect the language)")
    if args.model is not None and not args.model.strip():
        raise _UsageError("--model must not be empty (leave it out for the embedded model)")
    for name in ("max_line_width", "max_line_count", "max_words_per_line"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise _UsageError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    threshold = args.hallucination_silence_threshold
    if threshold is not None and not (math.isfinite(threshold) and threshold >= 0):
        raise _UsageError(f"--hallucination-silence-threshold must be a finite number >= 0, got {threshold}")
    if not args.word_timestamps:
        # As openai-whisper: the word-level options need word timings.
        for name in ("highlight_words", "max_line_width", "max_line_count", "max_words_per_line",
                     "hallucination_silence_threshold"):
            if getattr(args, name) not in (None, False):
                raise _UsageError(f"--{name.replace('_', '-')} requires --word-timestamps")
    elif _is_transducer(args.model):
        raise _UsageError("--word-timestamps is available for Whisper models only")


def _error(message: str) -> None:
    # Exactly one line: messages from lower layers (e.g. a decoder) may span several.
    text = " ".join(str(message).split("\n")).strip() or "unknown error"
    print(f"{PROG}: error: {text}", file=sys.stderr, flush=True)


def _file_error(path: str, exc: BaseException) -> None:
    message = str(exc) or type(exc).__name__
    _error(message if path in message else f"{path}: {message}")


def _whisper_model_class():
    # Imported on use, not at module top, so `ostinato --help` never pays for importing torch.
    from .models.whisper.model import WhisperModel

    return WhisperModel


def _is_transducer(model: Optional[str]) -> bool:
    """A NeMo .nemo file names a transducer (RNN-T / TDT); anything else goes to Whisper."""
    return model is not None and model.strip().lower().endswith(".nemo")


def _transducer_model_class():
    from .models.transducer.model import TransducerModel

    return TransducerModel


def _check_input(path: str) -> Optional[str]:
    """Why ``path`` cannot be read, or None. Checked up front so a typo costs no model load."""
    if not os.path.exists(path):
        return f"{path}: no such file"
    if os.path.isdir(path):
        return f"{path}: is a directory"
    if not os.access(path, os.R_OK):
        return f"{path}: permission denied"
    return None


class _Progress:
    """Moves the progress bar to the audio time decoded so far (windows finish between segments)."""

    def __init__(self):
        self.bar = None

    def advance(self, seconds: float) -> None:
        bar = self.bar
        if bar is not None:
            done = min(round(float(seconds), 2), bar.total)
            if done > bar.n:
                bar.update(done - bar.n)


def _whisper_options(args: argparse.Namespace) -> dict:
    return dict(
        language=args.language,
        task=args.task,
        initial_prompt=args.initial_prompt,
        without_timestamps=args.without_timestamps,
        **_decoding_options(args),
        **_word_options(args),
    )


def _transcribe_one(model, path: str, args: argparse.Namespace, show_progress: bool) -> None:
    progress = _Progress()
    if hasattr(model, "transcribe_segments"):  # transducer: segments from token times
        segments, info = model.transcribe_segments(path)
    else:
        segments, info = model.transcribe(
            path, **_whisper_options(args), **({"on_progress": progress.advance} if show_progress else {})
        )
    bar = None
    if show_progress:
        from tqdm import tqdm

        total = max(float(info.duration or 0.0), 0.0)
        bar = tqdm(total=round(total, 2), unit="s", desc=Path(path).name, file=sys.stderr, leave=True,
                   bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.2f}/{total:.2f} s [{elapsed}<{remaining}]")
        progress.bar = bar
    try:
        # Segments come from a generator: decoding happens while we iterate, so errors do too.
        collected = _print_segments(segments, args, bar)
        if bar is not None and bar.total > bar.n:
            bar.update(bar.total - bar.n)
    finally:
        if bar is not None:
            bar.close()
    _write(path, collected, info, args)


def _print_segments(segments, args: argparse.Namespace, bar=None) -> list:
    collected = []
    for segment in segments:
        collected.append(segment)
        if not args.quiet:
            line = f"[{format_timestamp(segment.start)} --> {format_timestamp(segment.end)}] {segment.text.strip()}"
            if bar is not None:
                bar.write(line, file=sys.stdout)  # keeps the bar from tearing the line
            else:
                print(line, flush=True)
        if bar is not None:
            done = min(round(segment.end, 2), bar.total)
            if done > bar.n:
                bar.update(done - bar.n)
    return collected


def _write(path: str, segments: list, info, args: argparse.Namespace) -> None:
    # Written only after a complete transcription, so a failure leaves no truncated transcript.
    subtitle_options = SubtitleOptions(
        highlight_words=args.highlight_words, max_line_width=args.max_line_width,
        max_line_count=args.max_line_count, max_words_per_line=args.max_words_per_line,
    )
    write_result(segments, info, args.output_format, Path(args.output_dir) / Path(path).stem, subtitle_options)


def _transcribe_batch(model, paths: List[str], args: argparse.Namespace) -> bool:
    """All files through one batched transcription; returns whether any file failed."""
    failed = False
    outcomes = model.transcribe_many(paths, batch_size=args.batch_size, **_whisper_options(args))
    for path, outcome in zip(paths, outcomes):
        if isinstance(outcome, BaseException):
            _file_error(path, outcome)
            failed = True
            continue
        segments, info = outcome
        if len(paths) > 1 and not args.quiet:
            print(f"== {path}", flush=True)
        _print_segments(segments, args)
        try:
            _write(path, segments, info, args)
        except OSError as exc:
            _file_error(path, exc)
            failed = True
    return failed


DEFAULT_TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)  # faster-whisper's fallback schedule


def _parse_temperature(text: Optional[str]):
    """One temperature (a float) or a comma-separated schedule (a tuple); None: the default."""
    if text is None:
        return DEFAULT_TEMPERATURES
    try:
        values = [float(part) for part in text.split(",")]
    except ValueError:
        raise _UsageError(f"--temperature must be a number or comma-separated numbers, got {text!r}") from None
    if any(not (math.isfinite(v) and v >= 0) for v in values):
        raise _UsageError(f"--temperature values must be finite numbers >= 0, got {text!r}")
    return values[0] if len(values) == 1 else tuple(values)


def _parse_clip_timestamps(text: str) -> str:
    """Check --clip-timestamps here, before any model is loaded; the model parses it again."""
    stripped = text.strip()
    try:
        points = [float(part) for part in stripped.split(",")] if stripped else []
    except ValueError:
        raise _UsageError(f"--clip-timestamps must be comma-separated seconds like 0,10,15, got {text!r}") from None
    if any(not (math.isfinite(p) and p >= 0) for p in points):
        raise _UsageError(f"--clip-timestamps must be finite seconds >= 0, got {text!r}")
    if any(end <= start for start, end in zip(points[::2], points[1::2])):
        raise _UsageError(f"--clip-timestamps: every clip must end after it starts, got {text!r}")
    return stripped


def _decoding_options(args: argparse.Namespace) -> dict:
    """transcribe() keywords for the search; the optional ones are given only when set."""
    options = dict(
        beam_size=args.beam_size,
        best_of=args.best_of,
        patience=args.patience,
        length_penalty=args.length_penalty,
        temperature=args.temperature,
        condition_on_previous_text=args.condition_on_previous_text,
    )
    for name, unset in (("seed", None), ("clip_timestamps", "0"), ("hotwords", None), ("prefix", None)):
        value = getattr(args, name)
        if value != unset:
            options[name] = value
    return options


def _word_options(args: argparse.Namespace) -> dict:
    """transcribe() keywords for word timestamps, given only when asked for."""
    if not args.word_timestamps:
        return {}
    options = {"word_timestamps": True}
    if args.hallucination_silence_threshold is not None:
        options["hallucination_silence_threshold"] = args.hallucination_silence_threshold
    return options


def _run_transcribe(args: argparse.Namespace) -> int:
    _validate(args)

    failed = False
    inputs: List[str] = []
    for path in args.files:
        problem = _check_input(path)
        if problem:
            _error(problem)
            failed = True
        else:
            inputs.append(path)
    if not inputs:
        return EXIT_FAILURE

    try:
        os.makedirs(args.output_dir, exist_ok=True)
    except OSError as exc:
        _error(f"cannot create output directory {args.output_dir}: {exc.strerror or exc}")
        return EXIT_FAILURE

    try:
        model_class = _transducer_model_class() if _is_transducer(args.model) else _whisper_model_class()
        model = model_class(
            args.model,  # WhisperModel's `model`, TransducerModel's `path`
            device=args.device,
            compute_type=args.compute_type,
            use_graphs=not args.no_graphs,
        )
    except InvalidOptionError as exc:
        _error(str(exc))
        return EXIT_USAGE
    except OstinatoError as exc:
        _error(str(exc))
        return EXIT_FAILURE

    if args.batch_size > 1 and hasattr(model, "transcribe_many"):
        try:
            return EXIT_FAILURE if _transcribe_batch(model, inputs, args) or failed else EXIT_OK
        except InvalidOptionError as exc:
            _error(str(exc))
            return EXIT_USAGE
    show_progress = args.verbose or sys.stderr.isatty()
    for path in inputs:
        try:
            _transcribe_one(model, path, args, show_progress)
        except InvalidOptionError as exc:
            # An option the model rejects (e.g. a language it lacks) fails every file alike.
            _error(str(exc))
            return EXIT_USAGE
        except (OstinatoError, OSError) as exc:
            # OSError: the transcript could not be written (disk full, permissions).
            _file_error(path, exc)
            failed = True
    return EXIT_FAILURE if failed else EXIT_OK


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = _build_parser()
    try:
        try:
            args = parser.parse_args(argv)
        except SystemExit as exc:  # --help and --version print and exit through argparse
            return exc.code if isinstance(exc.code, int) else EXIT_OK
        if args.command is None:
            raise _UsageError(f"missing command (try '{PROG} --help')")
        return _run_transcribe(args)
    except _UsageError as exc:
        _error(str(exc))
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # stdout was closed early (e.g. `| head`): stop quietly, and point stdout at devnull so
        # the interpreter's final flush does not complain.
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):  # stdout without a file descriptor (captured)
            pass
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
