"""The tensors of a TorchScript archive, read without TorchScript.

``torch.jit.load`` compiles every method the archive carries before handing back its weights:
64-74 ms for silero-vad 6.0's file (two networks and their code), paid by the first VAD use of a
process, where reading the weights alone takes 9 ms. An archive is a zip: ``data.pkl`` pickles the
module tree, each module's attributes as a dict, the tensors' bytes in ``data/<key>``. The
unpickler here builds plain stand-ins for the modules and real tensors for the rest, and refuses
any other global (so nothing of the archive runs). Its result equals ``torch.jit.load(path)
.state_dict()``, besides the modules' non-parameter tensor attributes, named the same way.
"""
from __future__ import annotations

import pickle
import warnings
import zipfile
from pathlib import Path
from typing import Dict

import torch

# the globals a TorchScript data.pkl may name besides its own modules' classes
_ALLOWED = {("torch._utils", "_rebuild_tensor_v2"), ("collections", "OrderedDict")}


class ArchiveError(ValueError):
    """The archive holds something this reader does not build (the caller falls back to torch.jit)."""


class _Module:
    """A scripted module's stand-in: its pickled attributes."""

    def __setstate__(self, state):
        self.attributes = state


def read_tensors(path) -> Dict[str, torch.Tensor]:
    """Every tensor attribute of the archive's module tree, by dotted name, on the CPU."""
    with zipfile.ZipFile(Path(path)) as archive:
        names = archive.namelist()
        root = names[0].split("/")[0] if names else ""
        if f"{root}/data.pkl" not in names:
            raise ArchiveError(f"{path} is not a TorchScript archive (no data.pkl)")

        class Unpickler(pickle.Unpickler):
            def find_class(self, module, name):
                if module.startswith("__torch__"):
                    return type(name, (_Module,), {})
                if (module, name) in _ALLOWED or module == "torch.jit._pickle":  # build_intlist and the like
                    return super().find_class(module, name)
                if module == "torch" and name.endswith("Storage"):
                    return getattr(torch, name)
                raise ArchiveError(f"{path}: unexpected global {module}.{name}")

            def persistent_load(self, pid):
                _, storage_type, key, _, _ = pid
                data = bytearray(archive.read(f"{root}/data/{key}"))
                untyped = torch.UntypedStorage.from_buffer(data, dtype=torch.uint8) if data else torch.UntypedStorage(0)
                return torch.storage.TypedStorage(wrap_storage=untyped, dtype=storage_type.dtype, _internal=True)

        with warnings.catch_warnings():  # TypedStorage is what _rebuild_tensor_v2 takes; it warns it is deprecated
            warnings.simplefilter("ignore", UserWarning)
            with archive.open(f"{root}/data.pkl") as pickled:
                top = Unpickler(pickled).load()
    tensors: Dict[str, torch.Tensor] = {}
    _collect(top, "", tensors)
    return tensors


def _collect(module, prefix: str, out: Dict[str, torch.Tensor]) -> None:
    attributes = getattr(module, "attributes", None)
    if not isinstance(attributes, dict):
        return
    for name, value in attributes.items():
        if isinstance(value, torch.Tensor):
            out[prefix + name] = value
        elif isinstance(value, _Module):
            _collect(value, f"{prefix}{name}.", out)
