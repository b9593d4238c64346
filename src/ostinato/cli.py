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

from .errors import InvalidOptionError, ModelLoadError, OstinatoError
from .writers import FORMATS, format_timestamp, write_result

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
    t.add_argument("--beam-size", type=int, default=1, metavar="N", help="1 = greedy (default: 1)")
    t.add_argument("--temperature", type=float, default=0.0, metavar="T", help="sampling temperature (default: 0)")
    t.add_argument("--initial-prompt", default=None, metavar="TEXT", help="text to condition the first window on")
    t.add_argument("--without-timestamps", action="store_true", help="decode without timestamp tokens")
    t.add_argument("--no-graphs", action="store_true", help="do not capture or replay CUDA graphs")
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
    if not (math.isfinite(args.temperature) and args.temperature >= 0):
        raise _UsageError(f"--temperature must be a finite number >= 0, got {args.temperature}")
    if not _DEVICE_RE.match(args.device):
        raise _UsageError(f"--device must be auto, cpu, cuda or cuda:N, got {args.device!r}")
    if args.language is not None and not args.language.strip():
        raise _UsageError("--language must not be empty (leave it out to detect the language)")
    if args.model is not None and not args.model.strip():
        raise _UsageError("--model must not be empty (leave it out for the embedded model)")


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


def _transcribe_one(model, path: str, args: argparse.Namespace, show_progress: bool) -> None:
    if hasattr(model, "transcribe_segments"):  # transducer: segments from token times
        segments, info = model.transcribe_segments(path)
    else:
        segments, info = model.transcribe(
            path,
            language=args.language,
            task=args.task,
            beam_size=args.beam_size,
            temperature=args.temperature,
            initial_prompt=args.initial_prompt,
            without_timestamps=args.without_timestamps,
        )
    collected = []
    bar = None
    if show_progress:
        from tqdm import tqdm

        total = max(float(info.duration or 0.0), 0.0)
        bar = tqdm(total=round(total, 2), unit="s", desc=Path(path).name, file=sys.stderr, leave=True,
                   bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.2f}/{total:.2f} s [{elapsed}<{remaining}]")
    try:
        # Segments come from a generator: decoding happens while we iterate, so errors do too.
        for segment in segments:
            collected.append(segment)
            if not args.quiet:
                line = (f"[{format_timestamp(segment.start)} --> {format_timestamp(segment.end)}] "
                        f"{segment.text.strip()}")
                if bar is not None:
                    bar.write(line, file=sys.stdout)  # keeps the bar from tearing the line
                else:
                    print(line, flush=True)
            if bar is not None:
                done = min(round(segment.end, 2), bar.total)
                if done > bar.n:
                    bar.update(done - bar.n)
        if bar is not None and bar.total > bar.n:
            bar.update(bar.total - bar.n)
    finally:
        if bar is not None:
            bar.close()
    # Written only after a complete transcription, so a failure leaves no truncated transcript.
    write_result(collected, info, args.output_format, Path(args.output_dir) / Path(path).stem)


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
