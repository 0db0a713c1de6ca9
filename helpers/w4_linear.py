"""A ``Linear`` that keeps its weight packed at 4 bits and runs the W4A16 kernels, and the swap that
puts one in place of every linear of a model (what an int4 engine does at load time)."""
from __future__ import annotations

import json

import torch

from .w4_format import W4Weight, dequantize_w4, pack_w4
from .w4_kernel import DEFAULT_CONFIG, auto_config, block_rows, one_row_prepared, pack_width, w4a16_matmul


def w4a16_op():
    """:func:`w4a16_matmul` as the custom operator ``torch.ops.course.w4a16_matmul`` (registered on
    first use): what ``torch.compile`` needs to fuse everything around our kernel without tracing into
    its launcher — it sees an op with a known output shape (``register_fake``) instead."""
    if not hasattr(torch.ops.course, "w4a16_matmul"):
        # ``locks`` is scratch the kernel leaves at zero: no mutation anyone can see, so none is declared
        # (a declared one would make torch.compile copy the counters around every call)
        @torch.library.custom_op("course::w4a16_matmul", mutates_args=())
        def w4a16(x: torch.Tensor, words: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,
                  locks: torch.Tensor, group_size: int, config: str) -> torch.Tensor:
            p = W4Weight(words, scale, zero, group_size, (words.shape[0], words.shape[1] * 8))
            return w4a16_matmul(x, p, json.loads(config), locks=locks)

        @w4a16.register_fake
        def _(x, words, scale, zero, locks, group_size, config):
            return x.new_empty(x.shape[0], words.shape[0])
    return torch.ops.course.w4a16_matmul


class W4Linear(torch.nn.Module):
    """A ``Linear`` whose weight lives packed (0.5 byte per weight + 4 bytes per group, registered as
    buffers so ``state_dict`` and byte counts see them) and runs through :func:`w4a16_matmul`, with one
    configuration per row tile (``configs``: 1 for one row, else the :func:`block_rows` value → config;
    :func:`auto_config` where none is given).

    Above ``dense_above`` rows (prefill, large batches) the int4 kernels lose to a 16-bit GEMM (the
    crossover measured in notebook 08), so the layer dequantizes its weight for that call and uses
    cuBLAS — what engines do too (vLLM's AWQ path dequantizes from 256 tokens); the cost is one
    transient dense copy of this layer's weight.

    ``family={"PAD": True}`` (round 13; the prepared path is one row's default): where the prepared step that
    divides ``in_features`` holds few codes, the weight is packed with zero columns up to :func:`~helpers.w4_kernel.pack_width`'s ``K'``
    (at most 5 % more bytes); one row on the prepared kernel reads them as zeros (``prepare_x`` writes zeros
    past ``K``), every other call gets ``x`` padded with zero columns first."""

    def __init__(self, linear: torch.nn.Linear, group_size: int = 128, configs: dict | None = None,
                 dense_above: int = 16, family: dict | None = None):
        super().__init__()
        weight = linear.weight.data
        self.in_features = weight.shape[1]
        pad = (family or {}).get("PAD")
        if pad:
            one_row_prepared(family)   # refuses PAD where the family turns the prepared path off
        k_padded = pack_width(self.in_features, group_size) if pad else self.in_features
        if k_padded > self.in_features:
            weight = torch.nn.functional.pad(weight, (0, k_padded - self.in_features))
        p = pack_w4(weight, group_size)
        self.register_buffer("words", p.words)
        self.register_buffer("scale", p.scale)
        self.register_buffer("zero", p.zero)
        # the serial split-K counters: one per output tile (≥ 16 columns wide, ≤ 4 row tiles up to 64 rows)
        self.register_buffer("locks", torch.zeros(-(-p.shape[0] // 16) * 4, dtype=torch.int32, device=p.words.device),
                             persistent=False)
        self.group_size, self.shape = group_size, p.shape
        self.bias = linear.bias
        self.family, self.given_configs = family, dict(configs or {})
        self.dense_above = dense_above
        self._op = w4a16_op()   # registered now: torch.compile cannot register an op while it traces
        self._choose_configs()

    def _choose_configs(self):
        """Row tile → config for the device the weight is on now (its multiprocessors set the split),
        every tile chosen here, once (torch.compile then traces no choosing); given configs win."""
        self.configs = {tile: auto_config(self.p, tile, self.family) for tile in (1, 16, 32, 64)} | self.given_configs
        self._op_configs = {tile: json.dumps(cfg) for tile, cfg in self.configs.items()} | {
            "fp32": json.dumps(DEFAULT_CONFIG)}   # the op takes its config as a string
        self.configs_device = self.words.device

    def _apply(self, fn, recurse=True):
        # ``.to``/``.cuda``/``.half`` land here. The fp16 scales and zeros are part of the packed format: a
        # cast of the model (``model.to(torch.bfloat16)``) moves them but keeps them fp16, exact (a round
        # trip through bf16 would lose 3 bits of each). A layer swapped on the CPU and moved to a GPU
        # re-chooses its configs for that GPU (on the CPU they are chosen for the interpreter and 8
        # stand-in multiprocessors).
        scale, zero = self.scale, self.zero
        module = super()._apply(fn, recurse)
        if self.scale.dtype != torch.float16:
            self.scale = scale.to(self.scale.device)
        if self.zero.dtype != torch.float16:
            self.zero = zero.to(self.zero.device)
        if self.words.device != self.configs_device:
            self._choose_configs()
        return module

    @property
    def p(self) -> W4Weight:
        return W4Weight(self.words, self.scale, self.zero, self.group_size, self.shape)

    def forward(self, x):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        m = x2.shape[0]
        if shape[-1] != self.in_features:
            raise ValueError(f"x has {shape[-1]} features, this layer takes {self.in_features}")
        dense = m > self.dense_above or (x2.dtype == torch.float32 and m > 1)   # tensor cores take 16-bit rows
        # one fp32 row: the CUDA-core GEMV; one 16-bit row: the GEMV; more: a tensor-core row tile
        tile = None if dense else "fp32" if x2.dtype == torch.float32 else 1 if m == 1 else block_rows(m)
        if self.shape[1] > self.in_features and not (tile == 1 and self.configs[1]["KERNEL"] == "prepared"):
            x2 = torch.nn.functional.pad(x2, (0, self.shape[1] - self.in_features))   # a weight padded at pack time
        if dense:
            y = x2 @ dequantize_w4(self.p, x2.dtype).T
        else:
            if torch.compiler.is_compiling():   # torch.compile sees one opaque op, not the launcher's Python
                y = self._op(x2, self.words, self.scale, self.zero, self.locks, self.group_size,
                             self._op_configs[tile])
            else:
                y = w4a16_matmul(x2, self.p, DEFAULT_CONFIG if tile == "fp32" else self.configs[tile],
                                 locks=self.locks)
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
