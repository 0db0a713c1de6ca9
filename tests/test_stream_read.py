"""The loads-only kernel that times the bar a weight-reading kernel of a given size can reach."""
import pytest
import torch

from helpers import stream_read

pytestmark = pytest.mark.skipif(stream_read.triton is None, reason="triton is not installed")
DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("block_n, wps, split", [(16, 8, 1), (16, 16, 4), (64, 32, 2)])
def test_read_words_reads_every_word_once(block_n, wps, split):
    g = torch.Generator().manual_seed(block_n + wps + split)
    words = torch.randint(-2 ** 31, 2 ** 31 - 1, (40, 128), generator=g, dtype=torch.int32).to(DEV)  # 40 rows: a masked tile
    out = stream_read.read_words(words, block_n, wps, split)
    assert out.numel() == -(-40 // block_n) * split
    assert stream_read.xor_all(out.cpu()) == stream_read.xor_all(words.cpu())
    words[7, 100] ^= 1                      # one bit of one word changes one program's result
    assert stream_read.xor_all(stream_read.read_words(words, block_n, wps, split, out=out).cpu()) \
        == stream_read.xor_all(words.cpu())


def test_bad_input_is_refused():
    w = torch.zeros(8, 64, dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="words must be a 2-D int32 tensor"):
        stream_read.read_words(w.float())
    with pytest.raises(ValueError, match="contiguous rows"):
        stream_read.read_words(torch.zeros(64, 8, dtype=torch.int32, device=DEV).t())
    with pytest.raises(ValueError, match="wps must be a power of 2"):
        stream_read.read_words(w, wps=24)
    with pytest.raises(ValueError, match=r"multiple of wps·split = 32·3"):
        stream_read.read_words(w, wps=32, split=3)
    with pytest.raises(ValueError, match="out must be an int32 buffer of at least 2"):
        stream_read.read_words(w, block_n=8, wps=32, split=2, out=torch.zeros(1, dtype=torch.int32, device=DEV))
