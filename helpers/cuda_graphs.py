"""A speed layer: replay a function of fixed-shape tensors as a CUDA graph.

A loop made of many tiny kernels (GPTQ's column loop: ~10 launches per column) is bound by kernel
launches on a GPU, not by arithmetic. A CUDA graph (PyTorch docs, "CUDA Graphs") records those
launches once on static buffers; each later call copies its inputs into the buffers and replays the
whole recording with one launch. Same kernels, same order, so the results are bit-identical to the
eager call. The function replayed must be one of fixed-shape tensors with no host synchronisation
(no ``.item()``, no data-dependent shapes) — e.g. :func:`helpers.gptq.static_block`.

:class:`GraphedCalls` owns its graphs: they live as long as the object, and :meth:`GraphedCalls.close`
(or leaving its ``with`` block) frees them and their buffers deterministically — no module-level cache.
"""
from __future__ import annotations

import torch


class GraphedCalls:
    """``fn(*tensors) -> tuple of tensors``, captured once per input signature (shapes, dtypes,
    devices) and replayed.

    ``fn`` may update some inputs in place (their positions in ``mutated``); those updates are copied
    back to the caller's tensors (views included) after each replay. Outputs are returned as fresh
    copies. ``share_pool``: every graph's temporaries in one private memory pool (see ``__init__``).
    """

    def __init__(self, fn, mutated: tuple[int, ...] = (), share_pool: bool = True):
        self.fn, self.mutated = fn, tuple(mutated)
        self._graphs: dict = {}
        # every graph's temporaries in one private memory pool: safe here because replays run one at a
        # time on one stream and the only memory that outlives a replay (the static inputs and outputs)
        # is never freed while the object lives; without it each input signature keeps its own pool
        self.share_pool, self._pool = share_pool, None

    def __call__(self, *tensors: torch.Tensor):
        if not all(isinstance(t, torch.Tensor) and t.is_cuda for t in tensors):
            raise ValueError("GraphedCalls replays CUDA work only: every argument must be a CUDA tensor")
        key = tuple((tuple(t.shape), t.dtype, t.device) for t in tensors)
        if key not in self._graphs:
            self._graphs[key] = self._capture(tensors)
        graph, ins, outs = self._graphs[key]
        for buf, t in zip(ins, tensors):
            buf.copy_(t)
        graph.replay()
        for k in self.mutated:
            tensors[k].copy_(ins[k])
        return tuple(o.clone() for o in outs)

    def _capture(self, tensors):
        ins = [t.clone() for t in tensors]
        device = ins[0].device
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # warm-up outside the graph (allocator pools, lazy inits)
            self.fn(*[t.clone() for t in ins])
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool if self.share_pool else None):
            outs = self.fn(*ins)
        if self.share_pool and self._pool is None:
            self._pool = graph.pool()
        return graph, ins, tuple(outs)

    @property
    def n_graphs(self) -> int:
        """How many input signatures have a captured graph."""
        return len(self._graphs)

    def close(self) -> None:
        """Free every captured graph and its static buffers."""
        self._graphs.clear()
        self._pool = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
