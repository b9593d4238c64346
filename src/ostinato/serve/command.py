"""``ostinato serve``: load the models, start their engines, run uvicorn until SIGTERM or Ctrl-C."""
from __future__ import annotations

import contextlib
import logging
import signal
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import uvicorn

from .. import settings
from ..errors import InvalidOptionError

log = logging.getLogger("ostinato.serve")

# The interpreter's thread switch interval in the server process (Python's default: 5 ms). Every
# PyTorch call of an engine thread lets go of the interpreter lock and takes it back; while the
# HTTP loop or an audio's worker runs Python, taking it back can wait out the whole interval, and
# the engine thread launches all of the GPU's work. Measured on an H100 (random large-v3, 16
# clients): the short clips' p50 0.35 -> 0.28 s, throughput 92% -> 95% of offline.
SWITCH_INTERVAL_S = 0.0005


def parse_models(specs: Optional[List[str]]) -> List[Tuple[str, Optional[str]]]:
    """``[name=]path_or_id`` specs -> (served id, path); none: the embedded tiny.en as "tiny.en"."""
    if not specs:
        return [("tiny.en", None)]
    served = []
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep:
            path = spec
            name = Path(spec.rstrip("/")).name or spec
            for suffix in (".nemo", ".pt"):
                name = name[: -len(suffix)] if name.endswith(suffix) else name
        if not name or not path:
            raise InvalidOptionError(f"--model takes PATH_OR_ID or NAME=PATH_OR_ID, got {spec!r}")
        served.append((name, path))
    names = [n for n, _ in served]
    if len(set(names)) != len(names):
        raise InvalidOptionError(f"two served models share a name: {', '.join(names)} (use NAME=PATH)")
    return served


def build_services(models: List[Tuple[str, Optional[str]]], *, device: str, compute_type: str, decode_loop: str,
                   batch_size: int, max_search: int, defaults: Dict) -> Dict[str, object]:
    from ..loading import load_model
    from ..runtime import one_cpu_thread_here
    from .services import TransducerService, WhisperService

    # This thread loads the models and then only serves HTTP; each engine runs on a thread of its
    # own. An OpenMP team formed here by the load would make the engines' parallel CPU operators
    # wait for sleeping threads (see one_cpu_thread_here), so this thread's torch work is serial.
    one_cpu_thread_here()
    services = {}
    for name, path in models:
        model = load_model(path, device=device, compute_type=compute_type, decode_loop=decode_loop)
        if hasattr(model, "engine"):
            services[name] = WhisperService(model, batch_size, max_search, defaults)
        else:
            services[name] = TransducerService(model, batch_size)
        log.info("serving %s (%s) on %s", name, services[name].family, model.device)
    return services


def run(args) -> int:
    from .app import create_app

    defaults = {} if args.beam_size is None else {"beam_size": args.beam_size}
    services = build_services(parse_models(args.model), device=args.device, compute_type=args.compute_type,
                              decode_loop=args.decode_loop, batch_size=args.batch_size,
                              max_search=max(args.beam_size or 5, 5), defaults=defaults)
    app = create_app(services, api_key=args.api_key or settings.api_key(),
                     max_upload_mb=args.max_upload_mb, max_queue=args.max_queue)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=None)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    _Server(config).run()
    return 0


class _Server(uvicorn.Server):
    """uvicorn's server, exiting 0 after a SIGTERM or Ctrl-C: on either it stops taking requests,
    lets those in flight finish, then runs the app's shutdown, which drains the engines. (uvicorn
    itself re-raises the signal once done, which would make a clean drain look like a kill.)"""

    @contextlib.contextmanager
    def capture_signals(self):
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
