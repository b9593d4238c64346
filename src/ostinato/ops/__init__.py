"""Model-independent GPU operators (Triton kernels with their availability checks).

Each module imports Triton lazily, so importing this package never needs Triton; callers ask
``triton_support.kernels_can_run`` and otherwise run their plain PyTorch code.
"""
