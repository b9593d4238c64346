"""Typed exceptions for user mistakes: the CLI turns each into one line and a non-zero exit."""


class OstinatoError(Exception):
    """Base class of every error ostinato raises for bad input or configuration."""


class AudioError(OstinatoError):
    """The audio input is missing, unreadable, not audio, or empty."""


class ModelLoadError(OstinatoError):
    """The model path or id does not name a loadable checkpoint."""


class UnsupportedCheckpointError(ModelLoadError):
    """The checkpoint exists but uses a format or variant ostinato does not support."""


class InvalidOptionError(OstinatoError, ValueError):
    """An option value is out of range or unknown."""


class MissingExtraError(InvalidOptionError):
    """An option needs an optional extra that is not installed (e.g. ``vad_filter``: ``ostinato[vad]``)."""


class GraphInputError(OstinatoError, ValueError):
    """Inputs bound to a captured step graph do not match the shapes, dtypes or device it was captured with."""
