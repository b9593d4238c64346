"""Model names and Hugging Face hub ids -> a local snapshot directory.

huggingface_hub is imported lazily so that loading a local checkpoint never pays for it.
"""
from __future__ import annotations

import re
from pathlib import Path

from ostinato import settings
from ostinato.errors import ModelLoadError

# Official size names -> the CTranslate2 conversions faster-whisper uses, so a name means
# the same weights here as there.
OFFICIAL_REPOS = {
    "tiny.en": "Systran/faster-whisper-tiny.en",
    "tiny": "Systran/faster-whisper-tiny",
    "base.en": "Systran/faster-whisper-base.en",
    "base": "Systran/faster-whisper-base",
    "small.en": "Systran/faster-whisper-small.en",
    "small": "Systran/faster-whisper-small",
    "medium.en": "Systran/faster-whisper-medium.en",
    "medium": "Systran/faster-whisper-medium",
    "large-v1": "Systran/faster-whisper-large-v1",
    "large-v2": "Systran/faster-whisper-large-v2",
    "large-v3": "Systran/faster-whisper-large-v3",
    "large": "Systran/faster-whisper-large-v3",
    "large-v3-turbo": "mobiuslabsgmbh/faster-whisper-large-v3-turbo",
    "turbo": "mobiuslabsgmbh/faster-whisper-large-v3-turbo",
    "distil-small.en": "Systran/faster-distil-whisper-small.en",
    "distil-medium.en": "Systran/faster-distil-whisper-medium.en",
    "distil-large-v2": "Systran/faster-distil-whisper-large-v2",
    "distil-large-v3": "Systran/faster-distil-whisper-large-v3",
}

# Only what some loader reads: weights, configs, tokenizer and CT2 vocabulary files.
ALLOW_PATTERNS = ["config.json", "*.safetensors", "*.json", "model.bin", "vocabulary.*", "tokenizer.json"]

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")


def is_hub_id(name: str) -> bool:
    """An official size name or an 'org/name' repository id."""
    return name in OFFICIAL_REPOS or bool(_REPO_ID.match(name))


def download(name: str) -> Path:
    """Local directory of the snapshot for `name`, from the cache when possible."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    repo_id = OFFICIAL_REPOS.get(name, name)
    kwargs = dict(repo_id=repo_id, allow_patterns=ALLOW_PATTERNS, cache_dir=settings.hub_cache_dir())
    unreachable = (
        f"model '{name}' is not in the local cache and the hub cannot be reached (offline?): "
        "pass a local path"
    )
    try:
        return Path(snapshot_download(local_files_only=True, **kwargs))
    except Exception:  # not cached (or an incomplete snapshot): try the network
        pass
    if settings.hub_offline():
        raise ModelLoadError(unreachable)
    try:
        return Path(snapshot_download(**kwargs))
    except GatedRepoError:
        raise ModelLoadError(f"model '{name}' ({repo_id}) is gated on the hub: log in or pass a local path") from None
    except RepositoryNotFoundError:
        raise ModelLoadError(f"model '{name}' ({repo_id}) does not exist on the Hugging Face hub") from None
    except (ConnectionError, TimeoutError, OSError):
        # Connection failures, offline mode and "not cached" all surface as OSError kinds.
        raise ModelLoadError(unreachable) from None
    except Exception as e:  # e.g. a proxy error: still one line, never a traceback
        raise ModelLoadError(f"cannot download model '{name}' ({repo_id}): {type(e).__name__}: {e}".splitlines()[0]) from None
