"""Stale-prose check: a measured-looking number in a notebook's markdown must be sourced or computed.

A decimal or approximate number with a unit of measurement (GB/GiB/MiB/KiB, %, ×, tok/s, ms, µs, s,
GB/s, TB/s) in a markdown cell is a claim. It passes when its sentence names where it comes from (a paper, table, issue, docs
page, README, config file, the seed document) or says it is computed/printed by the cell ("above",
"below", "the table", "printed", "measured"), or when it is a definition listed in ALLOWED
(e.g. "2 bytes", "16 tokens"). Everything else is a number typed by hand that no cell will keep
true — the kind of prose that went stale in notebook 01 ("≈11 GB of activations" while the table
printed 15.6 GB).

    python scripts/check_prose_numbers.py            # exit 1 and list offenders
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
UNIT = r"(?:GB/s|TB/s|GiB|GB|MiB|MB|KiB|KB|%|×|x\b|tok/s|tokens/s|ms|µs|s\b)"
# measured-looking: a decimal (15.6 GB, 1.86×) or an approximation (≈ 22 GB); whole numbers with a unit
# are nearly always inputs the cell sets itself (64 MiB blocks, a 24 GB card) and are not flagged
NUMBER = re.compile(r"(?<![\w.])(?:≈\s*\d[\d,]*(?:\.\d+)?|\d[\d,]*\.\d+)\s?" + UNIT)
SOURCED = re.compile(r"arXiv|Table|§|#\d|docs|README|paper|config\.json|tokenizer_config|source document|"
                     r"seed|reports?|reported|README|above|below|the table|printed|measured|prints|"
                     r"column|plot|reference run|results/|\.json|log|issue|thread|Kwon|Frantar|Lin et al|"
                     r"gpt-fast|datasheet|data sheet|spec", re.I)
ALLOWED = {"2 bytes", "1 byte", "0.5 byte"}


def markdown_cells(py: Path):
    cell, in_md = [], False
    for line in py.read_text().splitlines():
        if line.startswith("# %%"):
            if in_md and cell:
                yield "\n".join(cell)
            cell, in_md = [], "[markdown]" in line
        elif in_md:
            cell.append(line[2:] if line.startswith("# ") else line.lstrip("#"))
    if in_md and cell:
        yield "\n".join(cell)


def offenders(py: Path) -> list[str]:
    out = []
    for cell in markdown_cells(py):
        if re.search(r"printed by the cell", cell):      # the cell declares its numbers come from the output
            continue
        text = re.sub(r"`[^`]*`|\$[^$]*\$|\([^)]*https?://[^)]*\)|\|.*\|", " ", cell)   # code, maths, links, tables
        for sentence in re.split(r"(?<=[.:;!?])\s+(?=[A-Z*(])|\n\n", text):
            for m in NUMBER.finditer(sentence):
                if m.group(0).strip() in ALLOWED or SOURCED.search(sentence):
                    continue
                out.append(f"{py.name}: {m.group(0)!r} in: {' '.join(sentence.split())[:140]}")
    return out


def main() -> int:
    bad = [o for py in sorted((ROOT / "notebooks").glob("[0-9]*.py")) for o in offenders(py)]
    for o in bad:
        print(o)
    print(f"{len(bad)} unsourced measured-looking numbers in markdown")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
