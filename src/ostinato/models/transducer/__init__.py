"""NeMo FastConformer transducers (RNN-T and TDT, e.g. Parakeet): checkpoint reader, preprocessor,
encoder, prediction network and joint, and greedy label-looping decoding on the device."""
from .model import TransducerModel, TransducerResult

__all__ = ["TransducerModel", "TransducerResult"]
