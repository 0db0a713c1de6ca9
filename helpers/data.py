"""The course text: WikiText-2 raw (test split), split once into evaluation and calibration parts.

Sources, in order:
1. ``COURSE_WIKITEXT`` — a path to ``wiki.test.raw`` (offline machines and CI point it at
   ``../shared/data/wikitext-2-raw/wiki.test.raw``). The file has one paragraph per line and no
   empty rows (CC BY-SA 3.0; Merity et al. 2016).
2. Online: ``datasets.load_dataset("wikitext", "wikitext-2-raw-v1", split="test")``, empty rows
   dropped so both sources give the same paragraphs.

The split (documented, deterministic, disjoint): paragraphs are kept in file order; the first
``EVAL_FRACTION`` of them (by count) is the **evaluation** text, the rest the **calibration** text.
Both come from the test split because that is the only split available offline; the eval numbers
therefore cover 80 % of the split and are comparable across this course, not to papers' tables.
Tokenized streams are cached on disk (``torch.save``; read back with ``weights_only=True``).
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import torch

from .config import cache_dir
from .models import hub_available
from .qspec import positive_int

ENV_VAR = "COURSE_WIKITEXT"
EVAL_FRACTION = 0.8
SPLITS = ("eval", "calib", "all")
FIRST_ORDINARY_ID = 3   # ids 0-2 are special tokens in the course's tokenizers (<|endoftext|>, <|im_start|>, <|im_end|>)


def random_ids(vocab_size: int, shape: tuple[int, ...], seed: int = 0, device=None) -> torch.Tensor:
    """Token ids drawn uniformly from ``[3, vocab_size − 1)``: a prompt of the right shape for memory and
    speed, never for quality. The first ids (special tokens) and the last are left out; the draw is
    from a CPU generator seeded with ``seed`` (the same ids on every device), then moved to ``device``."""
    vocab_size = positive_int(vocab_size, "vocab_size")
    if vocab_size <= FIRST_ORDINARY_ID + 1:
        raise ValueError(f"vocab_size={vocab_size} leaves no ordinary token id: it must exceed {FIRST_ORDINARY_ID + 1}")
    shape = tuple(positive_int(n, "shape") for n in shape)
    g = torch.Generator(device="cpu").manual_seed(int(seed))
    ids = torch.randint(FIRST_ORDINARY_ID, vocab_size - 1, shape, generator=g)
    return ids if device is None else ids.to(device)


def _rows_from_file(path: Path) -> list[str]:
    if not path.is_file():
        raise FileNotFoundError(f"{ENV_VAR}={path} does not name a file. Point it at wiki.test.raw, e.g. "
                                f"export {ENV_VAR}=../shared/data/wikitext-2-raw/wiki.test.raw")
    with open(path, encoding="utf-8") as f:  # text mode: CRLF → LF
        rows = [r.strip("\n") for r in f.read().split("\n") if r.strip()]
    if len(rows) < 2:
        raise ValueError(f"{ENV_VAR}={path} holds {len(rows)} non-empty paragraph(s): it must be WikiText-2 "
                         "raw's wiki.test.raw (about 4,300 paragraphs). Is the file empty or truncated?")
    return rows


def _rows_from_hub() -> list[str]:
    if not hub_available():
        raise RuntimeError(
            f"No text source: {ENV_VAR} is not set and the dataset hub cannot be reached. "
            f"Set {ENV_VAR} to a copy of WikiText-2 raw's wiki.test.raw "
            f"(in this repo's CI: ../shared/data/wikitext-2-raw/wiki.test.raw).")
    from datasets import load_dataset  # optional (the course extra), only for the online text

    ds = load_dataset("wikitext", "wikitext-2-raw-v1", split="test")
    return [r.strip("\n") for r in ds["text"] if r.strip()]


def text_rows() -> list[str]:
    """All paragraphs of the WikiText-2 raw test split, from the file or the hub."""
    path = os.environ.get(ENV_VAR)
    return _rows_from_file(Path(path)) if path else _rows_from_hub()


def load_text(split: str = "eval") -> str:
    """The text of one split (``"eval"``, ``"calib"`` or ``"all"``), paragraphs joined by newlines."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; use one of {SPLITS}")
    rows = text_rows()
    cut = int(len(rows) * EVAL_FRACTION)
    part = {"eval": rows[:cut], "calib": rows[cut:], "all": rows}[split]
    return "\n".join(part)


def tokens(tokenizer, split: str = "eval") -> torch.Tensor:
    """The split as one 1-D token stream (no special tokens), cached on disk per tokenizer + text."""
    text = load_text(split)
    vocab_key = hashlib.sha256(repr(sorted(tokenizer.get_vocab().items())[:2000]).encode()).hexdigest()[:10]
    text_key = hashlib.sha256(text.encode()).hexdigest()[:10]
    path = cache_dir("tokens") / f"{split}-{text_key}-{vocab_key}-{len(tokenizer)}.pt"
    if path.exists():
        try:
            ids = torch.load(path, weights_only=True)
            if isinstance(ids, torch.Tensor) and ids.dim() == 1 and ids.dtype == torch.long and len(ids) > 1:
                return ids
            problem = f"it holds {type(ids).__name__} {getattr(ids, 'shape', '')}, not a 1-D token stream"
        except Exception as e:  # truncated or foreign file
            problem = f"it cannot be read ({type(e).__name__})"
        print(f"[data] token cache {path} is unusable: {problem}; re-tokenizing.")
        path.unlink()
    ids = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")   # one per process: two notebooks may tokenize at once
    torch.save(ids, tmp)
    tmp.replace(path)  # atomic: an interrupted write never leaves a half file under the real name
    return ids


def calibration_batch(tokenizer, n_samples: int, seq_len: int, seed: int = 0) -> torch.Tensor:
    """``n_samples`` windows of ``seq_len`` tokens from the calibration split, ``[n_samples, seq_len]``.

    Windows start at seeded random positions (as GPTQ's ``get_wikitext2`` does); the calibration
    split never overlaps the evaluation split.
    """
    n_samples, seq_len = positive_int(n_samples, "n_samples"), positive_int(seq_len, "seq_len")
    ids = tokens(tokenizer, "calib")
    if len(ids) <= seq_len:
        raise ValueError(f"calibration split has {len(ids)} tokens, fewer than seq_len={seq_len}")
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(ids) - seq_len, (n_samples,), generator=g)
    return torch.stack([ids[s:s + seq_len] for s in starts.tolist()])
