"""Stale-prose check: a number in a notebook's markdown must be sourced, or printed by the notebook.

Two checks, on every ``notebooks/NN_*.py`` (the markdown cells of its jupytext pair):

1. **Static** (always). A decimal or approximate number with a unit of measurement (GB/GiB/MiB/KiB,
   %, ×, tok/s, ms, µs, s, GB/s, TB/s) is a claim. It passes when its sentence names where it comes
   from (a paper, table, issue, docs page, README, config file, the seed document) or says it is
   computed/printed by the cell ("above", "below", "the table", "printed", "measured"), or when it is
   a definition listed in ALLOWED (e.g. "2 bytes"). Everything else is a number typed by hand that no
   cell will keep true — the kind of prose that went stale in notebook 01 ("≈11 GB of activations"
   while the table printed 15.6 GB).

2. **Against the outputs** (with ``--executed DIR``, a folder of executed ``NN_*.ipynb`` such as the
   ``COURSE_EXECUTED_DIR`` a notebook test run fills). Saying "above" is not enough: *every* number
   with a unit — whole numbers too, and every percentage or ratio (``87 %``, ``3.6×``, each end of a
   range ``57–87 %``) — must either be **quoted with a source** (its sentence names one: the same
   words as above, less the "computed here" ones; or another notebook, "notebook 01") or **appear in
   an output** of that executed notebook. A printed value matches the prose when it rounds to the
   prose's digits (``3.62`` prints, ``3.6×`` passes), for a percentage also as a fraction
   (``0.87`` → ``87 %``), and within 5 % for an approximation (``≈ 22 GB``); the output that prints it
   must also name the unit's kind (``GiB`` in ``15.62 GiB`` or in a column ``peak_GiB``; a ratio's ``×``
   needs nothing, ratios print as bare numbers) — a lone ``1`` printed somewhere does not make "1 MiB"
   true. A whole number that the
   notebook's code sets itself (``64 MiB`` blocks: ``64`` in a code cell) is an input, not a claim.
   Each offender is named with its notebook and cell index (the ``.ipynb``'s). Notebooks missing
   from ``DIR`` are listed and skipped.

    python scripts/check_prose_numbers.py                              # static check; exit 1 on offenders
    python scripts/check_prose_numbers.py --executed build/executed    # and against the executed outputs
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_UNITS = r"GB/s|TB/s|GiB|GB|MiB|MB|KiB|KB|tok/s|tokens/s|ms|µs|s\b"    # bytes, rates and times
UNIT = r"(?:" + _UNITS + r"|%|×|x\b)"
# measured-looking: a decimal (15.6 GB, 1.86×) or an approximation (≈ 22 GB); whole numbers with a unit
# are nearly always inputs the cell sets itself (64 MiB blocks, a 24 GB card) and are not flagged
NUMBER = re.compile(r"(?<![\w.])(?:≈\s*\d[\d,]*(?:\.\d+)?|\d[\d,]*\.\d+)\s?" + UNIT)
# check 2's sources: names of places, whole words
SOURCE = re.compile(r"arXiv|\bTable \d|§|#\d|\bdocs?\b|documentation|README|\bpapers?\b|config\.json|"
                    r"tokenizer_config|source document|\bseed\b|\breport(?:s|ed)?\b|reference run|results/|"
                    r"\.json\b|\blogs?\b|\bissues?\b|\bthread\b|Kwon|Frantar|Lin et al|gpt-fast|datasheet|"
                    r"data sheet|\bspec(?:s|ification)?\b|\bnotebooks? \d\d", re.I)
# check 1 also takes the words' other forms inside longer words, and the "computed here" words
SOURCED = re.compile(SOURCE.pattern + r"|Table|docs|paper|seed|report|log|issue|spec|above|below|the table|"
                     r"printed|measured|prints|column|plot", re.I)
ALLOWED = {"2 bytes", "1 byte", "0.5 byte"}

# check 2: any number (or range of numbers) with a unit; "×" and "x" only right after the number
_NUM = r"\d[\d,]*(?:\.\d+)?"
ANY_NUMBER = re.compile(r"(?<![\w.,/^])(?P<approx>(?:≈|~|about |around )\s*)?(?P<a>" + _NUM + r")"
                        r"(?:\s?(?:–|-|to)\s?(?P<b>" + _NUM + r"))?(?P<unit>\s?(?:" + _UNITS + r")|\s?%|×|x\b)")
OUTPUT_NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?")


def markdown_cells(py: Path):
    """``(cell index, markdown text)`` of each markdown cell of a jupytext percent file (the index is
    the cell's in the paired ``.ipynb``: one ``# %%`` marker per cell)."""
    cell, in_md, index = [], False, -1
    for line in py.read_text().splitlines():
        if line.startswith("# %%"):
            if in_md and cell:
                yield index, "\n".join(cell)
            cell, in_md, index = [], "[markdown]" in line, index + 1
        elif in_md:
            cell.append(line[2:] if line.startswith("# ") else line.lstrip("#"))
    if in_md and cell:
        yield index, "\n".join(cell)


def sentences(cell: str) -> list[str]:
    """The cell's prose, code spans, maths, links and tables blanked, split into sentences."""
    text = re.sub(r"`[^`]*`|\$[^$]*\$|\([^)]*https?://[^)]*\)|\|.*\|", " ", cell)   # code, maths, links, tables
    return re.split(r"(?<=[.:;!?])\s+(?=[A-Z*(])|\n\n", text)


def offenders(py: Path) -> list[str]:
    """Check 1 (static) on one notebook pair."""
    out = []
    for _, cell in markdown_cells(py):
        if re.search(r"printed by the cell", cell):      # the cell declares its numbers come from the output
            continue
        for sentence in sentences(cell):
            for m in NUMBER.finditer(sentence):
                if m.group(0).strip() in ALLOWED or SOURCED.search(sentence):
                    continue
                out.append(f"{py.name}: {m.group(0)!r} in: {' '.join(sentence.split())[:140]}")
    return out


def _value(token: str) -> tuple[float, int]:
    token = token.replace(",", "")
    return float(token), len(token.split(".")[1]) if "." in token else 0


# a printed value counts for a prose number only where its output also names the unit's kind (the
# "GiB" of "15.62 GiB" or of a column "peak_GiB"); ratios print as bare numbers, so × needs no unit
UNIT_KIND = [(re.compile(r"^(?:GB/s|TB/s)$"), re.compile(r"[GT]B/s|[GT]Bps|bandwidth", re.I)),
             (re.compile(r"^(?:tok/s|tokens/s)$"), re.compile(r"tok(?:en)?s?/s|tok(?:en)?s?_(?:per_)?s\b", re.I)),
             (re.compile(r"^[KMGT]i?B$"), re.compile(r"[KMGT]i?B|bytes", re.I)),
             (re.compile(r"^(?:ms|µs|s)$"), re.compile(r"(?<![a-z])(?:ms|µs|us|s|sec|seconds?)(?![a-z])|_(?:ms|µs|us|s)"
                                                   r"\b|time", re.I)),
             (re.compile(r"^%$"), re.compile(r"%"))]


def output_numbers(nb: dict) -> tuple[list[tuple[str, list[float]]], set[str]]:
    """Each output of the executed notebook (streams, text results, markdown/HTML shown) as
    ``(its text, the numbers in it)``, and the whole-number tokens of its code cells (the inputs the
    notebook sets itself)."""
    blocks, code = [], set()
    for cell in nb.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        src = "".join(cell.get("source", ""))
        code |= set(re.findall(r"(?<![\w.])\d+(?![\w.])", src))
        for o in cell.get("outputs", []):
            texts = [o.get("text", "")] + [o.get("data", {}).get(kind, "") for kind in
                                           ("text/plain", "text/markdown", "text/html", "text/latex")]
            text = re.sub(r"<[^>]+>", " ", " ".join("".join(t) if isinstance(t, list) else t for t in texts))
            numbers = []
            for tok in OUTPUT_NUMBER.findall(text):
                try:
                    numbers.append(float(tok.replace(",", "").rstrip(".")))
                except ValueError:
                    pass
            if numbers:
                blocks.append((text, numbers))
    return blocks, code


def _printed(value: float, digits: int, unit: str, approx: bool, blocks) -> bool:
    """Whether some output prints ``value`` (to the prose's ``digits``; within 5 % if ``approx``; a
    percentage also as a fraction) and names the kind of ``unit``."""
    tol = 0.5 * 10 ** -digits + 1e-9
    kind = next((k for u, k in UNIT_KIND if u.match(unit)), None)
    for text, numbers in blocks:
        named = kind is None or kind.search(text)
        for x in numbers:
            for cand, ok in ((x, named), (x * 100, unit == "%")):
                if ok and (abs(cand - value) <= tol or (approx and abs(cand - value) <= 0.05 * abs(value))):
                    return True
    return False


def unprinted(py: Path, executed: dict) -> list[str]:
    """Check 2 on one notebook pair: the numbers with a unit in its markdown that are neither quoted
    with a source nor printed by the executed notebook ``executed`` (an ``.ipynb`` read as JSON)."""
    blocks, code = output_numbers(executed)
    out = []
    for index, cell in markdown_cells(py):
        for sentence in sentences(cell):
            if SOURCE.search(sentence):
                continue
            for m in ANY_NUMBER.finditer(sentence):
                claim = m.group(0).strip()
                if claim in ALLOWED:
                    continue
                unit, approx = m.group("unit").strip(), bool(m.group("approx"))
                for tok in filter(None, (m.group("a"), m.group("b"))):
                    value, digits = _value(tok)
                    if _printed(value, digits, unit, approx, blocks):
                        continue
                    if digits == 0 and not approx and tok.replace(",", "") in code:
                        continue                  # an input the notebook's code sets (64 MiB blocks)
                    out.append(f"{py.name} cell [{index}]: {claim!r} is neither printed by the executed notebook "
                               f"nor sourced: {' '.join(sentence.split())[:140]}")
                    break
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--executed", metavar="DIR", type=Path,
                    help="folder of executed NN_*.ipynb (e.g. COURSE_EXECUTED_DIR of a notebook test run): "
                         "also check every number with a unit against their outputs")
    ap.add_argument("notebooks", nargs="*", type=Path, help="NN_*.py pairs to check (default: all)")
    args = ap.parse_args(argv)
    pys = args.notebooks or sorted((ROOT / "notebooks").glob("[0-9]*.py"))
    bad = [o for py in pys for o in offenders(py)]
    for o in bad:
        print(o)
    print(f"{len(bad)} unsourced measured-looking numbers in markdown")
    if args.executed is None:
        print("output check skipped: no --executed DIR given (a folder of executed notebooks, e.g. the "
              "COURSE_EXECUTED_DIR of a notebook test run) — numbers with units were not compared with outputs")
        return 1 if bad else 0
    if not args.executed.is_dir():
        print(f"--executed {args.executed} is not a directory: execute the notebooks into it first")
        return 2
    late, missing = [], []
    for py in pys:
        nb = args.executed / (py.stem + ".ipynb")
        if not nb.is_file():
            missing.append(nb.name)
            continue
        late += unprinted(py, json.loads(nb.read_text()))
    for o in late:
        print(o)
    checked = len(pys) - len(missing)
    print(f"{len(late)} numbers with a unit neither printed nor sourced, in {checked} executed notebook(s)"
          + (f"; not in {args.executed}, so not compared with outputs: {', '.join(missing)}" if missing else ""))
    return 1 if bad or late else 0


if __name__ == "__main__":
    sys.exit(main())
