"""``ostinato.load_model`` picks the family from what the checkpoint holds, never from its name, and each
family's class names the right one for a checkpoint of another."""
import json
import logging
import os
import shutil
from pathlib import Path

import pytest

import ostinato
from ostinato.errors import ModelLoadError, UnsupportedCheckpointError
from ostinato.loading import LANGUAGE_MODEL, TRANSDUCER, WHISPER, checkpoint_family

DATA = Path(__file__).parent / "data"
CT2 = DATA / "checkpoints" / "ctranslate2" / "float16"
HF = DATA / "checkpoints" / "huggingface"
OPENAI_PT = DATA / "checkpoints" / "openai" / "tiny-random.pt"
NEMO = DATA / "transducer" / "tiny_tdt.nemo"


@pytest.mark.parametrize("path", [CT2, HF, OPENAI_PT, HF / "config.json",
                                  CT2 / "model.bin"])
def test_whisper_checkpoints(path):
    assert checkpoint_family(path) == WHISPER


def test_the_family_comes_from_the_contents(tmp_path):
    # a .nemo under a Whisper-looking name, and Whisper folders and files under NeMo's suffix
    nemo_as_bin = tmp_path / "model.bin"
    shutil.copy(NEMO, nemo_as_bin)
    ct2_as_nemo = tmp_path / "ct2.nemo"
    shutil.copytree(CT2, ct2_as_nemo)
    pt_as_nemo = tmp_path / "weights.nemo"
    shutil.copy(OPENAI_PT, pt_as_nemo)
    hf_as_nemo = tmp_path / "hf.nemo"
    shutil.copytree(HF, hf_as_nemo)
    assert checkpoint_family(hf_as_nemo) == WHISPER
    assert checkpoint_family(NEMO) == TRANSDUCER
    assert checkpoint_family(nemo_as_bin) == TRANSDUCER
    assert checkpoint_family(ct2_as_nemo) == WHISPER
    assert checkpoint_family(pt_as_nemo) == WHISPER
    assert type(ostinato.load_model(nemo_as_bin, device="cpu")).__name__ == "TransducerModel"
    assert type(ostinato.load_model(ct2_as_nemo, device="cpu")).__name__ == "WhisperModel"
    assert type(ostinato.load_model(pt_as_nemo, device="cpu")).__name__ == "WhisperModel"


def test_a_language_model_folder_is_recognised(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    assert checkpoint_family(tmp_path) == LANGUAGE_MODEL
    with pytest.raises(UnsupportedCheckpointError, match="language model checkpoint: load it with ostinato.LanguageModel"):
        ostinato.WhisperModel(str(tmp_path))
    with pytest.raises(ModelLoadError, match="cannot read the text model.s config"):  # load_model hands it on
        ostinato.load_model(str(tmp_path), device="cpu")


def test_each_class_names_the_right_one(tmp_path):
    nemo_as_pt = tmp_path / "model.pt"  # whatever it is called
    shutil.copy(NEMO, nemo_as_pt)
    for path in (NEMO, nemo_as_pt):
        with pytest.raises(UnsupportedCheckpointError,
                           match="is a NeMo transducer checkpoint: load it with ostinato.TransducerModel or "
                                 "ostinato.load_model"):
            ostinato.WhisperModel(str(path), device="cpu")
    with pytest.raises(UnsupportedCheckpointError,
                       match="is a Whisper checkpoint: load it with ostinato.WhisperModel or ostinato.load_model"):
        ostinato.TransducerModel(str(CT2), device="cpu")
    for path in (OPENAI_PT, HF):
        with pytest.raises(UnsupportedCheckpointError, match="is a Whisper checkpoint"):
            ostinato.TransducerModel(str(path), device="cpu")


def test_nothing_recognisable(tmp_path):
    junk = tmp_path / "model.nemo"
    junk.write_bytes(b"junk")
    empty = tmp_path / "empty"
    empty.mkdir()
    for path in (junk, empty):
        assert checkpoint_family(path) is None
        with pytest.raises(UnsupportedCheckpointError, match="holds no checkpoint ostinato knows"):
            ostinato.load_model(path)
    with pytest.raises(ModelLoadError, match="does not exist"):
        ostinato.load_model(str(tmp_path / "missing" / "model"))


def test_default_and_hub_ids_are_whisper():
    assert checkpoint_family(None) == WHISPER
    assert checkpoint_family("openai/whisper-tiny") == WHISPER


def test_an_empty_name_is_refused_by_every_entry_point():
    for load in (ostinato.load_model, ostinato.WhisperModel, ostinato.TransducerModel):
        with pytest.raises(ModelLoadError, match="empty"):
            load("  ")


def test_keyword_arguments_pass_through_and_the_choice_is_logged(caplog):
    import torch

    with caplog.at_level(logging.INFO, logger="ostinato"):
        model = ostinato.load_model(OPENAI_PT, device="cpu", compute_type="float32", use_graphs=False)
        transducer = ostinato.load_model(str(NEMO), device="cpu", decode_loop="eager")
    assert (model.device.type, model.dtype, model.decode_loop) == ("cpu", torch.float32, "eager")
    assert transducer.device.type == "cpu"
    chosen = [r.getMessage() for r in caplog.records if r.name == "ostinato.loading"]
    threads = torch.get_num_threads()
    # the layout named is the one the decode steps' weights are held in (ops.cpu_linear)
    whisper_layout = _layout(model.model.decoder.token_embedding.weight, *model.model.decoder.blocks[0].mlp[0].parameters())
    transducer_layout = _layout(*transducer.network.prednet.weights, transducer.network.joint.out.weight)
    from ostinato.ops import cpu_linear

    mode = cpu_linear.reproducibility()
    assert mode == "on" or mode.startswith("off (")
    lone = {layout: ("as among others (OSTINATO_CPU_BATCH_INVARIANT=1)" if cpu_linear.batch_invariant else
                     "on the one-row kernel" if layout == "in-major" else "as among others")
            for layout in ("in-major", "out-major")}
    assert chosen == [
        f"Whisper model {model.model_path} on cpu, float32; decode loop: {model.decoder.loop_rung}; "
        f"CPU threads: {threads}; step weights {whisper_layout}, MKL strict reproducibility {mode}, a lone row {lone[whisper_layout]}",
        f"NeMo transducer model {NEMO} on cpu, float32; decode loop: {transducer.decoder.loop_rung}; "
        f"CPU threads: {threads}; step weights {transducer_layout}, MKL strict reproducibility {mode}, a lone row {lone[transducer_layout]}",
    ]


def _layout(*weights) -> str:
    from ostinato.ops import cpu_linear

    layouts = {"in-major" if cpu_linear.is_in_major(w) else "out-major" for w in weights if w.dim() == 2}
    assert len(layouts) == 1, layouts
    return layouts.pop()


@pytest.fixture
def torch_threads(monkeypatch):
    """PyTorch's thread count, put back afterwards; no OMP_NUM_THREADS to defer to."""
    import torch

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    previous = torch.get_num_threads()
    yield torch
    torch.set_num_threads(previous)


def test_cpu_threads_set_pytorchs_thread_count(torch_threads, caplog):
    from ostinato.runtime.device import usable_cpus

    torch = torch_threads
    assert ostinato.load_model(OPENAI_PT, device="cpu", cpu_threads=1).cpu_threads == 1
    assert torch.get_num_threads() == 1
    assert ostinato.load_model(str(NEMO), device="cpu", cpu_threads=2).cpu_threads == 2
    assert torch.get_num_threads() == 2
    with caplog.at_level(logging.WARNING, logger="ostinato"):
        ostinato.WhisperModel(str(OPENAI_PT), device="cpu", cpu_threads=usable_cpus() + 1)
    assert torch.get_num_threads() == usable_cpus() + 1  # asked for: done, with a warning
    assert any("more than the" in r.getMessage() for r in caplog.records)


def test_default_cpu_threads_never_oversubscribe(torch_threads):
    from ostinato.runtime import default_cpu_threads
    from ostinato.runtime.device import physical_cores, usable_cpus

    torch = torch_threads
    cores = default_cpu_threads()
    assert 1 <= cores == min(physical_cores(), usable_cpus()) <= (os.cpu_count() or 1)
    assert physical_cores({0}) == 1
    torch.set_num_threads(cores + 3)  # more threads than cores: lowered to the cores
    assert ostinato.WhisperModel(str(OPENAI_PT), device="cpu").cpu_threads == cores == torch.get_num_threads()
    torch.set_num_threads(1)  # fewer (an OMP_NUM_THREADS, a caller's choice): kept
    assert ostinato.WhisperModel(str(OPENAI_PT), device="cpu").cpu_threads == 1


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2"])
def test_bad_cpu_threads_are_refused_before_loading(bad, torch_threads):
    from ostinato.errors import InvalidOptionError

    for load in (ostinato.WhisperModel, ostinato.load_model):
        with pytest.raises(InvalidOptionError, match="cpu_threads must be an integer >= 0"):
            load("no/such/checkpoint", device="cpu", cpu_threads=bad)
