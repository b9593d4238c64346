"""ostinato as a Ray Data stage: ``Dataset.map_batches(Transcriber, ...)``.

Each Ray actor builds one ``Transcriber``, which loads the model once (any family, through
``load_model``) and then transcribes every batch Ray hands it with ``transcribe_batch``'s row
sharing. A row that cannot be read is no failed job: its ``error`` column says why in one line and
every other row of the batch is transcribed. Ray itself is not imported here: the class is plain
Python that Ray calls, so it also works on a pandas DataFrame or a dict of arrays without Ray.

    import ray
    from ostinato.ray import Transcriber

    ds = ray.data.read_binary_files("s3://bucket/audio/", include_paths=True)
    ds = ds.map_batches(Transcriber, fn_constructor_kwargs=dict(model="large-v3", beam_size=5),
                        batch_size=64, concurrency=4, num_gpus=1)
    ds.write_parquet("s3://bucket/transcripts/")
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from .checks import check_positive_int
from .errors import InvalidOptionError, OstinatoError

AUDIO_COLUMNS = ("bytes", "audio", "path")  # where a row's audio comes from, first found wins
OUTPUT_COLUMNS = ("text", "language", "duration", "segments", "error")


class Transcriber:
    """A callable class for ``Dataset.map_batches``: adds ``text``, ``language``, ``duration``,
    ``segments`` (records with ``start``, ``end``, ``text``, ``tokens``, ``words``) and ``error``.

    A batch's audio comes from its ``bytes`` column (``ray.data.read_binary_files``), else its
    ``audio`` column (16-kHz float32 arrays), else its ``path`` column. The other input columns are
    kept; ``bytes`` and ``audio`` are dropped unless ``keep_audio``. Options: ``transcribe``'s
    (Whisper) or ``max_symbols`` (transducers), checked once, when the actor starts; with
    ``batched=True`` each audio is cut into VAD chunks and the chunks of the batch's audios share
    the rows (``transcribe_batch(batched=True)``).
    """

    def __init__(self, model: Optional[str] = None, device: str = "auto", compute_type: str = "auto",
                 batch_size: int = 16, keep_audio: bool = False, **transcribe_options):
        from .loading import load_model

        check_positive_int("batch_size", batch_size)
        self.model = load_model(model, device=device, compute_type=compute_type)
        self.batch_size = batch_size
        self.keep_audio = keep_audio
        self.whisper = hasattr(self.model, "transcribe_many")
        self.model.options(**transcribe_options)  # a bad option fails the actor at start, not per row
        self.options = transcribe_options

    def __call__(self, batch):
        columns = _columns(batch)
        source = next((name for name in AUDIO_COLUMNS if name in columns), None)
        if source is None:
            raise InvalidOptionError(
                f"a batch needs one of the columns {', '.join(AUDIO_COLUMNS)}; it has {', '.join(columns) or 'none'}"
            )
        inputs = [_audio_input(value, source) for value in columns[source]]
        rows = self._transcribe_whisper(inputs) if self.whisper else self._transcribe_transducer(inputs)
        out: Dict[str, Any] = {name: values for name, values in columns.items()
                               if self.keep_audio or name not in ("bytes", "audio")}
        for name in OUTPUT_COLUMNS:
            out[name] = _column([row[name] for row in rows])
        if _is_dataframe(batch):
            import pandas as pd

            return pd.DataFrame({name: list(values) for name, values in out.items()})
        return out

    # -- the families ------------------------------------------------------------------------------
    def _transcribe_whisper(self, inputs: list) -> List[dict]:
        outcomes = self.model.transcribe_many(inputs, batch_size=self.batch_size, **self.options)
        rows = []
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                rows.append(_failed(outcome))
                continue
            segments, info = outcome
            rows.append(dict(text="".join(s.text for s in segments).strip(), language=info.language,
                             duration=float(info.duration), segments=[_segment(s) for s in segments], error=None))
        return rows

    def _transcribe_transducer(self, inputs: list) -> List[dict]:
        from .audio import load_audio

        rows: List[Optional[dict]] = [None] * len(inputs)
        samples, good = [], []
        for i, value in enumerate(inputs):  # each row read on its own: a bad one fails alone
            try:
                samples.append(load_audio(value, self.model.sample_rate))
                good.append(i)
            except OstinatoError as exc:
                rows[i] = _failed(exc)
        results = self.model.transcribe_batch(samples, batch_size=self.batch_size, **self.options) if samples else []
        for i, result in zip(good, results):
            rows[i] = dict(text=result.text, language="", duration=float(result.audio_duration),
                           segments=[_segment(s) for s in self.model.segments(result)], error=None)
        return rows  # type: ignore[return-value]


# -- batches in and out ----------------------------------------------------------------------------
def _is_dataframe(batch) -> bool:
    return type(batch).__name__ == "DataFrame" and hasattr(batch, "columns")


def _columns(batch) -> Dict[str, Sequence]:
    if _is_dataframe(batch):
        return {str(name): batch[name].to_numpy() for name in batch.columns}
    if isinstance(batch, dict):
        return dict(batch)
    raise InvalidOptionError(f"a batch is a dict of columns or a pandas DataFrame, not {type(batch).__name__}")


def _audio_input(value, source: str):
    if source == "audio":
        return np.asarray(value, dtype=np.float32)
    if source == "bytes":
        return bytes(value)
    return str(value)


def _column(values: list) -> np.ndarray:
    column = np.empty(len(values), dtype=object)
    column[:] = values
    return column


def _failed(exc: BaseException) -> dict:
    message = " ".join(str(exc).split()) or type(exc).__name__
    return dict(text="", language="", duration=None, segments=[], error=message)


def _segment(segment) -> dict:
    words = [dict(start=w.start, end=w.end, word=w.word, probability=w.probability) for w in (segment.words or [])]
    return dict(start=float(segment.start), end=float(segment.end), text=segment.text,
                tokens=[int(t) for t in segment.tokens], words=words)
