"""Where a Whisper engine's time goes: its thread's phases, and every audio's waits for it.

    PYTHONPATH=src python dev/engine_timeline.py run OUT_DIR -- python bench/serve_gpu.py --size large-v3 ...
    python dev/engine_timeline.py show OUT_DIR/timeline-*.json

``run`` starts the command with this folder's ``engine_timeline_site`` on PYTHONPATH (a
``sitecustomize`` that imports this module), so every Python process it starts, a server it
launches included, times its ``TranscriptionEngine``: the engine thread's phases (waiting for
requests, answering them, admitting windows into rows, launching and collecting advances), each
request of an audio's worker (features, encode, decode...: from asking to the answer), and each
audio (submitted to finished). Each process writes ``timeline-<pid>.json`` into OUT_DIR at exit.

``show`` splits a file into bursts (audios whose lifetimes overlap: one load level of the serve
benchmark, one ``transcribe_batch`` call) and prints, for each burst of 4 audios or more, the
engine thread's time per phase, each graph capture (and whether it came in the engine's spare
time), each request kind's latency, and the audios' latency split by
request kind, short (under 20 s) and long apart. In a server's process each transcription request's
HTTP span is recorded too (from the app's first look at it to its last byte sent): an audio's split
then also shows the time before it reached the engine (body, form, decode) and after it left
(response), as "http before" and "http after".
"""
from __future__ import annotations

import argparse
import atexit
import contextvars
import itertools
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Dict, List

ENV = "OSTINATO_TIMELINE_DIR"
SITE = Path(__file__).resolve().parent / "engine_timeline_site"
PHASES = ("wait", "answer", "admit", "advance", "collect")

events: List[list] = []  # [name, start, end, detail]
now = time.perf_counter
_http_request = contextvars.ContextVar("engine_timeline_http_request", default=None)
_http_ids = itertools.count()


def install() -> None:
    """Wrap the engine's methods so they record into ``events`` (once the modules are imported)."""
    from ostinato.models.whisper import decoding, engine
    from ostinato.runtime import graphs, scheduler

    def timed(cls, name, label, detail=None):
        original = getattr(cls, name, None)
        if original is None:  # an older ostinato without it
            return

        def wrapper(self, *args, **kwargs):
            start = now()
            result = original(self, *args, **kwargs)
            events.append([label, start, now(), detail(self, args, result) if detail else None])
            return result
        setattr(cls, name, wrapper)

    E = engine.TranscriptionEngine
    timed(E, "_next_requests", "wait", lambda s, a, r: len(r or ()))
    answer_all = E._answer_all

    def _answer_all(self, requests):  # the batch's kinds as it came (answering empties the list)
        start, kinds = now(), [q.kind for q in requests]
        result = answer_all(self, requests)
        events.append(["answer", start, now(), kinds])
        return result
    E._answer_all = _answer_all
    timed(decoding.GreedyRun, "admit", "admit", lambda s, a, r: len(a[0]))
    timed(decoding.GreedyRun, "advance", "advance")
    timed(decoding.GreedyRun, "collect", "collect", lambda s, a, r: len(r))
    timed(graphs.StepGraph, "capture", "capture", lambda s, a, r: f"{s.name} {a[0]}")
    timed(graphs.StepGraph, "capture_deferred", "capture", lambda s, a, r: f"{s.name} (deferred)" if r else None)
    timed(scheduler.RowScheduler, "use_spare_time", "spare", lambda s, a, r: r)
    call = graphs.StepGraph.__call__

    def step_call(self, key, **inputs):  # each step's key, and whether it replayed a graph
        start, replay = now(), key in self._captured
        result = call(self, key, **inputs)
        events.append(["step", start, now(), [self.name, str(key), replay]])
        return result
    graphs.StepGraph.__call__ = step_call

    enqueue, answer, finished, submit = E._enqueue, E._answer, E._worker_finished, E.submit

    def _enqueue(self, request):
        request.worker.asked_at = now()
        return enqueue(self, request)

    def _answer(self, request, result=None, error=None):
        events.append(["request:" + request.kind, getattr(request.worker, "asked_at", 0.0), now(),
                       request.worker.job.index])
        return answer(self, request, result, error)

    def _submit(self, audio, options, on_segment=None):
        start = now()
        job = submit(self, audio, options, on_segment)
        job.timeline = (start, int(getattr(audio, "size", 0) or 0), _http_request.get())
        return job

    def _worker_finished(self, worker, outcome):
        start, samples, http = getattr(worker.job, "timeline", (0.0, 0, None))
        events.append(["audio", start, now(), [worker.job.index, samples, http]])
        return finished(self, worker, outcome)

    E._enqueue, E._answer, E.submit, E._worker_finished = _enqueue, _answer, _submit, _worker_finished


def install_http() -> None:
    """Wrap FastAPI's ASGI entry: each transcription request's span as an "http" event, its id seen
    by the engine's submit (a context variable: the handler submits from the request's own task)."""
    import fastapi

    original = fastapi.FastAPI.__call__

    async def call(self, scope, receive, send):
        if scope.get("type") != "http" or "/audio/" not in scope.get("path", ""):
            return await original(self, scope, receive, send)
        request, start = next(_http_ids), now()
        token = _http_request.set(request)

        async def sending(message):
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                events.append(["http", start, now(), request])
        try:
            return await original(self, scope, receive, sending)
        finally:
            _http_request.reset(token)

    fastapi.FastAPI.__call__ = call


def start_recording(folder: str) -> None:
    """(sitecustomize) Install once ostinato's engine is imported; write the events at exit."""
    def when_imported():
        while True:
            engine = sys.modules.get("ostinato.models.whisper.engine")
            decoding = sys.modules.get("ostinato.models.whisper.decoding")
            if engine and decoding and hasattr(engine, "TranscriptionEngine") and hasattr(decoding, "GreedyRun"):
                install()
                if "fastapi" in sys.modules:  # a server: it imports its app before it loads the model
                    install_http()
                return
            time.sleep(0.005)

    threading.Thread(target=when_imported, daemon=True).start()

    @atexit.register
    def write():
        if events:
            path = Path(folder) / f"timeline-{os.getpid()}.json"
            path.write_text(json.dumps({"argv": sys.argv, "events": events}))


# -- reading ---------------------------------------------------------------------------------------
def bursts(events: List[list]) -> List[tuple]:
    """(start, end, audios) of each group of audios whose lifetimes overlap, in time order."""
    audios = sorted((e for e in events if e[0] == "audio"), key=lambda e: e[1])
    groups: List[list] = []
    for e in audios:
        if groups and e[1] <= groups[-1][1]:
            groups[-1][1] = max(groups[-1][1], e[2])
            groups[-1][2].append(e)
        else:
            groups.append([e[1], e[2], [e]])
    return [tuple(g) for g in groups]


def summary(events: List[list], start: float, end: float, audios: List[list]) -> Dict:
    inside = [e for e in events if start <= e[1] <= end]
    phases = {p: sum(e[2] - e[1] for e in inside if e[0] == p) for p in PHASES}
    requests: Dict[str, List[float]] = defaultdict(list)
    per_audio: Dict[int, Dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for e in inside:
        if e[0].startswith("request:"):
            requests[e[0][8:]].append(e[2] - e[1])
            per_audio[e[3]][e[0][8:]] += e[2] - e[1]
    spans = {e[3]: e for e in events if e[0] == "http"}
    kinds: Dict[str, List[dict]] = defaultdict(list)
    for _, s, t, detail in audios:
        index, samples = detail[0], detail[1]
        split = dict(per_audio[index])
        split["total"] = t - s
        http = spans.get(detail[2]) if len(detail) > 2 else None
        if http is not None:  # served over HTTP: the time before the engine had it and after
            split["http before"], split["http after"] = s - http[1], http[2] - t
        kinds["long" if samples >= 20 * 16000 else "short"].append(split)
    return dict(wall=end - start, phases=phases, requests=dict(requests), audios=dict(kinds))


def _percentile(values: List[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def show(paths: List[str]) -> None:
    for path in paths:
        data = json.loads(Path(path).read_text())
        print(f"== {path}: {' '.join(data['argv'])[:100]}")
        groups = bursts(data["events"])
        lone = [g for g in groups if len(g[2]) == 1]
        if lone:  # an idle server's requests, one at a time: what the loaded ones are compared with
            _print_lone(data["events"], lone)
        for start, end, audios in groups:
            if len(audios) < 4:
                continue
            s = summary(data["events"], start, end, audios)
            print(f"-- {len(audios)} audios in {s['wall']:.2f} s; engine thread: "
                  + ", ".join(f"{p} {t:.2f} s" for p, t in s["phases"].items()))
            inside = [e for e in data["events"] if start <= e[1] <= end]
            _print_captures(inside, start)
            _print_steps(inside)
            for kind, took in sorted(s["requests"].items()):
                print(f"   {kind:<16} {len(took):4d}  p50 {1e3 * statistics.median(took):7.1f} ms"
                      f"  p99 {1e3 * _percentile(took, 0.99):7.1f} ms")
            for kind, splits in sorted(s["audios"].items()):
                total = [x["total"] for x in splits]
                parts = sorted({k for x in splits for k in x} - {"total"})
                mean = ", ".join(f"{k} {1e3 * statistics.mean(x.get(k, 0.0) for x in splits):.0f}" for k in parts)
                print(f"   {kind} audios {len(splits)}: p50 {statistics.median(total):.3f} s, "
                      f"p99 {_percentile(total, 0.99):.3f} s; mean ms spent waiting on {mean}")
                slowest = sorted(splits, key=lambda x: x["total"])[-3:]
                print("     the slowest: " + " | ".join(
                    ", ".join(f"{k} {1e3 * x.get(k, 0.0):.0f}" for k in ["total"] + parts) for x in slowest))
            _print_chain(data["events"], start, audios)


def _print_captures(inside: List[list], start: float) -> None:
    """Each graph capture of a burst (first calls; time from the burst's start), and whether it came
    in the engine's spare time."""
    spare = [(e[1], e[2]) for e in inside if e[0] == "spare" and e[3]]
    captures = [e for e in inside if e[0] == "capture" and e[3] and e[2] - e[1] > 1e-4]  # not: none to capture
    if not captures:
        return
    in_spare = [any(a <= e[1] <= b for a, b in spare) for e in captures]
    total = sum(e[2] - e[1] for e in captures)
    hidden = sum(e[2] - e[1] for e, s in zip(captures, in_spare) if s)
    print(f"   captures {len(captures)}: {1e3 * total:.1f} ms, {1e3 * hidden:.1f} of it in spare time")
    for e, s in zip(captures, in_spare):
        print(f"     {1e3 * (e[2] - e[1]):6.1f} ms at {1e3 * (e[1] - start):7.1f} ms{' (spare)' if s else ''}  {e[3]}")


def _print_steps(inside: List[list]) -> None:
    """Each step graph's calls in a burst by key: how many replayed a graph, how many ran eagerly
    (a key met for the first time, a capture that fell back), and the host time they took."""
    calls: Dict[tuple, List[float]] = defaultdict(list)
    for e in inside:
        if e[0] == "step":
            calls[(e[3][0], e[3][1], "replay" if e[3][2] else "eager")].append(e[2] - e[1])
    for (name, key, how), took in sorted(calls.items()):
        print(f"   step {how:<6} {len(took):4d}  {1e3 * sum(took):7.1f} ms host  {name} {key}")


def _print_chain(events: List[list], start: float, audios: List[list]) -> None:
    """The last audio to finish (the call's critical path): its requests in order, each with when it
    was asked (ms from the burst's start), how long the engine took, and the worker's own time before."""
    last = max(audios, key=lambda e: e[2])
    index = last[3][0]
    mine = sorted((e for e in events if e[0].startswith("request:") and e[3] == index and start <= e[1] <= last[2]),
                  key=lambda e: e[1])
    parts, previous = [], last[1]
    for e in mine:
        parts.append(f"{e[0][8:12]} +{1e3 * (e[1] - previous):.0f} @{1e3 * (e[1] - start):.0f} {1e3 * (e[2] - e[1]):.1f}")
        previous = e[2]
    print(f"   the last audio's requests (kind +own ms @asked took ms): {'; '.join(parts)}; "
          f"+{1e3 * (last[2] - previous):.0f} to its end")


def _print_lone(events: List[list], lone: List[tuple]) -> None:
    """Audios alone on the engine (no other audio's lifetime overlaps theirs): their mean waits."""
    splits = [summary(events, start, end, audios)["audios"] for start, end, audios in lone]
    for kind in ("short", "long"):
        rows = [x for s in splits for x in s.get(kind, [])]
        if not rows:
            continue
        total = [x["total"] for x in rows]
        parts = sorted({k for x in rows for k in x} - {"total"})
        mean = ", ".join(f"{k} {1e3 * statistics.mean(x.get(k, 0.0) for x in rows):.0f}" for k in parts)
        print(f"-- alone, {kind} audios {len(rows)}: p50 {statistics.median(total):.3f} s, "
              f"p99 {_percentile(total, 0.99):.3f} s; mean ms spent waiting on {mean}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = parser.add_subparsers(dest="verb", required=True)
    run = sub.add_parser("run", help="run a command with every engine timed")
    run.add_argument("folder")
    run.add_argument("command", nargs=argparse.REMAINDER)
    sub.add_parser("show", help="print the timelines' summaries").add_argument("paths", nargs="+")
    args = parser.parse_args()
    if args.verb == "show":
        show(args.paths)
        return
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    Path(args.folder).mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, **{ENV: str(Path(args.folder).resolve())})
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SITE), env.get("PYTHONPATH")) if p)
    sys.exit(subprocess.call(command, env=env))


if __name__ == "__main__":
    main()
