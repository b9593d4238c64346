"""tokenizer.json through ``tokenizers``, and the chat template from tokenizer_config.json (or
chat_template.jinja) rendered with jinja2's sandbox, as transformers renders it."""
from __future__ import annotations

import json
import os
from datetime import datetime
from typing import Any, Dict, List, Optional, Sequence

from ...errors import InvalidOptionError, ModelLoadError


def _token_text(value: Any) -> Optional[str]:
    if isinstance(value, dict):  # an AddedToken written out
        return value.get("content")
    return value if isinstance(value, str) else None


class ChatTokenizer:
    def __init__(self, folder: str):
        from tokenizers import Tokenizer

        path = os.path.join(folder, "tokenizer.json")
        if not os.path.exists(path):
            raise ModelLoadError(f"{folder}: no tokenizer.json (ostinato reads the fast tokenizer's file)")
        try:
            self._tokenizer = Tokenizer.from_file(path)
        except Exception as exc:  # noqa: BLE001 - the library's own parse error, in one line
            raise ModelLoadError(f"{path}: cannot be read ({str(exc).splitlines()[0]})") from None
        settings: Dict[str, Any] = {}
        config_path = os.path.join(folder, "tokenizer_config.json")
        if os.path.exists(config_path):
            with open(config_path, encoding="utf-8") as f:
                settings = json.load(f)
        self.bos_token = _token_text(settings.get("bos_token"))
        self.eos_token = _token_text(settings.get("eos_token"))
        self.add_bos = bool(settings.get("add_bos_token", False)) and self.bos_token is not None
        self.chat_template = self._template(folder, settings)

    @staticmethod
    def _template(folder: str, settings: Dict[str, Any]) -> Optional[str]:
        template = settings.get("chat_template")
        if isinstance(template, list):  # named templates: the default one
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default") or next(iter(named.values()), None)
        jinja = os.path.join(folder, "chat_template.jinja")
        if template is None and os.path.exists(jinja):
            with open(jinja, encoding="utf-8") as f:
                template = f.read()
        return template

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def token_id(self, text: str) -> Optional[int]:
        return self._tokenizer.token_to_id(text)

    def encode(self, text: str, special: bool = True) -> List[int]:
        """Token ids of ``text``; the tokenizer's own template adds BOS where it has one."""
        ids = self._tokenizer.encode(text, add_special_tokens=special).ids
        if special and self.add_bos:
            bos = self.token_id(self.bos_token)
            if bos is not None and (not ids or ids[0] != bos):
                ids = [bos] + ids
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(list(ids), skip_special_tokens=True)

    def apply_chat_template(self, messages: Sequence[Dict[str, Any]], add_generation_prompt: bool = True,
                            **extra: Any) -> str:
        """The conversation as the model was trained to read it (the prompt text, special tokens included)."""
        if not self.chat_template:
            raise InvalidOptionError("this model's tokenizer has no chat template; pass prompts as text or ids")
        if not isinstance(messages, (list, tuple)) or not all(isinstance(m, dict) and "role" in m for m in messages):
            raise InvalidOptionError("messages must be a list of {'role': ..., 'content': ...} dicts")
        return _compiled(self.chat_template).render(
            messages=list(messages), add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "", eos_token=self.eos_token or "", **extra)


_templates: Dict[str, Any] = {}


def _compiled(source: str):
    if source not in _templates:
        from jinja2.exceptions import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise InvalidOptionError(f"chat template: {message}")

        def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                              sort_keys=sort_keys)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            _templates[source] = env.from_string(source)
        except TemplateError as exc:
            raise ModelLoadError(f"the chat template does not parse ({exc})") from None
    return _templates[source]
