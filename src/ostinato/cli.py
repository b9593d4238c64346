"""The ``ostinato`` command line.

User mistakes (bad options, missing files, unloadable models) end in one ``ostinato: error:``
line and a non-zero exit code, never a traceback. torch and the model are imported only once a
command needs them, so ``ostinato --help`` stays fast.
"""
from __future__ import annotations

import argparse
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
    t.add_argument("--decode-loop", default="auto", choices=("auto", "device", "kstep", "eager"),
                   help="how decode steps run on CUDA: the device while-loop, graphs of K steps replayed by "
                        "the host, or eagerly (default: auto, the best this machine offers)")
    t.add_argument("--no-graphs", action="store_true", help="do not capture or replay CUDA graphs (--decode-loop eager)")
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
    parser.transcribe_parser = t  # its defaults tell which options the user set
    return parser


# Options that only Whisper models take: given to a transducer, they are refused, not ignored.
_WHISPER_ONLY = (
    "language", "task", "beam_size", "best_of", "patience", "length_penalty", "temperature",
    "condition_on_previous_text", "seed", "clip_timestamps", "hotwords", "prefix", "initial_prompt",
    "without_timestamps", "word_timestamps", "hallucination_silence_threshold", "highlight_words",
    "max_line_width", "max_line_count", "max_words_per_line",
)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _flagged(message: str) -> str:
    """An options error in the command line's words: ``beam_size`` becomes ``--beam-size``."""
    return re.sub(r"\b(temperatures?|" + "|".join(_WHISPER_ONLY) + r")\b",
                  lambda m: _flag("temperature" if m.group(1).startswith("temperature") else m.group(1)), message)


def _validate(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Reject bad option values before the (slow) model load; sets ``args.options``, the validated
    ``TranscribeOptions`` of a Whisper model (None for a transducer)."""
    from .loading import TRANSDUCER, checkpoint_family
    from .runtime import parse_device

    if args.batch_size < 1:
        raise _UsageError(f"--batch-size must be at least 1, got {args.batch_size}")
    try:
        parse_device(args.device)
    except InvalidOptionError as exc:
        raise _UsageError(f"--device: {exc}") from None
    if args.language is not None and not args.language.strip():
        raise _UsageError("--language must not be empty (leave it out to detect the language)")
    if args.model is not None and not args.model.strip():
        raise _UsageError("--model must not be empty (leave it out for the embedded model)")
    for name in ("max_line_width", "max_line_count", "max_words_per_line"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise _UsageError(f"{_flag(name)} must be at least 1, got {value}")
    if not args.word_timestamps:
        # As openai-whisper: the word-level options need word timings.
        for name in ("highlight_words", "max_line_width", "max_line_count", "max_words_per_line",
                     "hallucination_silence_threshold"):
            if getattr(args, name) not in (None, False):
                raise _UsageError(f"{_flag(name)} requires --word-timestamps")
    args.family = checkpoint_family(args.model)
    if args.family == TRANSDUCER:
        given = [_flag(name) for name in _WHISPER_ONLY
                 if getattr(args, name) != parser.transcribe_parser.get_default(name)]
        if given:
            raise _UsageError(f"{', '.join(given)}: Whisper options; a transducer model (.nemo) takes none of them")
        args.options = None
        return
    args.options = _transcribe_options(args)


def _transcribe_options(args: argparse.Namespace):
    """The ``TranscribeOptions`` the API builds from the same values, validated by the same code."""
    from .models.whisper.options import DEFAULT_TEMPERATURES, TranscribeOptions, parse_temperature

    try:
        options = TranscribeOptions(
            language=args.language,
            task=args.task,
            beam_size=args.beam_size,
            best_of=args.best_of,
            patience=args.patience,
            length_penalty=args.length_penalty,
            temperature=DEFAULT_TEMPERATURES if args.temperature is None else parse_temperature(args.temperature),
            condition_on_previous_text=args.condition_on_previous_text,
            initial_prompt=args.initial_prompt,
            without_timestamps=args.without_timestamps,
            clip_timestamps=args.clip_timestamps,
            hotwords=args.hotwords,
            prefix=args.prefix,
            word_timestamps=args.word_timestamps,
            hallucination_silence_threshold=args.hallucination_silence_threshold,
            **({} if args.seed is None else {"seed": args.seed}),
        )
        options.validate()
    except InvalidOptionError as exc:
        raise _UsageError(_flagged(str(exc))) from None
    return options


def _error(message: str) -> None:
    # Exactly one line: messages from lower layers (e.g. a decoder) may span several.
    text = " ".join(str(message).split("\n")).strip() or "unknown error"
    print(f"{PROG}: error: {text}", file=sys.stderr, flush=True)


def _file_error(path: str, exc: BaseException) -> None:
    message = str(exc) or type(exc).__name__
    _error(message if path in message else f"{path}: {message}")


def _option_values(options) -> dict:
    """``transcribe`` keywords from validated ``TranscribeOptions`` (the API checks them against the model)."""
    from dataclasses import fields

    return {f.name: getattr(options, f.name) for f in fields(options)}


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


def _transcribe_one(model, path: str, args: argparse.Namespace, show_progress: bool) -> None:
    progress = _Progress()
    if hasattr(model, "transcribe_segments"):  # transducer: segments from token times
        segments, info = model.transcribe_segments(path)
    else:
        segments, info = model.transcribe(
            path, **_option_values(args.options), **({"on_progress": progress.advance} if show_progress else {})
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
    outcomes = model.transcribe_many(paths, batch_size=args.batch_size, **_option_values(args.options))
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


def _load_model(args: argparse.Namespace):
    from .loading import load_model

    model = load_model(args.model, device=args.device, compute_type=args.compute_type,
                       decode_loop="eager" if args.no_graphs else args.decode_loop)
    if args.verbose:
        rung = getattr(getattr(model, "decoder", None), "loop_rung", "n/a")
        print(f"{PROG}: {args.family} model {getattr(model, 'model_path', args.model)} on {model.device}, "
              f"{str(model.dtype).replace('torch.', '')}; decode loop: {rung}", file=sys.stderr, flush=True)
    return model


def _run_transcribe(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    _validate(args, parser)

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
        model = _load_model(args)
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
        return _run_transcribe(args, parser)
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
