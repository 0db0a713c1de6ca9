"""What a learner sees of each executed cell: no more than a screenful of outputs, and the cell's result last.

JupyterLab shows the first 50 outputs of a cell and folds the rest behind "Show more outputs"; a
library that logs hundreds of lines pushes the table or plot the cell exists for out of sight. Rules,
checked on an executed notebook (nbformat v4):

* at most ``MAX_OUTPUTS`` outputs per cell as JupyterLab counts them (consecutive stream messages
  merged; its fold limit is 50, kept with margin);
* at most ``MAX_LINES`` lines of text per cell, counted as a terminal shows them: a progress bar's
  ``\\r`` redraws are one line, not one per update;
* the cell's result comes last: no stderr text (logs, warnings) after its last table, plot or value.

Used by ``notebooks/conftest.py`` on every notebook it runs (CI), and from the command line on
saved executed notebooks: ``python scripts/check_outputs.py build/executed/*.ipynb``.
"""
from __future__ import annotations

import sys
from pathlib import Path

MAX_OUTPUTS = 40
MAX_LINES = 60
RESULT_TYPES = ("execute_result", "display_data")


def screen_lines(text: str) -> int:
    """Lines a terminal shows for ``text``: one per ``\\n``; a progress bar's ``\\r`` redraws stay on one line."""
    return 0 if not text else text.count("\n") + (0 if text.endswith("\n") else 1)


def shown_outputs(outs: list[dict]) -> int:
    """Outputs as JupyterLab counts them: consecutive stream messages of one name (stdout, stderr) are
    merged into one output; every table, plot or value is one."""
    n, last = 0, None
    for o in outs:
        name = o.get("name") if o.get("output_type") == "stream" else None
        if name is None or name != last:
            n += 1
        last = name
    return n


def cell_problems(cell: dict) -> list[str]:
    """The rules above, for one code cell's outputs; [] when the cell reads well."""
    outs = cell.get("outputs", [])
    found = []
    shown = shown_outputs(outs)
    if shown > MAX_OUTPUTS:
        found.append(f"{shown} outputs (JupyterLab folds after 50; at most {MAX_OUTPUTS} allowed)")
    streams: dict[str, str] = {}
    for o in outs:
        if o.get("output_type") == "stream":
            streams[o["name"]] = streams.get(o["name"], "") + "".join(o.get("text", ""))
    lines = sum(screen_lines(t) for t in streams.values())
    if lines > MAX_LINES:
        found.append(f"{lines} lines of text (more than a screenful; at most {MAX_LINES}): quiet the logs")
    last_result = max((i for i, o in enumerate(outs) if o.get("output_type") in RESULT_TYPES), default=None)
    if last_result is not None:
        after = [o for o in outs[last_result + 1:] if o.get("output_type") == "stream" and o.get("name") == "stderr"
                 and "".join(o.get("text", "")).strip()]
        if after:
            first = "".join(after[0].get("text", "")).strip().splitlines()[0][:100]
            found.append(f"stderr after the cell's result (the result is not the last thing shown): {first!r}")
    return found


def problems(nb: dict, name: str = "notebook") -> list[str]:
    """Every rule broken in an executed notebook, as ``name cell [i]: what`` lines."""
    out = []
    for i, cell in enumerate(nb.get("cells", [])):
        if cell.get("cell_type") == "code":
            out += [f"{name} cell [{i}]: {p}" for p in cell_problems(cell)]
    return out


def main(paths: list[str]) -> int:
    import nbformat
    if not paths:
        print("usage: python scripts/check_outputs.py EXECUTED.ipynb ...  (notebooks with their outputs)")
        return 2
    bad = []
    for p in paths:
        if not Path(p).is_file():
            print(f"{p}: no such file (pass executed notebooks, e.g. build/executed/*.ipynb)")
            return 2
        bad += problems(nbformat.read(p, 4), Path(p).name)
    print("\n".join(bad) or f"{len(paths)} notebook(s): every cell within a screenful, results last")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
