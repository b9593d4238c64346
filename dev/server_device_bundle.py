"""Gather into .carry/server/ what bench/serve_gpu.py needs on the GPU machine: the wheels of
``ostinato[server]`` its image lacks, and a speech recording to cut the requests from.

    python dev/server_device_bundle.py            # cp312 manylinux x86_64 wheels + speech.wav (about 18 MB)
    # on the device (carry .carry/server):
    PHASE=serve ./dev/device_checks.sh            # installs the wheels, runs the GPU tests and the serve bench

The image has anyio, h11, httpx, prometheus-client, annotated-doc and typing-extensions; it lacks FastAPI and what
FastAPI needs beside them, and uvicorn's compiled HTTP parser and event loop (httptools, uvloop).
The versions are the ones installed here (``pip install '.[server]'``), so the device runs what the
CPU tests ran. fastapi 0.165 imports opentelemetry-api at import time: a server without it exits at
start ("the server needs its extra"). speech.wav is the test clips end to
end, cut to 300 s, as a 16-kHz mono 16-bit WAV: the device has no PyAV, and such a WAV needs none.
"""
from __future__ import annotations

import argparse
import sys
from importlib import metadata
from pathlib import Path

from nemo_device_wheels import download_wheels  # a sibling: Python puts dev/ on the path

ROOT = Path(__file__).resolve().parents[1]
DEST = ROOT / ".carry" / "server"
# the distributions the image lacks, and who needs each
MISSING = [
    ("fastapi", "ostinato.serve"),
    ("starlette", "fastapi"),
    ("uvicorn", "ostinato serve"),
    ("python-multipart", "starlette's form parsing"),
    ("pydantic", "fastapi"),
    ("pydantic-core", "pydantic"),
    ("annotated-types", "pydantic"),
    ("typing-inspection", "pydantic, fastapi"),
    ("opentelemetry-api", "fastapi 0.165's telemetry, imported with fastapi"),
    ("httptools", "uvicorn's compiled HTTP parser"),
    ("uvloop", "uvicorn's compiled event loop"),
]
SECONDS = 300.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python-version", default="3.12", help="the device's Python (3.12)")
    ap.add_argument("--dest", type=Path, default=DEST)
    args = ap.parse_args()
    download_wheels([f"{name}=={metadata.version(name)}" for name, _ in MISSING], args.dest, args.python_version)

    sys.path.insert(0, str(ROOT / "bench"))
    from serve_gpu import speech, wav_bytes

    samples = speech(SECONDS)[: int(SECONDS * 16000)]
    (args.dest / "speech.wav").write_bytes(wav_bytes(samples))
    for f in sorted(args.dest.iterdir()):
        print(f"{f.stat().st_size / 1e6:7.2f} MB  {f.name}")
    print(f"{sum(f.stat().st_size for f in args.dest.iterdir()) / 1e6:.1f} MB in {args.dest}")


if __name__ == "__main__":
    main()
