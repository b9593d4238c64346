"""``ostinato serve`` under load on one GPU: shared rows against one request at a time and offline.

    PYTHONPATH=src python bench/serve_gpu.py [--size large-v3] [--concurrency 1 4 16 64] [--model PATH]
    PYTHONPATH=src python bench/serve_gpu.py --smoke      # CPU, tiny random weights, a few requests

Clients (threads, plain HTTP on the loopback) send a mix of 5-s clips and 10-min recordings
(synthetic: seeded noise and tones) to a server in this process, at each concurrency: every
client sends its share of the requests one after another. The same requests go to (a) the server
as it runs (``--batch-size``: every request's windows share the rows), (b) the same server with row
sharing off (``--batch-size 1``, one window at a time), and (c) offline ``transcribe_batch`` on the
same audio. Random weights in the shape of ``--size`` (or ``--model``), greedy, at most
``--max-new-tokens`` per window, so all three do the same work. Printed: audio-s/s, requests/s and
the short clips' p50/p99 latency, and the short clips' latency on the idle server.
"""
from __future__ import annotations

import argparse
import io
import socket
import statistics
import tempfile
import threading
import time
import wave

import numpy as np
import torch

OPTIONS = dict(beam_size=1, best_of=1, temperature=0.0, language="en", condition_on_previous_text=False)


def clip(seconds: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = int(seconds * 16000)
    t = np.arange(n) / 16000
    tone = 0.1 * np.sin(2 * np.pi * rng.uniform(120, 300) * t) * (np.sin(2 * np.pi * 0.5 * t) > 0)
    return (tone + 0.02 * rng.standard_normal(n)).astype(np.float32)


def wav_bytes(samples: np.ndarray) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes((np.clip(samples, -1, 1) * 32767).astype(np.int16).tobytes())
    return out.getvalue()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class InProcessServer:
    """The app of ``ostinato serve`` on uvicorn in a thread of this process."""

    def __init__(self, model, batch_size: int, max_new_tokens: int):
        import uvicorn

        from ostinato.serve.app import create_app
        from ostinato.serve.services import WhisperService

        self.service = WhisperService(model, batch_size, 1, dict(OPTIONS, max_new_tokens=max_new_tokens))
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1/audio/transcriptions"
        config = uvicorn.Config(create_app({"bench": self.service}, max_queue=10_000, max_upload_mb=200),
                                host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        import httpx

        while not self.server.started:
            time.sleep(0.05)
        while httpx.get(f"http://127.0.0.1:{self.port}/ready").status_code != 200:
            time.sleep(0.1)

    def stop(self):
        self.server.should_exit = True
        self.thread.join(60)


def load(url: str, requests, concurrency: int) -> dict:
    """Send ``requests`` [(kind, seconds, bytes)] from ``concurrency`` clients; latencies by kind."""
    import httpx

    latencies = {"short": [], "long": []}
    failures = []
    lock = threading.Lock()
    work = list(enumerate(requests))

    def client():
        with httpx.Client(timeout=3600) as http:
            while True:
                with lock:
                    if not work:
                        return
                    _, (kind, _, data) = work.pop(0)
                start = time.perf_counter()
                r = http.post(url, files={"file": ("a.wav", data)}, data={"model": "bench", "response_format": "json"})
                if r.status_code != 200:
                    with lock:
                        failures.append(r.text[:300])
                    continue
                with lock:
                    latencies[kind].append(time.perf_counter() - start)

    start = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    if failures:
        raise RuntimeError(f"{len(failures)} request(s) failed, the first: {failures[0]}")
    audio = sum(s for _, s, _ in requests)
    short = sorted(latencies["short"])
    return dict(rate=audio / wall, rps=len(requests) / wall, p50=statistics.median(short),
                p99=short[min(len(short) - 1, int(round(0.99 * (len(short) - 1))))])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--size", default="large-v3")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--short", type=int, default=48, help="5-s clips per load level")
    parser.add_argument("--long", type=int, default=2, help="10-min recordings per load level")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    long_seconds = 600.0
    if args.smoke:
        args.size, args.concurrency, args.short, args.long, long_seconds = "tiny", [1, 4], 6, 1, 40.0
        args.max_new_tokens = 8
    on_gpu = torch.cuda.is_available() and not args.smoke
    device, dtype = ("cuda", "float16") if on_gpu else ("cpu", "float32")
    print(f"device: {torch.cuda.get_device_name(0) if on_gpu else 'cpu'}; torch {torch.__version__}")
    from ostinato import load_model
    from ostinato.testing.random_models import random_whisper_checkpoint

    rng = np.random.default_rng(0)
    requests = [("short", 5.0, wav_bytes(clip(5.0, i))) for i in range(args.short)]
    requests += [("long", long_seconds, wav_bytes(clip(long_seconds, 1000 + i))) for i in range(args.long)]
    order = rng.permutation(len(requests))
    requests = [requests[i] for i in order]
    with tempfile.TemporaryDirectory() as folder:
        path = args.model
        if path is None:
            dims, state = random_whisper_checkpoint(args.size, dtype=torch.float16)
            path = f"{folder}/{args.size}.pt"
            torch.save({"dims": dims.to_dict(), "model_state_dict": state}, path)
            del state
        model = load_model(path, device=device, compute_type=dtype)
        print(f"model: {args.model or 'random ' + args.size}; per level {args.short} x 5 s + {args.long} x "
              f"{long_seconds:.0f} s; greedy, at most {args.max_new_tokens} tokens per window")
        audio = [clip(5.0, i) for i in range(args.short)] + [clip(long_seconds, 1000 + i) for i in range(args.long)]
        model.transcribe_batch(audio[:2], batch_size=args.batch_size, max_new_tokens=args.max_new_tokens, **OPTIONS)
        start = time.perf_counter()
        model.transcribe_batch(audio, batch_size=args.batch_size, max_new_tokens=args.max_new_tokens, **OPTIONS)
        offline = sum(len(a) for a in audio) / 16000 / (time.perf_counter() - start)
        results = {}
        for label, batch in (("shared rows", args.batch_size), ("one at a time", 1)):
            server = InProcessServer(model, batch, args.max_new_tokens)
            idle = load(server.url, [r for r in requests if r[0] == "short"][:8], 1)["p50"]
            for c in args.concurrency:
                results[label, c] = load(server.url, requests, c)
            results[label, "idle"] = idle
            server.stop()
    print(f"\noffline transcribe_batch (batch {args.batch_size}): {offline:.0f} audio-s/s")
    print(f"{'server':<15}{'clients':>8}{'audio-s/s':>11}{'vs offline':>11}{'req/s':>8}{'short p50 s':>12}"
          f"{'short p99 s':>12}{'p99 / idle':>11}")
    for label in ("shared rows", "one at a time"):
        idle = results[label, "idle"]
        for c in args.concurrency:
            r = results[label, c]
            print(f"{label:<15}{c:>8}{r['rate']:>11.0f}{r['rate'] / offline:>10.0%} {r['rps']:>7.2f}{r['p50']:>12.2f}"
                  f"{r['p99']:>12.2f}{r['p99'] / idle:>10.1f}x")
        print(f"{label:<15}{'idle':>8}{'':>11}{'':>11}{'':>8}{idle:>12.2f}")


if __name__ == "__main__":
    main()
