"""The split-KV decode attention (helpers.decode_attention) against PyTorch's SDPA: in Triton's interpreter
on a CPU, on the GPU where there is one; its speed inside a decode step is measured by benchmarks/decode.py."""
import pytest
import torch
from transformers import StaticCache

from helpers import decode_attention as da

pytestmark = pytest.mark.skipif(da.triton is None, reason="triton is not installed")
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def sdpa(q, k, v, mask):
    rep = q.shape[1] // k.shape[1]
    return torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.repeat_interleave(rep, 1).float(), v.repeat_interleave(rep, 1).float(), attn_mask=mask)


@pytest.mark.parametrize("batch,heads,kv_heads,length,dim,dtype", [
    (1, 4, 2, 100, 32, torch.float32),      # GQA, one partial block at the end
    (2, 8, 2, 130, 64, torch.bfloat16),
    (1, 20, 1, 70, 16, torch.float32),      # a group of 20 query heads: two head tiles
    (3, 6, 6, 65, 32, torch.float16),       # plain multi-head
])
def test_split_kv_attention_is_sdpa_for_any_split(batch, heads, kv_heads, length, dim, dtype):
    g = torch.Generator().manual_seed(batch * 100 + length)
    # as transformers hands them over: q transposed from [B, 1, H, D], k and v slices of a longer cache
    q = torch.randn(batch, 1, heads, dim, generator=g).to(dtype=dtype, device=DEV).transpose(1, 2)
    k, v = (torch.randn(batch, kv_heads, length + 7, dim, generator=g).to(dtype=dtype, device=DEV)[:, :, :length]
            for _ in range(2))
    lens = torch.randint(1, length + 1, (batch,), generator=g)
    mask = (torch.arange(length)[None, :] < lens[:, None])[:, None, None, :].to(DEV)   # a static cache's filled part
    tol = 1e-5 if dtype == torch.float32 else 2 ** -7 if dtype == torch.bfloat16 else 2 ** -10
    for m in (mask, mask[:1], None):         # per sequence, one row for the batch, none
        want = sdpa(q, k, v, m)
        for splits in (1, 2, 99):            # one chunk, two, more than there are blocks: the combine is exact
            got = da.decode_attention(q, k, v, m, splits=splits)
            assert got.dtype == dtype and got.shape == q.shape
            assert (got.float() - want).abs().max().item() <= tol * want.abs().max().item() + tol


def test_a_chunk_with_every_position_masked_adds_nothing():
    q, k, v = torch.randn(1, 2, 1, 16, device=DEV), torch.randn(1, 2, 200, 16, device=DEV), torch.randn(1, 2, 200, 16, device=DEV)
    mask = torch.zeros(1, 1, 1, 200, dtype=torch.bool, device=DEV)
    mask[..., :10] = True                   # chunks 2 to 4 see only masked positions
    got = da.decode_attention(q, k, v, mask, splits=4)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, sdpa(q, k, v, mask), rtol=1e-5, atol=1e-5)


def test_bad_shapes_and_masks_are_named():
    q, k = torch.randn(1, 4, 1, 32), torch.randn(1, 2, 50, 32)
    with pytest.raises(ValueError, match="one decode position"):
        da.decode_attention(torch.randn(1, 4, 2, 32), k, k)
    with pytest.raises(ValueError, match="multiple of k's 3 KV heads"):
        da.decode_attention(q, torch.randn(1, 3, 50, 32), torch.randn(1, 3, 50, 32))
    with pytest.raises(ValueError, match="k and v must both be"):
        da.decode_attention(q, k, torch.randn(1, 2, 49, 32))
    with pytest.raises(ValueError, match="power of two"):
        da.decode_attention(torch.randn(1, 4, 1, 24), torch.randn(1, 2, 50, 24), torch.randn(1, 2, 50, 24))
    with pytest.raises(ValueError, match="mask must be a boolean"):
        da.decode_attention(q, k, k, torch.zeros(1, 1, 1, 50))


def decode_logits(model, compiled: bool):
    """Prefill 37 tokens into a static cache of 64, then the logits of three decode steps."""
    torch.manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (2, 37), device=DEV)
    cache = StaticCache(config=model.config, max_cache_len=64)
    with torch.no_grad():
        out = model(input_ids=ids, past_key_values=cache, cache_position=torch.arange(37, device=DEV))
        tok = out.logits[:, -1:].argmax(-1)

        def step(tok, pos):
            return model(input_ids=tok, past_key_values=cache, cache_position=pos).logits
        if compiled:
            step = torch.compile(step, dynamic=False)
        logits = []
        for i in range(3):
            logits.append(step(tok, torch.tensor([37 + i], device=DEV)))
            tok = logits[-1][:, -1:].argmax(-1)
    return torch.cat(logits, 1)


@pytest.mark.parametrize("compiled", [False, True])
def test_a_model_decodes_the_same_through_the_kernel(compiled, monkeypatch, tiny_llama_factory):
    """transformers' SDPA and ours on the same static cache, ours eager and compiled: the mask leaves the
    cache's empty slots out in both. The reference is SDPA eager either way (one compile per case, not two)."""
    def model():
        return tiny_llama_factory(layers=2, seed=0).to(DEV).eval()     # conftest's 2-block GQA Llama, head_dim 16
    want = decode_logits(model(), compiled=False)
    ours = model()
    da.use(ours)
    assert ours.config._attn_implementation == da.NAME
    calls = []
    real = da.decode_attention
    monkeypatch.setattr(da, "decode_attention", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    torch.testing.assert_close(decode_logits(ours, compiled), want, rtol=1e-4, atol=1e-4)
    assert len(calls) == 2 * 3               # every layer of every decode step ran the kernel (the prefill: SDPA)


def test_what_the_kernel_does_not_compute_goes_to_sdpa():
    q, k = torch.randn(1, 4, 1, 32, device=DEV), torch.randn(1, 2, 50, 32, device=DEV)
    ok = torch.ones(1, 1, 1, 50, dtype=torch.bool, device=DEV)
    assert da.kernel_takes(q, k, ok) and da.kernel_takes(q, k, None)
    assert not da.kernel_takes(torch.randn(1, 4, 3, 32), k, None)                        # a prefill
    assert not da.kernel_takes(torch.randn(1, 4, 1, 96), torch.randn(1, 2, 50, 96), ok)  # Phi-3-mini's head_dim
    assert not da.kernel_takes(q, k, ok.float())                                          # an additive mask
    assert not da.kernel_takes(q, k, ok.expand(1, 4, 1, 50))                              # a mask per head
    assert not da.kernel_takes(q, k, ok, softcap=30.0) and not da.kernel_takes(q, k, ok, dropout=0.1)
