"""Sequential, block-by-block calibration: the plumbing GPTQ and AWQ share.

Both algorithms quantize one decoder block at a time (Frantar et al. 2022, §4 "Step 3"; Lin et al.
2024, §3): the inputs of block k are the outputs of blocks 0…k−1 *after* they were quantized, so each
block corrects for the error already made before it. Only the block being processed needs to be on
the device; its inputs for the whole calibration set wait between blocks (:func:`store_device`).
How the pass runs is one small spec, :class:`CalibSpec`; the calibration set itself is the token
tensor ``calib`` [n_samples, seq_len] the quantizers receive (its shape is its size).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from .models import check_token_ids, decoder_layers
from .qspec import positive_int

NEXT_INPUTS = ("quantized", "full_precision")


def _check_offload(offload) -> None:
    if offload is not True and offload is not False and offload != "auto":
        raise ValueError(f"offload must be True, False or 'auto', got {offload!r}")


@dataclass(frozen=True)
class CalibSpec:
    """How the block-by-block calibration pass runs (:func:`sequential`), validated once:

    * ``batch_size`` — calibration windows per forward pass;
    * ``next_inputs`` — what block k+1 is calibrated on: ``"quantized"`` (GPTQ's §4 and the course's
      default: the outputs of block k *after* it was quantized, so each block sees, and corrects for,
      the error made before it) or ``"full_precision"`` (llm-awq's ``run_awq``: the outputs of block
      k computed before it is changed);
    * ``offload`` — where the block inputs wait between blocks (:func:`store_device`).
    """
    batch_size: int = 8
    next_inputs: str = "quantized"
    offload: bool | str = "auto"

    def __post_init__(self):
        object.__setattr__(self, "batch_size", positive_int(self.batch_size, "batch_size"))
        if self.next_inputs not in NEXT_INPUTS:
            raise ValueError(f"next_inputs must be one of {NEXT_INPUTS}, got {self.next_inputs!r}")
        _check_offload(self.offload)


def options_and_calibration(options_type, settings: dict) -> tuple:
    """One dict of keyword settings (what a stored variant records) split by field name into an
    algorithm's options dataclass ``options_type`` and a :class:`CalibSpec`; a name that is neither's
    field is an error listing both."""
    own = {f.name for f in dataclasses.fields(options_type)}
    calib = {f.name for f in dataclasses.fields(CalibSpec)}
    unknown = sorted(set(settings) - own - calib)
    if unknown:
        raise TypeError(f"unknown settings {unknown}: {options_type.__name__} takes {sorted(own)}, "
                        f"CalibSpec takes {sorted(calib)}")
    return (options_type(**{k: v for k, v in settings.items() if k in own}),
            CalibSpec(**{k: v for k, v in settings.items() if k in calib}))


def check_calib(model, calib) -> None:
    """Calibration ids must be an integer tensor [n_samples, seq_len] of valid token ids: checked at
    the door, so a bad set fails here with its shape and range, not deep in an embedding lookup."""
    if not isinstance(calib, torch.Tensor):
        raise TypeError(f"calib must be a torch.Tensor of token ids [n_samples, seq_len], got {type(calib).__name__}")
    if calib.dim() != 2 or calib.numel() == 0:
        raise ValueError(f"calib must be token ids [n_samples, seq_len] with n_samples, seq_len ≥ 1, "
                         f"got shape {tuple(calib.shape)}")
    check_token_ids(model, calib, "calib")


class _Stop(Exception):
    """Raised by the capture hook to stop the forward once block 0's inputs are seen."""


def store_device(model, offload: bool | str = "auto") -> torch.device:
    """Where the calibration set's block inputs wait between blocks: the CPU when ``offload`` (``"auto"``:
    when the model is on a GPU), else the model's device."""
    _check_offload(offload)
    dev = next(model.parameters()).device
    return torch.device("cpu") if (offload is True or (offload == "auto" and dev.type != "cpu")) else dev


def to_store(x: torch.Tensor, store: torch.device | str) -> torch.Tensor:
    """``x`` where the block inputs wait (``store``). From a GPU to the CPU the copy lands in pinned
    (page-locked) memory, which the GPU reads and writes directly — several times faster both ways
    than pageable memory, which the driver stages through a pinned buffer (CUDA C++ Best Practices
    Guide, "Pinned Memory")."""
    store = torch.device(store)
    if x.is_cuda and store.type == "cpu":
        return torch.empty(x.shape, dtype=x.dtype, pin_memory=True).copy_(x)
    return x.to(store)


@torch.no_grad()
def capture_block_inputs(model, calib: torch.Tensor, batch_size: int = 8,
                         store: torch.device | str | None = None) -> tuple[list, list]:
    """Run the embeddings on ``calib`` [n, seq_len] and capture what block 0 receives.

    Returns ``(hidden, kwargs)``: one hidden-state tensor [b, seq_len, hidden] per calibration batch
    (kept on ``store``, default where it was computed), and the keyword arguments each batch's block
    call received (attention mask, rotary ``position_embeddings``, position ids), reused unchanged
    for every later block.
    """
    check_calib(model, calib)
    layers = decoder_layers(model)
    hidden, kwargs = [], []

    def hook(_mod, args, kw):
        x = args[0] if args else kw.pop("hidden_states")
        hidden.append(x if store is None else to_store(x, store))
        kwargs.append({k: v for k, v in kw.items() if k not in ("past_key_values", "use_cache")})
        raise _Stop

    h = layers[0].register_forward_pre_hook(hook, with_kwargs=True)
    try:
        forward_batches(model, calib, batch_size)
    finally:
        h.remove()
    return hidden, kwargs


@torch.no_grad()
def forward_batches(model, ids: torch.Tensor, batch_size: int = 8) -> None:
    """Run ``model`` over ``ids`` [n, seq_len] in batches, without a KV cache, for the hooks that watch
    it (a hook may end a batch early by raising ``_Stop``)."""
    batch_size = positive_int(batch_size, "batch_size")
    dev = next(model.parameters()).device
    for i in range(0, len(ids), batch_size):
        try:
            model(ids[i:i + batch_size].to(dev), use_cache=False)
        except _Stop:
            pass


def block_device(block) -> torch.device:
    """The device a block's weights are on (where its inputs must go)."""
    return next(block.parameters()).device


@torch.no_grad()
def run_block(block, hidden: list, kwargs: list) -> list:
    """The block's outputs for every calibration batch (transformers ≥ 5 returns a tensor), each kept
    where its input was kept (inputs waiting on the CPU travel to the block one batch at a time)."""
    outs, dev = [], block_device(block)
    for x, kw in zip(hidden, kwargs):
        y = block(x.to(dev), use_cache=False, **kw)
        outs.append(to_store(y[0] if isinstance(y, tuple) else y, x.device))
    return outs


def sequential(model, calib: torch.Tensor, process_block, spec: CalibSpec | None = None, desc: str = "blocks",
               progress: bool = True) -> list:
    """Calibrate block by block: ``process_block(index, block, hidden, kwargs)`` quantizes the block
    in place (it may run the block on ``hidden`` as often as it needs; each batch moves to the block
    with ``x.to(block_device(b))``) and returns a record. ``spec`` (default :class:`CalibSpec`) says
    how: batch size, what block k+1 is calibrated on, where the inputs wait. Returns the records."""
    spec = CalibSpec() if spec is None else spec
    if not isinstance(spec, CalibSpec):
        raise TypeError(f"calibration must be a CalibSpec, got {type(spec).__name__}")
    hidden, kwargs = capture_block_inputs(model, calib, spec.batch_size, store=store_device(model, spec.offload))
    records = []
    for i, block in enumerate(tqdm(decoder_layers(model), desc=desc, disable=not progress)):
        before = run_block(block, hidden, kwargs) if spec.next_inputs == "full_precision" else None
        records.append(process_block(i, block, hidden, kwargs))
        hidden = before if before is not None else run_block(block, hidden, kwargs)
    return records


def linears(block) -> dict[str, torch.nn.Linear]:
    """The ``nn.Linear`` modules of one block, by their name inside it."""
    return {n: m for n, m in block.named_modules() if isinstance(m, torch.nn.Linear)}


def tokens_of(calib: torch.Tensor) -> int:
    """Calibration size in tokens (what the results tables report)."""
    return int(calib.numel())


@torch.no_grad()
def capture_inputs(model, module: torch.nn.Module, ids: torch.Tensor, batch_size: int = 8) -> torch.Tensor:
    """The inputs ``module`` receives when ``model`` reads ``ids`` [n, seq_len], as [tokens, features]."""
    seen = []
    h = module.register_forward_hook(lambda _m, a, _o: seen.append(a[0].reshape(-1, a[0].shape[-1]).detach()))
    try:
        forward_batches(model, ids, batch_size)
    finally:
        h.remove()
    return torch.cat(seen)


@torch.no_grad()
def watch_linears(block, hidden: list, kwargs: list, on_input, names=None) -> None:
    """Run ``block`` on every calibration batch, calling ``on_input(linear name, input)`` each time one
    of its linears (those in ``names``, default all) receives an input: statistics can be gathered
    batch by batch without keeping the inputs."""
    lins = linears(block)
    hooks = [lins[n].register_forward_hook(lambda _m, a, _o, n=n: on_input(n, a[0]))
             for n in (names if names is not None else lins)]
    try:
        dev = block_device(block)
        for x, kw in zip(hidden, kwargs):
            block(x.to(dev), use_cache=False, **kw)
    finally:
        for h in hooks:
            h.remove()


@torch.no_grad()
def linear_inputs(block, hidden: list, kwargs: list) -> dict[str, list]:
    """Run ``block`` on every calibration batch and return what each of its linears received:
    ``{linear name: [input per batch]}``."""
    feats: dict[str, list] = {}
    watch_linears(block, hidden, kwargs, lambda n, x: feats.setdefault(n, []).append(x))
    return feats


def cast_floats(v, dtype: torch.dtype):
    """Floating tensors to ``dtype``, also inside dicts and tuples (a block's kwargs: rotary
    ``(cos, sin)``, float attention masks); everything else as is."""
    if isinstance(v, torch.Tensor):
        return v.to(dtype) if v.is_floating_point() else v
    if isinstance(v, tuple):
        return tuple(cast_floats(t, dtype) for t in v)
    if isinstance(v, dict):
        return {k: cast_floats(t, dtype) for k, t in v.items()}
    return v


class InputStats:
    """Statistics of one linear's inputs over the whole calibration set, gathered one batch at a time
    (:meth:`add`) so the inputs themselves need not all be held — what AWQ reads
    (:mod:`helpers.awq`): the per-channel mean ``|x|`` (the ``s_x`` of its eq. 5), the Gram matrix
    ``XᵀX`` (``gram``), the tokens its clip search reads (every ``N // n_sample``-th token of the
    concatenated inputs, as ``awq.search_clip`` picks them), and the inputs themselves (``keep``)."""

    def __init__(self, total_tokens: int, keep: bool = False, gram: bool = False, n_sample: int = 512):
        self.total, self.keep, self.n_sample = positive_int(total_tokens, "total_tokens"), keep, n_sample
        self.stride = max(1, self.total // n_sample)
        self.xs, self.sample, self.seen = [], [], 0
        self.abs_sum = self.G = None
        self.want_gram = gram

    @torch.no_grad()
    def add(self, x: torch.Tensor) -> None:
        """Add one batch of inputs ``x`` [..., features]."""
        flat = x.reshape(-1, x.shape[-1])
        f = flat.float()
        self.abs_sum = f.abs().sum(0) if self.abs_sum is None else self.abs_sum + f.abs().sum(0)
        if self.want_gram:
            self.G = f.t() @ f if self.G is None else self.G.addmm_(f.t(), f)
        del f
        first = (-self.seen) % self.stride                       # the first sampled token in this batch
        idx = torch.arange(first, len(flat), self.stride, device=flat.device)
        idx = idx[idx + self.seen < self.stride * self.n_sample]
        self.sample.append(flat[idx])
        if self.keep:
            self.xs.append(x)
        self.seen += len(flat)

    def release(self) -> None:
        """Drop the kept inputs (once the α search that needed them is done)."""
        self.xs = []

    @classmethod
    def of(cls, xs: list, gram: bool = False) -> InputStats:
        """The statistics of inputs already captured (``xs``: one tensor per batch), kept."""
        st = cls(sum(x.numel() // x.shape[-1] for x in xs), keep=True, gram=gram)
        for x in xs:
            st.add(x)
        return st

    @property
    def x_mean(self) -> torch.Tensor:
        """``s_x``: mean ``|x_j|`` per input channel."""
        return self.abs_sum / self.seen

    @property
    def tokens(self) -> torch.Tensor:
        """The sampled tokens [≤ n_sample, features] for :func:`search_clip`."""
        return torch.cat(self.sample)
