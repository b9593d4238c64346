"""Model-independent GPU operators (Triton kernels with their availability checks).

Importing this package, or ``triton_support``, never imports Triton; callers ask
``triton_support.kernels_can_run`` and otherwise run their plain PyTorch code. A kernel module
imports Triton with itself: a model module that holds one as a ``LazyModule`` leaves both to its
first use (or to its load's helper thread, ``runtime.preparation``).
"""
from __future__ import annotations

import importlib
import sys


class LazyModule:
    """Stands for the module ``name``, imported at the first attribute lookup (then looked up in
    ``sys.modules`` each time, so a module's later rebinding is seen). Thread-safe as imports are: a
    module another thread is still executing is waited for, as ``import`` waits."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str):
        module = sys.modules.get(self._name)
        if module is None or getattr(getattr(module, "__spec__", None), "_initializing", False):
            module = importlib.import_module(self._name)
        return getattr(module, attr)

    def __repr__(self) -> str:
        return f"<lazy module {self._name!r}>"
