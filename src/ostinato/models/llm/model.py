"""``LanguageModel``: a decoder-only checkpoint loaded once, generating for many prompts at once.

    lm = LanguageModel("path/to/Qwen3-8B")
    outs = lm.generate(["The capital of France is", [151644, 872]], max_new_tokens=32)
    outs[0]            # the new token ids (a list), ending with EOS when one was produced
    outs[0].text       # their text
    lm.chat([{"role": "user", "content": "Hi"}])

Prompts of different lengths decode together on the row scheduler; a row that finishes takes the
next waiting prompt at once.
"""
from __future__ import annotations

import importlib.util
import logging
import os
import secrets
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

import torch

from ...errors import InvalidOptionError, ModelLoadError
from ...runtime import (DEFAULT_BUCKETS, RowScheduler, bucket_for, memory_report, resolve_decode_loop,
                        resolve_device, resolve_dtype, storage_bytes, store_at)
from ...runtime.preparation import prepared_in_background
from .checkpoint import load_weights
from .config import LLMConfig, read_config
from .decoder import GenerationKey, GenerationRun, LLMDecoder, PromptRequest, RowOutput
from .network import DecoderNet
from .sampling import row_seed
from .tokenizer import ChatTokenizer

log = logging.getLogger(__name__)

Prompt = Union[str, Sequence[int]]


class Generation(list):
    """The new token ids of one prompt (a list), with ``text``, ``finish_reason`` ("stop" when an
    end-of-sequence or stop token ended it, else "length") and ``prompt_tokens``."""

    def __init__(self, ids: Sequence[int], text: Optional[str], finish_reason: str, prompt_tokens: int):
        super().__init__(ids)
        self.text, self.finish_reason, self.prompt_tokens = text, finish_reason, prompt_tokens

    def __repr__(self) -> str:
        return f"Generation({list(self)!r}, text={self.text!r}, finish_reason={self.finish_reason!r})"


def _llm_dtype(dtype: Union[str, torch.dtype], device: torch.device) -> torch.dtype:
    """'auto' is bfloat16 on CUDA (language models are trained in it; float16 can overflow) and
    float32 on the CPU."""
    if isinstance(dtype, str) and dtype.strip().lower() == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return resolve_dtype(dtype, device)


class LanguageModel:
    def __init__(self, path: Optional[str] = None, device: str = "auto", dtype: Union[str, torch.dtype] = "auto",
                 *, decode_loop: str = "auto", max_batch_size: int = 64, prefill_chunk: int = 4096,
                 compile: Union[str, bool] = "auto",
                 _net: Optional[DecoderNet] = None, _tokenizer: Optional[ChatTokenizer] = None):
        self.device = resolve_device(device)
        self.dtype = _llm_dtype(dtype, self.device)
        if _net is None:
            if path is None or not os.path.isdir(path):
                raise ModelLoadError(f"{path}: not a folder (a language model is a Hugging Face model folder)")
            config = read_config(path)
            self.tokenizer = ChatTokenizer(path)  # before the weights: a missing tokenizer fails fast
            with torch.device("meta"):
                net = DecoderNet(config)
            with prepared_in_background(self.device):  # first-call work (Triton, CUDA libraries) beside the load
                load_weights(net, path, self.device, self.dtype)
        else:
            net, self.tokenizer = _net, _tokenizer
        self.net = net.placed()
        self.config: LLMConfig = net.config
        self.path = path
        if max_batch_size < 1:
            raise InvalidOptionError(f"max_batch_size must be at least 1, not {max_batch_size}")
        self.max_batch_size = int(max_batch_size)
        loop = resolve_decode_loop(decode_loop, self.device)
        if compile not in ("auto", True, False):
            raise InvalidOptionError(f"compile must be 'auto', True or False, not {compile!r}")
        if compile == "auto":  # on the graph rungs, where Triton can build the fused kernels
            compile = loop != "eager" and importlib.util.find_spec("triton") is not None
        self.decoder = LLMDecoder(self.net, self.device, use_graphs=loop != "eager", decode_loop=loop,
                                  prefill_chunk=prefill_chunk, prefill_tokens=self._prefill_budget(),
                                  compile_step=bool(compile))
        self.decode_loop = loop

    def _prefill_budget(self) -> int:
        """Prompt tokens prefilled per call when many short prompts are admitted at once: as many as
        keep the prefill's activations within about 10% of the weights (a single long prompt still
        goes in chunks of ``prefill_chunk``). Each call costs tens of milliseconds of launches on top
        of its work, so fewer, larger calls prefill a batch of short prompts faster."""
        c = self.config
        width = max(2 * c.intermediate_size, 2 * c.shared_expert_intermediate_size,
                    2 * c.experts_per_token * c.moe_intermediate_size, 3 * c.num_heads * c.head_dim,
                    2 * c.linear_num_key_heads * c.linear_key_head_dim + 2 * c.linear_num_value_heads
                    * c.linear_value_head_dim, 4 * c.hidden_size)
        per_token = 8 * width * self.net.model.embed_tokens.weight.element_size()
        weights = storage_bytes(list(self.net.parameters()))
        return int(min(8192, max(512, 0.10 * weights / per_token)))

    @classmethod
    def from_network(cls, net: DecoderNet, tokenizer: Optional[ChatTokenizer] = None, **options) -> "LanguageModel":
        """A model around a network already on its device (random weights for benchmarks)."""
        weight = net.model.embed_tokens.weight
        return cls(None, device=str(weight.device), dtype=weight.dtype, _net=net, _tokenizer=tokenizer, **options)

    # -- prompts -----------------------------------------------------------------------------------
    def _ids(self, prompt: Prompt, index: int) -> List[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise InvalidOptionError("this model has no tokenizer: give prompts as token ids")
            ids = self.tokenizer.encode(prompt)
        else:
            try:
                ids = [int(t) for t in prompt]
            except (TypeError, ValueError):
                raise InvalidOptionError(f"prompt {index} must be a string or a list of token ids") from None
        if not ids:
            raise InvalidOptionError(f"prompt {index} is empty")
        bad = [t for t in ids if not 0 <= t < self.config.vocab_size]
        if bad:
            raise InvalidOptionError(f"prompt {index} has token id {bad[0]} outside the vocabulary "
                                     f"(0..{self.config.vocab_size - 1})")
        return ids

    def _stop_ids(self, stop) -> tuple:
        ids = list(self.config.eos_token_ids)
        for item in ([] if stop is None else [stop] if isinstance(stop, (str, int)) else list(stop)):
            if isinstance(item, int) and not isinstance(item, bool):
                ids.append(item)
            elif isinstance(item, str) and self.tokenizer is not None and self.tokenizer.token_id(item) is not None:
                ids.append(self.tokenizer.token_id(item))
            else:
                raise InvalidOptionError(f"stop must name token ids or single tokens of the vocabulary; got {item!r}")
        if len(set(ids)) > 16:
            raise InvalidOptionError("at most 16 stop and end-of-sequence tokens")
        return tuple(dict.fromkeys(ids))

    def _text(self, ids: Sequence[int]) -> Optional[str]:
        return self.tokenizer.decode(ids) if self.tokenizer is not None else None

    # -- generating --------------------------------------------------------------------------------
    def generate(self, prompts: Sequence[Prompt], max_new_tokens: int = 256, temperature: float = 0.0,
                 top_p: float = 1.0, top_k: int = 0, seed: Optional[int] = None, stop=None,
                 batch_size: Optional[int] = None) -> List[Generation]:
        """New tokens for each prompt (token ids, or strings to tokenize), decoded together."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            raise InvalidOptionError("prompts must be a list of prompts (wrap a single prompt in a list)")
        if not prompts:
            raise InvalidOptionError("no prompts given")
        requests, key = self._requests(prompts, max_new_tokens, temperature, top_p, top_k, seed, stop)
        results: List[Any] = [None] * len(requests)
        scheduler = self._scheduler(len(requests), requests, batch_size)
        for i, request in enumerate(requests):
            scheduler.submit(key, request, store_at(results, i))
        scheduler.run_until_idle()
        return [self._generation(r, out) for r, out in zip(requests, results)]

    def stream(self, prompt: Prompt, max_new_tokens: int = 256, temperature: float = 0.0, top_p: float = 1.0,
               top_k: int = 0, seed: Optional[int] = None, stop=None, every: int = 8) -> Iterator[str]:
        """The text of one prompt's new tokens as it is made, ``every`` tokens at a time."""
        requests, key = self._requests([prompt], max_new_tokens, temperature, top_p, top_k, seed, stop)
        request = requests[0]
        self._prepare(1, requests)
        run = GenerationRun(self.decoder, GenerationKey(1, key[0]), key[1], stream_every=every)
        (slot,) = run.admit(requests)
        shown = ""
        while True:
            done = run.collect()
            ids = done[slot].ids if done else run.peek(slot)
            text = self._text(_without_stop(ids, request.stop_ids)) or ""
            # hold back a trailing replacement character: the rest of a multi-byte character is coming
            ready = text if done else text.rstrip("\ufffd")
            if len(ready) > len(shown) and ready.startswith(shown):
                yield ready[len(shown):]
                shown = ready
            if done:
                return
            run.advance(False)

    def chat(self, messages: Sequence[Dict[str, Any]], max_new_tokens: int = 256, **options) -> Generation:
        """One reply to a conversation, through the model's chat template."""
        return self.generate([self.chat_prompt(messages)], max_new_tokens=max_new_tokens, **options)[0]

    def chat_prompt(self, messages: Sequence[Dict[str, Any]]) -> List[int]:
        if self.tokenizer is None:
            raise InvalidOptionError("this model has no tokenizer, so no chat template")
        return self.tokenizer.encode(self.tokenizer.apply_chat_template(messages), special=False)

    # -- inside ------------------------------------------------------------------------------------
    def _requests(self, prompts, max_new_tokens, temperature, top_p, top_k, seed, stop):
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise InvalidOptionError(f"max_new_tokens must be a positive integer, not {max_new_tokens!r}")
        if temperature is None or temperature < 0:
            raise InvalidOptionError(f"temperature must be 0 (greedy) or positive, not {temperature!r}")
        if not 0 < top_p <= 1:
            raise InvalidOptionError(f"top_p must be in (0, 1], not {top_p!r}")
        if not isinstance(top_k, int) or top_k < 0:
            raise InvalidOptionError(f"top_k must be 0 (off) or a positive integer, not {top_k!r}")
        sample = temperature > 0
        seed = secrets.randbits(63) if seed is None else int(seed)
        stop_ids = self._stop_ids(stop)
        requests = []
        limit = self.config.max_position_embeddings
        for i, prompt in enumerate(prompts):
            ids = self._ids(prompt, i)
            if len(ids) + max_new_tokens > limit:
                raise InvalidOptionError(f"prompt {i} has {len(ids)} tokens: with max_new_tokens={max_new_tokens} "
                                         f"it exceeds the model's context of {limit} tokens")
            requests.append(PromptRequest(ids, max_new_tokens, float(temperature), int(top_k), float(top_p),
                                          row_seed(seed, i), stop_ids))
        return requests, (sample, stop_ids)

    def _prepare(self, rows: int, requests: Sequence[PromptRequest]) -> None:
        capacity = max(len(r.ids) + r.max_new_tokens for r in requests)
        self.decoder.ensure(rows, capacity, max(r.max_new_tokens for r in requests))

    def _scheduler(self, count: int, requests: Sequence[PromptRequest], batch_size: Optional[int]) -> RowScheduler:
        most = batch_size or self.max_batch_size
        if most < 1:
            raise InvalidOptionError(f"batch_size must be at least 1, not {most}")
        buckets = tuple(b for b in DEFAULT_BUCKETS if b < most) + (most,)
        rows = bucket_for(min(count, most), buckets)
        self._prepare(rows, requests)

        def open_run(key):
            sample, stop_ids = key
            return GenerationRun(self.decoder, GenerationKey(rows, sample), stop_ids)

        return RowScheduler(open_run)

    def _generation(self, request: PromptRequest, out) -> Generation:
        if isinstance(out, BaseException):
            raise out
        assert isinstance(out, RowOutput)
        reason = "stop" if out.finished_by_stop else "length"
        return Generation(out.ids, self._text(out.ids), reason, len(request.ids))

    def memory(self):
        state = self.decoder.state.nbytes() if self.decoder.state is not None else 0
        return memory_report(self.net, state, self.device)


def _without_stop(ids: List[int], stop_ids: tuple) -> List[int]:
    return ids[:-1] if ids and ids[-1] in stop_ids else ids
