"""The ``ostinato`` command line.

User mistakes (bad options, missing files, unloadable models) end in one ``ostinato: error:``
line and a non-zero exit code, never a traceback. torch and the model are imported only once a
command needs them, so ``ostinato --help`` stays fast.
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import sys
import tempfile
import warnings
from collections import Counter
from pathlib import Path
from typing import List, Optional, Sequence

from . import generate_command
from .errors import InvalidOptionError, ModelLoadError, OstinatoError
from .writers import FORMATS, SubtitleOptions, format_timestamp, write_result

PROG = "ostinato"
EXIT_OK = 0
EXIT_FAILURE = 1  # input or model errors
EXIT_USAGE = 2  # bad command line or option values
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it
# The runtime's names (ostinato.runtime: resolve_dtype, DECODE_LOOPS), repeated here so that --help
# needs no torch; tests/test_cli.py checks that they agree.
COMPUTE_TYPES = ("auto", "float32", "float16", "bfloat16")
DECODE_LOOPS = ("auto", "device", "kstep", "eager")


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
    from .models.whisper.options import TASKS, TranscribeOptions  # no torch: --help stays fast

    defaults = TranscribeOptions()
    parser = _ArgumentParser(prog=PROG, description="Speech transcription (Whisper, NeMo transducers) and text generation "
                                                        "(decoder-only language models) on PyTorch.")
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
    t.add_argument("--compute-type", default="auto", choices=COMPUTE_TYPES,
                   help="float16 or bfloat16 on the CPU warn and compute in float32 (default: auto, float16 "
                        "on CUDA and float32 on the CPU)")
    t.add_argument("--cpu-threads", type=int, default=0, metavar="N",
                   help="PyTorch threads for CPU work (default: 0, one per physical core this process may use)")
    # Whisper's options default to None here: None is "not given", so TranscribeOptions supplies
    # the default (the API's, shown below from the same dataclass) and a transducer model can tell
    # which Whisper options the user set.
    t.add_argument("--language", default=None, help="spoken language code, e.g. en (default: detect)")
    t.add_argument("--task", default=None, choices=TASKS,
                   help=f"transcribe, or translate into English (default: {defaults.task})")
    search = t.add_argument_group("decoding (defaults as faster-whisper's)")
    search.add_argument("--beam-size", type=int, default=None, metavar="N",
                        help=f"beams of the search at temperature 0; 1 = greedy (default: {defaults.beam_size})")
    search.add_argument("--best-of", type=int, default=None, metavar="N",
                        help=f"samples per window at temperatures above 0 (default: {defaults.best_of})")
    search.add_argument("--patience", type=float, default=None, metavar="P",
                        help=f"beam search stops after beam-size x P finished hypotheses (default: {defaults.patience:g})")
    search.add_argument("--length-penalty", type=float, default=None, metavar="A",
                        help=f"hypotheses are ranked by log-probability / length^A (default: {defaults.length_penalty:g})")
    search.add_argument("--temperature", default=None, metavar="T[,T...]",
                        help="a temperature, or comma-separated temperatures to fall back through when a "
                             f"window looks wrong (default: {','.join(f'{x:g}' for x in defaults.temperatures)})")
    search.add_argument("--condition-on-previous-text", action=argparse.BooleanOptionalAction, default=None,
                        help="prompt each window with the text before it "
                             f"(default: {'on' if defaults.condition_on_previous_text else 'off'})")
    search.add_argument("--seed", type=int, default=None, metavar="N",
                        help="seed for sampling at temperatures above 0: the same seed, the same output "
                             f"(default: {defaults.seed})")
    search.add_argument("--clip-timestamps", default=None, metavar="START,END,...",
                        help="transcribe only these spans, in seconds: start,end,start,end,... "
                             "(an open last end runs to the end of the audio; default: all)")
    search.add_argument("--hotwords", default=None, metavar="TEXT",
                        help="words or phrases to prompt the model with (ignored with --prefix)")
    search.add_argument("--prefix", default=None, metavar="TEXT",
                        help="text the first window's transcript must start with")
    t.add_argument("--initial-prompt", default=None, metavar="TEXT", help="text to condition the first window on")
    t.add_argument("--without-timestamps", action="store_true", default=None, help="decode without timestamp tokens")
    t.add_argument("--vad-filter", action="store_true", default=None,
                   help="transcribe only the speech Silero VAD finds, as faster-whisper's vad_filter "
                        "(needs 'ostinato[vad]')")
    t.add_argument("--batched", action="store_true", default=None,
                   help="faster-whisper's batched pipeline: each file is cut at the VAD's silences and its "
                        "chunks decode together (8 at a time, or --batch-size), one segment per chunk")
    t.add_argument("--decode-loop", default="auto", choices=DECODE_LOOPS,
                   help="how decode steps run on CUDA: the device while-loop, graphs of K steps replayed by "
                        "the host, or eagerly (default: auto, the best this machine offers)")
    t.add_argument("--no-graphs", action="store_true", help="do not capture or replay CUDA graphs (--decode-loop eager)")
    t.add_argument("--batch-size", type=int, default=1, metavar="N",
                   help="decode up to N windows of the given files together, refilling rows as windows "
                        "finish (Whisper models; default: 1, one file at a time)")
    words = t.add_argument_group("word timestamps")
    words.add_argument("--word-timestamps", action="store_true", default=None,
                       help="time every word (cross-attention alignment), as faster-whisper does")
    words.add_argument("--hallucination-silence-threshold", type=float, default=None, metavar="SECONDS",
                       help="with --word-timestamps, skip silences longer than this around likely hallucinations")
    words.add_argument("--highlight-words", action="store_true", default=None,
                       help="underline each word as it is spoken in srt and vtt files (needs --word-timestamps)")
    words.add_argument("--max-line-width", type=int, default=None, metavar="N",
                       help="characters per subtitle line before a break (needs --word-timestamps)")
    words.add_argument("--max-line-count", type=int, default=None, metavar="N",
                       help="lines per subtitle cue, with --max-line-width (needs --word-timestamps)")
    words.add_argument("--max-words-per-line", type=int, default=None, metavar="N",
                       help="words per subtitle cue (needs --word-timestamps)")
    t.add_argument("--output-format", "-f", default="all", choices=FORMATS + ("all",),
                   help="transcript file format (default: all)")
    t.add_argument("--output-dir", "-o", default=".", metavar="DIR",
                   help="where to write transcripts, created if missing and checked before the model loads "
                        "(default: .); each is named after its input without the extension (talk.wav -> "
                        "talk.txt), or with it when inputs share a name (a.wav, a.mp3 -> a.wav.txt, a.mp3.txt)")
    talk = t.add_mutually_exclusive_group()
    talk.add_argument("--verbose", "-v", action="store_true",
                      help="say which model, device, dtype and decode loop were chosen, and show the progress "
                           "bar even when stderr is not a terminal")
    talk.add_argument("--quiet", "-q", action="store_true", help="do not print segments")

    s = commands.add_parser(
        "serve",
        help="serve models over an OpenAI-compatible HTTP API",
        description="Serve models over OpenAI's audio API (POST /v1/audio/transcriptions, /v1/audio/translations), "
                    "with /v1/models, /health, /ready, /metrics and a page at /. Needs 'ostinato[server]'.",
    )
    s.add_argument("--model", action="append", default=None, metavar="[NAME=]PATH_OR_ID",
                   help="a model to serve, repeatable (default: the embedded tiny.en, served as tiny.en; "
                        "whisper-1 names the first Whisper model)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default: auto)")
    s.add_argument("--compute-type", default="auto", choices=("auto", "float32", "float16", "bfloat16"))
    s.add_argument("--decode-loop", default="auto", choices=("auto", "device", "kstep", "eager"))
    s.add_argument("--batch-size", type=int, default=16, metavar="N",
                   help="windows of all requests decoded together per model (default: 16)")
    s.add_argument("--beam-size", type=int, default=None, metavar="N",
                   help="the beam size of requests that name none (default: 5, faster-whisper's)")
    s.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' (or set OSTINATO_API_KEY)")
    s.add_argument("--max-upload-mb", type=float, default=25.0, help="largest upload accepted (default: 25)")
    s.add_argument("--max-queue", type=int, default=64,
                   help="audios waiting or running per model before requests get 429 (default: 64)")
    generate_command.add_parser(commands)
    return parser


# Flags that set the TranscribeOptions field of the same name, and openai-whisper's subtitle layout
# flags (SubtitleOptions): Whisper's alone. Given to a transducer they are refused, not ignored.
_TRANSCRIBE_FLAGS = (
    "language", "task", "beam_size", "best_of", "patience", "length_penalty", "temperature",
    "condition_on_previous_text", "seed", "clip_timestamps", "hotwords", "prefix", "initial_prompt",
    "without_timestamps", "word_timestamps", "hallucination_silence_threshold", "vad_filter", "batched",
)
_SUBTITLE_FLAGS = ("highlight_words", "max_line_width", "max_line_count", "max_words_per_line")
_WHISPER_ONLY = _TRANSCRIBE_FLAGS + _SUBTITLE_FLAGS


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _flagged(message: str) -> str:
    """An options error in the command line's words: ``beam_size`` becomes ``--beam-size``."""
    return re.sub(r"\b(temperatures?|batch_size|" + "|".join(_WHISPER_ONLY) + r")\b",
                  lambda m: _flag("temperature" if m.group(1).startswith("temperature") else m.group(1)), message)


def _given(args: argparse.Namespace, names: Sequence[str]) -> dict:
    """The options among ``names`` that the user set (None: not given)."""
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}


def _validate(args: argparse.Namespace) -> None:
    """Reject bad option values before the (slow) model load, with the API's own checks. Sets
    ``args.family``, ``args.subtitle_options`` and ``args.options``: the validated
    ``TranscribeOptions`` of a Whisper model (None for a transducer)."""
    from .checks import check_positive_int
    from .loading import TRANSDUCER, checkpoint_family
    from .runtime import parse_device

    try:
        check_positive_int("batch_size", args.batch_size)
    except InvalidOptionError as exc:
        raise _UsageError(_flagged(str(exc))) from None
    if args.cpu_threads < 0:
        raise _UsageError(f"--cpu-threads must be 0 (one per physical core) or more, got {args.cpu_threads}")
    try:
        parse_device(args.device)
    except InvalidOptionError as exc:
        raise _UsageError(f"--device: {exc}") from None
    try:
        args.family = checkpoint_family(args.model)
    except ModelLoadError as exc:
        raise _UsageError(f"--model: {exc}") from None
    if args.family == TRANSDUCER:
        given = [_flag(name) for name in _given(args, _WHISPER_ONLY)]
        if given:
            raise _UsageError(f"{', '.join(given)}: Whisper options; a NeMo transducer model takes none of them")
        args.options = args.subtitle_options = None
        return
    if not args.word_timestamps:
        # As openai-whisper: the word-level options need word timings.
        for name in _SUBTITLE_FLAGS + ("hallucination_silence_threshold",):
            if getattr(args, name) is not None:
                raise _UsageError(f"{_flag(name)} requires --word-timestamps")
    try:
        args.subtitle_options = SubtitleOptions(**_given(args, _SUBTITLE_FLAGS))
        args.subtitle_options.validate()
        args.options = _transcribe_options(args)
    except InvalidOptionError as exc:
        raise _UsageError(_flagged(str(exc))) from None


def _transcribe_options(args: argparse.Namespace):
    """The ``TranscribeOptions`` of the flags given (the dataclass's defaults for the others),
    validated by the API's code: built once, before the model loads."""
    from .models.whisper.options import TranscribeOptions, parse_temperature

    given = _given(args, _TRANSCRIBE_FLAGS)
    if "temperature" in given:
        given["temperature"] = parse_temperature(given["temperature"])
    options = TranscribeOptions(**given)
    options.validate()
    return options


def _error(message: str) -> None:
    # Exactly one line: messages from lower layers (e.g. a decoder) may span several.
    text = " ".join(str(message).split("\n")).strip() or "unknown error"
    print(f"{PROG}: error: {text}", file=sys.stderr, flush=True)


def _raise_usage(message: str) -> None:
    raise _UsageError(message)


def _exit_for(exc: OstinatoError) -> int:
    """Report a model-load error in one line; a bad option is a usage error, anything else a failure."""
    _error(str(exc))
    return EXIT_USAGE if isinstance(exc, InvalidOptionError) else EXIT_FAILURE


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
    _header(path, args)
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


def _header(path: str, args: argparse.Namespace) -> None:
    """``== FILE`` before a file's segments whenever several files are transcribed, batched or not."""
    if args.headers and not args.quiet:
        print(f"== {path}", flush=True)


def _write(path: str, segments: list, info, args: argparse.Namespace) -> None:
    # Written only after a complete transcription, so a failure leaves no truncated transcript.
    write_result(segments, info, args.output_format, Path(args.output_dir) / args.output_names[path],
                 args.subtitle_options)


def _output_names(paths: Sequence[str], output_dir: str) -> dict:
    """Each input's transcript name, before the format's extension: its file name without the
    extension (talk.wav -> talk), or with it where inputs share that name (a.wav, a.mp3 -> a.wav,
    a.mp3), so no transcript overwrites another. Names still shared (a.wav in two folders) are
    refused before any work. Compared case-folded, as some file systems do."""
    stems = {path: Path(path).stem for path in paths}
    shared = Counter(stem.casefold() for stem in stems.values())
    names = {path: Path(path).name if shared[stem.casefold()] > 1 else stem for path, stem in stems.items()}
    owners: dict = {}
    for path, name in names.items():
        other = owners.setdefault(name.casefold(), path)
        if os.path.realpath(other) != os.path.realpath(path):
            raise _UsageError(f"{other} and {path} would both be written to {os.path.join(output_dir, name)}.*: "
                              "rename one or transcribe them with different --output-dir")
    return names


def _prepare_output_dir(path: str) -> Optional[str]:
    """Create the output directory if missing and write a scratch file there: why that failed, or None.
    Checked before the model loads, so a bad directory costs no transcription."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        return f"cannot create output directory {path}: {exc.strerror or exc}"
    try:
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        return f"cannot write to output directory {path}: {exc.strerror or exc}"
    return None


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
        _header(path, args)
        _print_segments(segments, args)
        try:
            _write(path, segments, info, args)
        except OSError as exc:
            _file_error(path, exc)
            failed = True
    return failed


def _load_model(args: argparse.Namespace):
    from .loading import load_model

    # load_model logs the model, family, device, dtype and decode loop it chose at INFO (shown by -v).
    return load_model(args.model, device=args.device, compute_type=args.compute_type,
                      decode_loop="eager" if args.no_graphs else args.decode_loop, cpu_threads=args.cpu_threads)


class _LogLine(logging.Handler):
    """ostinato's log records as one ``ostinato: ...`` line each (``ostinato: warning: ...`` for
    warnings) on the current stderr."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = " ".join(record.getMessage().split("\n")).strip()
            kind = "warning: " if record.levelno >= logging.WARNING else ""
            print(f"{PROG}: {kind}{text}", file=sys.stderr, flush=True)
        except Exception:  # noqa: BLE001 - logging must never end the command
            self.handleError(record)


@contextlib.contextmanager
def _stderr_logging(verbose: bool):
    """While a command runs: ostinato's warnings (and with ``-v`` its INFO lines: the model, device,
    dtype and decode loop chosen) as single lines on stderr, and ostinato's ``warnings.warn``
    messages too; the logger and the warnings hook are restored afterwards."""
    logger = logging.getLogger(PROG)
    handler, level, show = _LogLine(), logger.level, warnings.showwarning

    def show_warning(message, category, filename, lineno, file=None, line=None):
        text = str(message)
        if text.startswith(f"{PROG}: "):
            logger.warning(text[len(PROG) + 2:])
        else:
            show(message, category, filename, lineno, file, line)

    logger.addHandler(handler)
    logger.setLevel(logging.INFO if verbose else logging.WARNING)
    warnings.showwarning = show_warning
    try:
        yield
    finally:
        warnings.showwarning = show
        logger.removeHandler(handler)
        logger.setLevel(level)


def _run_transcribe(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    with _stderr_logging(args.verbose):
        return _transcribe_files(args)


def _transcribe_files(args: argparse.Namespace) -> int:
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
    args.output_names = _output_names(inputs, args.output_dir)
    args.headers = len(inputs) > 1
    problem = _prepare_output_dir(args.output_dir)
    if problem:
        _error(problem)
        return EXIT_FAILURE

    try:
        model = _load_model(args)
    except OstinatoError as exc:
        return _exit_for(exc)

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


def _run_serve(args: argparse.Namespace) -> int:
    from .runtime import parse_device

    for name in ("batch_size", "max_queue"):
        if getattr(args, name) < 1:
            raise _UsageError(f"{_flag(name)} must be at least 1, got {getattr(args, name)}")
    if args.beam_size is not None and args.beam_size < 1:
        raise _UsageError(f"--beam-size must be at least 1, got {args.beam_size}")
    if not 0 < args.max_upload_mb:
        raise _UsageError(f"--max-upload-mb must be > 0, got {args.max_upload_mb}")
    try:
        parse_device(args.device)
        from .serve.command import parse_models, run

        parse_models(args.model)
    except InvalidOptionError as exc:
        raise _UsageError(str(exc)) from None
    except ImportError as exc:
        _error(f"the server needs its extra: pip install 'ostinato[server]' ({exc.name} is missing)")
        return EXIT_FAILURE
    try:
        return run(args)
    except ImportError as exc:
        _error(f"the server needs its extra: pip install 'ostinato[server]' ({exc.name} is missing)")
        return EXIT_FAILURE
    except OstinatoError as exc:
        return _exit_for(exc)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = _build_parser()
    try:
        try:
            args = parser.parse_args(argv)
        except SystemExit as exc:  # --help and --version print and exit through argparse
            return exc.code if isinstance(exc.code, int) else EXIT_OK
        if args.command is None:
            raise _UsageError(f"missing command (try '{PROG} --help')")
        if args.command == "serve":
            return _run_serve(args)
        if args.command == "generate":
            return generate_command.run(args, _raise_usage, _exit_for)
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
