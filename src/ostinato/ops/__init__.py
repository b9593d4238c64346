"""Model-independent GPU operators (Triton kernels with their availability checks).

Each module imports Triton lazily, so importing this package never needs Triton; callers ask the
module's ``*_available(device)`` and otherwise run their plain PyTorch code.
"""
