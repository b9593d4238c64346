"""``ostinato generate``: text from a decoder-only language model, streamed to the terminal."""
from __future__ import annotations

import argparse
import sys

from .errors import InvalidOptionError, OstinatoError


def add_parser(commands) -> None:
    g = commands.add_parser(
        "generate",
        help="generate text with a decoder-only language model",
        description="Continue a prompt (or answer it as a chat message with --chat) with a Hugging Face "
                    "decoder-only model (Llama, Qwen3, Qwen3-MoE, Qwen3-Next, Qwen3.5), printing the text "
                    "as it is made.",
    )
    g.add_argument("prompt", help="the prompt text ('-' reads it from standard input)")
    g.add_argument("--model", required=True, metavar="PATH", help="a Hugging Face model folder")
    g.add_argument("--max-new-tokens", type=int, default=256, metavar="N", help="tokens to generate at most (default: 256)")
    g.add_argument("--temperature", type=float, default=0.0, metavar="T", help="0 is greedy (default: 0)")
    g.add_argument("--top-p", type=float, default=1.0, metavar="P", help="nucleus sampling mass (default: 1)")
    g.add_argument("--top-k", type=int, default=0, metavar="K", help="sample among the K likeliest (default: 0, all)")
    g.add_argument("--seed", type=int, default=None, metavar="N", help="seed for sampling: the same seed, the same text")
    g.add_argument("--chat", action="store_true", help="send the prompt as a user message through the chat template")
    g.add_argument("--system", default=None, metavar="TEXT", help="with --chat, a system message first")
    g.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default: auto)")
    g.add_argument("--dtype", default="auto", choices=("auto", "float32", "float16", "bfloat16"),
                   help="default: bfloat16 on CUDA, float32 on the CPU")
    g.add_argument("--decode-loop", default="auto", choices=("auto", "device", "kstep", "eager"))


def run(args: argparse.Namespace, usage_error, report) -> int:
    """``usage_error(message)`` raises the CLI's usage error; ``report(exc)`` prints an error and returns the exit code."""
    if args.max_new_tokens < 1:
        usage_error(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    if args.temperature < 0:
        usage_error(f"--temperature must be 0 or more, got {args.temperature:g}")
    if not 0 < args.top_p <= 1:
        usage_error(f"--top-p must be in (0, 1], got {args.top_p:g}")
    if args.top_k < 0:
        usage_error(f"--top-k must be 0 or more, got {args.top_k}")
    if args.system is not None and not args.chat:
        usage_error("--system needs --chat")
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    try:
        from .models.llm.model import LanguageModel

        model = LanguageModel(args.model, device=args.device, dtype=args.dtype, decode_loop=args.decode_loop)
        if args.chat:
            messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
                {"role": "user", "content": prompt}]
            prompt = model.chat_prompt(messages)
        pieces = model.stream(prompt, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                              top_p=args.top_p, top_k=args.top_k, seed=args.seed)
        for piece in pieces:
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
        sys.stdout.flush()
    except InvalidOptionError as exc:
        usage_error(str(exc))
    except OstinatoError as exc:
        return report(exc)
    return 0
