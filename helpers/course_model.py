"""The course model and its text, profile-sized: what notebooks 03–06 share (:func:`setup`).

Where no weights or no text can be had (a GPU machine with neither internet nor the offline
package), it falls back to the architecture with random weights and random token ids, and says so
loudly: the algorithms, memory and timings are then real, the quality numbers are not.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from . import data, models
from .config import profile, quality_settings
from .device import get_device
from .qspec import positive_int


@dataclass
class Bench:
    """The model, its tokenizer, the evaluation tokens and the profile's settings."""
    model: torch.nn.Module
    tokenizer: object | None
    real_weights: bool
    real_text: bool
    eval_ids: torch.Tensor
    name: str
    settings: dict = field(default_factory=dict)
    cut_from: int | None = None   # decoder layers the model had before the CI profile cut it (None: whole)

    def calib(self, n_samples: int | None = None, seq_len: int | None = None, seed: int = 0) -> torch.Tensor:
        """Calibration windows [n, seq_len] from the calibration split (disjoint from eval)."""
        n = positive_int(n_samples if n_samples is not None else self.settings["calib_samples"], "n_samples")
        L = positive_int(seq_len if seq_len is not None else self.settings["seq_len"], "seq_len")
        if self.real_text:
            return data.calibration_batch(self.tokenizer, n, L, seed)
        return data.random_ids(self.model.config.vocab_size, (n, L), seed=1000 + seed)

    @property
    def quality_meaningful(self) -> bool:
        """True only with real weights, real text and the whole model: otherwise perplexities measure nothing."""
        return self.real_weights and self.real_text and self.cut_from is None

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype


def setup(name: str | None = None, device=None, dtype=None) -> Bench:
    """Load the course model (hub online, offline package otherwise) and the evaluation tokens.
    ``dtype`` defaults to fp32 on CPU and the model default (:func:`helpers.models.default_dtype`)
    on a GPU."""
    dev = get_device(device) if device is not None else get_device()
    dtype = models.parse_dtype(dtype) if dtype is not None else (
        torch.float32 if dev.type == "cpu" else models.default_dtype(dev))
    model, tok, real = models.load_for_memory(name, device=dev, dtype=dtype)
    try:
        ids = data.tokens(tok, "eval") if tok is not None else None
    except (FileNotFoundError, RuntimeError) as e:
        print(f"[text] {str(e).splitlines()[0]}")
        ids = None
    real_text = ids is not None
    if not real_text:
        print("[text] no text source → random token ids: perplexities below measure nothing.")
        ids = data.random_ids(model.config.vocab_size, (200_000,), seed=0)
    label = getattr(model.config, "_name_or_path", "") or "random-weights"
    label = label.rstrip("/").split("/")[-1] or "model"
    settings = quality_settings(torch.cuda.is_available())
    keep = settings.get("layers")
    total = len(models.decoder_layers(model))
    if keep and keep < total:
        models.keep_first_layers(model, keep)
        label += f"-first{keep}"
        print(f"[{profile()} profile] smoke test: the model keeps its first {keep} of {total} decoder layers "
              "(same code, less work); its quality numbers mean nothing — run the full profile for them.")
    return Bench(model, tok, real, real_text, ids, label, settings, cut_from=total if keep and keep < total else None)
