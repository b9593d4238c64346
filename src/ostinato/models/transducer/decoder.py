"""Prediction network (NeMo's ``RNNTDecoder``) and joint (``RNNTJoint``) for one label step.

The LSTM is our own cell built from matrix products (one fused product per layer over the
concatenated input and hidden state), so a step is a plain function of (label, h, c) that can run
inside a replayed graph; ``torch.nn.LSTM`` is not used.
"""
from __future__ import annotations

from typing import Dict, Tuple

import torch
from torch import Tensor, nn

from ...ops import cpu_linear
from .nemo_checkpoint import TransducerConfig


class PredictionNetwork(nn.Module):
    """Embedding (the blank id is the zero start/pad embedding) and a stack of LSTM cells."""

    def __init__(self, vocab_size: int, hidden: int, layers: int):
        super().__init__()
        self.hidden = hidden
        self.num_layers = layers
        self.embed = nn.Embedding(vocab_size + 1, hidden)
        # per layer: [4H, 2H] weight over cat(x, h) and the summed input/hidden biases; gate order i, f, g, o
        self.weights = nn.ParameterList(nn.Parameter(torch.zeros(4 * hidden, 2 * hidden)) for _ in range(layers))
        self.biases = nn.ParameterList(nn.Parameter(torch.zeros(4 * hidden)) for _ in range(layers))

    def step(self, labels: Tensor, h: Tensor, c: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """labels [B] -> output [B, H] and the new (h, c), each [L, B, H]; inputs are not modified."""
        x = self.embed(labels)
        hs, cs = [], []
        for layer in range(self.num_layers):
            gates = cpu_linear.linear(torch.cat((x, h[layer]), dim=-1), self.weights[layer], self.biases[layer])
            i, f, g, o = gates.chunk(4, dim=-1)
            c_new = torch.sigmoid(f) * c[layer] + torch.sigmoid(i) * torch.tanh(g)
            x = torch.sigmoid(o) * torch.tanh(c_new)
            hs.append(x)
            cs.append(c_new)
        return x, torch.stack(hs), torch.stack(cs)


_ACTIVATIONS = {"relu": torch.relu, "tanh": torch.tanh, "sigmoid": torch.sigmoid}


class Joint(nn.Module):
    """enc/pred projections (applied once per frame / per label) and the output layer on their sum."""

    def __init__(self, enc_hidden: int, pred_hidden: int, joint_hidden: int, num_outputs: int, activation: str):
        super().__init__()
        self.enc = nn.Linear(enc_hidden, joint_hidden)
        self.pred = nn.Linear(pred_hidden, joint_hidden)
        self.out = nn.Linear(joint_hidden, num_outputs)
        self.activation = _ACTIVATIONS[activation]

    def project_encoder(self, f: Tensor) -> Tensor:
        return self.enc(f)

    def project_prediction(self, g: Tensor) -> Tensor:
        return cpu_linear.linear(g, self.pred.weight, self.pred.bias)

    def forward(self, f_proj: Tensor, g_proj: Tensor) -> Tensor:
        """Logits over labels + blank (+ TDT durations) from projected encoder and prediction outputs."""
        return cpu_linear.linear(self.activation(f_proj + g_proj), self.out.weight, self.out.bias)


def decoder_state_from_nemo(sd: Dict[str, Tensor], cfg: TransducerConfig) -> Dict[str, Tensor]:
    out = {"embed.weight": sd["decoder.prediction.embed.weight"]}
    p = "decoder.prediction.dec_rnn.lstm."
    for layer in range(cfg.pred_layers):
        out[f"weights.{layer}"] = torch.cat((sd[f"{p}weight_ih_l{layer}"], sd[f"{p}weight_hh_l{layer}"]), dim=1)
        out[f"biases.{layer}"] = sd[f"{p}bias_ih_l{layer}"] + sd[f"{p}bias_hh_l{layer}"]
    return out


def joint_state_from_nemo(sd: Dict[str, Tensor]) -> Dict[str, Tensor]:
    out = {f"{name}.{k}": sd[f"joint.{name}.{k}"] for name in ("enc", "pred") for k in ("weight", "bias")}
    # joint_net is [activation, (dropout,) linear]: the output layer is its last indexed entry
    indices = sorted({int(k.split(".")[2]) for k in sd if k.startswith("joint.joint_net.") and k.endswith(".weight")})
    if not indices:
        raise KeyError("joint.joint_net.<n>.weight")
    out["out.weight"] = sd[f"joint.joint_net.{indices[-1]}.weight"]
    out["out.bias"] = sd[f"joint.joint_net.{indices[-1]}.bias"]
    return out
