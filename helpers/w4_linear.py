"""A ``Linear`` that keeps its weight packed at 4 bits and runs the W4A16 kernels, and the swap that
puts one in place of every linear of a model (what an int4 engine does at load time)."""
from __future__ import annotations

import torch

from .w4_format import W4Weight, dequantize_w4, pack_w4
from .w4_kernel import DEFAULT_CONFIG, auto_config, block_rows, w4a16_matmul


class W4Linear(torch.nn.Module):
    """A ``Linear`` whose weight lives packed (0.5 byte per weight + 4 bytes per group, registered as
    buffers so ``state_dict`` and byte counts see them) and runs through :func:`w4a16_matmul`, with one
    configuration per row tile (``configs``: 1 for one row, else the :func:`block_rows` value → config;
    :func:`auto_config` where none is given).

    Above ``dense_above`` rows (prefill, large batches) the int4 kernels lose to a 16-bit GEMM (the
    crossover measured in notebook 08), so the layer dequantizes its weight for that call and uses
    cuBLAS — what engines do too (vLLM's AWQ path dequantizes from 256 tokens); the cost is one
    transient dense copy of this layer's weight."""

    def __init__(self, linear: torch.nn.Linear, group_size: int = 128, configs: dict | None = None,
                 dense_above: int = 16, family: dict | None = None):
        super().__init__()
        p = pack_w4(linear.weight.data, group_size)
        self.register_buffer("words", p.words)
        self.register_buffer("scale", p.scale)
        self.register_buffer("zero", p.zero)
        # the serial split-K counters: one per output tile (≥ 16 columns wide, ≤ 4 row tiles up to 64 rows)
        self.register_buffer("locks", torch.zeros(-(-p.shape[0] // 16) * 4, dtype=torch.int32, device=p.words.device),
                             persistent=False)
        self.group_size, self.shape = group_size, p.shape
        self.bias = linear.bias
        self.configs = dict(configs or {})    # row tile → config; filled from auto_config(family) on first use
        self.family = family
        self.dense_above = dense_above

    @property
    def p(self) -> W4Weight:
        return W4Weight(self.words, self.scale, self.zero, self.group_size, self.shape)

    def forward(self, x):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if x2.shape[0] > self.dense_above:
            y = x2 @ dequantize_w4(self.p, x2.dtype).T
        else:
            m = x2.shape[0]
            if x2.dtype == torch.float32 and m > 1:   # tensor cores take 16-bit activations
                y = x2 @ dequantize_w4(self.p, x2.dtype).T
                y = y.reshape(*shape[:-1], self.shape[0])
                return y + self.bias if self.bias is not None else y
            if x2.dtype == torch.float32:
                cfg = DEFAULT_CONFIG                  # one fp32 row: the CUDA-core GEMV
            else:
                tile = 1 if m == 1 else block_rows(m)   # one row: the GEMV; more: a tensor-core row tile
                cfg = self.configs.get(tile)
                if cfg is None:
                    cfg = self.configs[tile] = auto_config(self.p, tile, self.family)
            y = w4a16_matmul(x2, self.p, cfg, locks=self.locks)
        y = y.reshape(*shape[:-1], self.shape[0])
        return y + self.bias if self.bias is not None else y


def swap_linears(model, group_size: int = 128, configs: dict | None = None, skip=("lm_head",),
                 family: dict | None = None) -> int:
    """Replace every ``nn.Linear`` of ``model`` (except names containing one of ``skip``) by a
    :class:`W4Linear`; ``configs[(N, K)]`` gives each shape's per-tile configs, ``family`` the kernel
    family the others' :func:`auto_config` uses. Returns how many."""
    n = 0
    for name, mod in list(model.named_modules()):
        for child, lin in list(mod.named_children()):
            full = f"{name}.{child}" if name else child
            if isinstance(lin, torch.nn.Linear) and not any(s in full for s in skip):
                shape = (lin.out_features, lin.in_features)
                setattr(mod, child, W4Linear(lin, group_size, (configs or {}).get(shape), family=family))
                n += 1
    return n
