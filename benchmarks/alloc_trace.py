"""The real allocation sequence of one ``generate``, recorded by PyTorch's memory history, beside the
sequence :func:`helpers.budget_replay.generation_ops` assumes: where the reserved-memory prediction comes from,
and, where it misses, which blocks it misses (issue 16's device-level footprint).

    python -m benchmarks.alloc_trace --arch Llama-3.2-1B --layers 2 --seq 2048 --batch 2 --out results/h200/alloc_trace.json
    python -m benchmarks.alloc_trace --points Mistral-7B:sdpa:512:1 Qwen2.5-0.5B:eager:8192:1 \
        --out results/h200/alloc_peaks.json

Writes per attention implementation: the allocator events of the call (``alloc``/``free_completed``
with size and the innermost transformers/torch Python frame), the reserved bytes measured and
simulated from the recorded events and from ``generation_ops``. With ``--points`` (whole models, as
``benchmarks.budget_accuracy`` measures a point: warm-up generate, then 32 new tokens): which
blocks are alive at the prefill's and at the decode's peak, grouped by the frame that allocated them
(:func:`alive_at_peaks`), the segments the allocator held before the call (``segments_before``: address,
size, blocks) and those it reserved during it (with addresses; the events include ``segment_alloc`` /
``segment_free``), so a replay can follow the driver's address order. ``--out`` ending in ``.gz`` is
written compressed. CUDA only.
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

import torch

from helpers import budget_replay, generation, measure, models
from helpers.allocator_sim import simulate
from helpers.config import write_json


def frame(entry) -> str:
    """The innermost frame of an event from transformers or the course (what made the allocation)."""
    for f in entry.get("frames", []):
        name = f.get("filename", "")
        if "transformers" in name or "helpers" in name:
            return f"{name.split('site-packages/')[-1]}:{f.get('line')} {f.get('name')}"
    return ""


MARK_BYTES = 512 * 1999    # a size no tensor of these models has: marks the start of each forward call


def alive_at_peaks(events: list[dict], mark_bytes: int = MARK_BYTES, top: int = 12) -> dict:
    """Replay recorded allocator events (``alloc``/``free_completed`` with ``addr``, ``size`` and
    ``frame``) and find, in the first forward call (the prefill: from the first ``mark_bytes``
    allocation to the second) and in the later ones (decode), the moment the bytes allocated during
    the call peak; return those peaks and the blocks alive then, summed per allocating frame, largest
    first (``top`` of them). Blocks that were alive before the trace began are not in it, so the peak
    is over what the call allocated, as ``measure_generate``'s are."""
    live, bytes_now, phase = {}, 0, -1
    best = {"prefill": (0, {}), "decode": (0, {})}
    for e in events:
        if e["action"] == "alloc":
            if e["size"] == mark_bytes:
                phase += 1
                continue
            live[e["addr"]] = (e["size"], e.get("frame", ""))
            bytes_now += e["size"]
            key = "prefill" if phase <= 0 else "decode"
            if phase >= 0 and bytes_now > best[key][0]:
                best[key] = (bytes_now, dict(live))
        elif e["action"] == "free_completed" and e["addr"] in live:
            bytes_now -= live.pop(e["addr"])[0]
    out = {}
    for key, (peak, alive) in best.items():
        per = {}
        for size, where in alive.values():
            n, total = per.get(where, (0, 0))
            per[where] = (n + 1, total + size)
        ranked = sorted(per.items(), key=lambda kv: -kv[1][1])[:top]
        out[key] = {"peak": peak, "blocks": [{"frame": f, "count": n, "bytes": b} for f, (n, b) in ranked]}
    return out


def trace(model, seq: int, batch: int, new_tokens: int, max_entries: int = 200_000) -> dict:
    measure.free_memory()
    base_reserved = torch.cuda.memory_reserved()
    before = [{"address": sg["address"], "total_size": sg["total_size"], "segment_type": sg["segment_type"],
               "blocks": [[b["size"], b["state"]] for b in sg["blocks"]]} for sg in torch.cuda.memory._snapshot()["segments"]]
    torch.cuda.memory._record_memory_history(max_entries=max_entries, stacks="python")
    try:
        m = generation.measure_generate(model, seq, batch, new_tokens)
        snap = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    segments = [{"size": e["size"], "address": e["addr"], "frame": frame(e)} for dev in snap["device_traces"]
                for e in dev if e["action"] == "segment_alloc"]
    events = [e for dev in snap["device_traces"] for e in dev
              if e["action"] in ("alloc", "free_completed", "segment_alloc", "segment_free")]
    ops, live, out = [], {}, []
    for i, e in enumerate(events):
        if e["action"] == "alloc":
            live[e["addr"]] = f"t{i}"
            ops.append(["alloc", f"t{i}", e["size"]])
        elif e["action"] == "free_completed" and e["addr"] in live:
            ops.append(["free", live.pop(e["addr"])])
        out.append({"action": e["action"], "addr": e["addr"], "size": e["size"], "frame": frame(e)})
    return {"events": out, "segments": segments, "segments_before": before,
            "reserved_meas_over_start": m["reserved"] - base_reserved,
            "prefill_meas": m["prefill_meas"], "decode_meas": m["decode_meas"], "forward_peaks": m["forward_peaks"],
            "reserved_sim_from_events": simulate(ops)["reserved"], "peak_meas": m["peak_meas"]}


def point_peaks(spec: str, new_tokens: int = 32) -> dict:
    """``ARCH:ATTENTION:SEQ:BATCH``, measured as ``benchmarks.budget_accuracy`` measures it (whole model,
    random weights, a warm-up generate first): the measured prefill/decode peaks, :func:`alive_at_peaks`
    and the segments reserved during the call."""
    arch, attention, seq, batch = spec.split(":")
    model, _ = generation.measure_weights(arch, attn_implementation=attention)
    generation.measure_generate(model, 64, 1, 2)
    def mark(*_):                   # allocated and freed at once: one event per forward call, inputs untouched
        torch.empty(MARK_BYTES, dtype=torch.uint8, device="cuda")

    hook = model.register_forward_pre_hook(mark)
    try:
        r = trace(model, int(seq), int(batch), new_tokens, max_entries=4_000_000)
    finally:
        hook.remove()
    del model
    measure.free_memory()
    events = r.pop("events")
    frames = sorted({e["frame"] for e in events})
    where = {f: i for i, f in enumerate(frames)}
    code = {"alloc": "a", "free_completed": "f", "segment_alloc": "s", "segment_free": "S"}
    compact = [[code[e["action"]], e["addr"], e["size"], where[e["frame"]]] for e in events]
    return {"point": spec, "new_tokens": new_tokens, **r, **alive_at_peaks(events),
            "n_events": len(events), "frames": frames, "events": compact}


def write(path: Path, rows: list) -> None:
    """``rows`` as JSON, gzip-compressed when ``path`` ends in ``.gz`` (whole models' events are large)."""
    if path.suffix != ".gz":
        return write_json(path, rows, indent=None)
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.write(json.dumps(rows))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", nargs="*", default=None, help="ARCH:ATTENTION:SEQ:BATCH points (whole models)")
    ap.add_argument("--arch", default="Llama-3.2-1B")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=4)
    ap.add_argument("--out", default="results/h200/alloc_trace.json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("alloc_trace needs a CUDA device")
    rows = []
    if args.points:
        for spec in args.points:
            rows.append(point_peaks(spec))
            print({k: v for k, v in rows[-1].items() if k not in ("segments", "segments_before", "events", "frames")},
                  flush=True)
            write(Path(args.out), rows)
        return
    for attention in ("sdpa", "eager"):
        model = models.model_from_config(args.arch, device="cuda", dtype=torch.bfloat16, attn_implementation=attention)
        models.keep_first_layers(model, args.layers)
        measure.free_memory()
        generation.measure_generate(model, 64, 1, 2)          # kernels loaded, workspaces allocated
        r = trace(model, args.seq, args.batch, args.new_tokens)
        cfg = model.config
        w_ops = budget_replay.weight_ops(cfg)
        pred = simulate(budget_replay.generation_ops(cfg, args.seq, args.new_tokens, args.batch, attention))["reserved"]
        r.update(arch=args.arch, layers=args.layers, attention=attention, seq_len=args.seq, batch=args.batch,
                 new_tokens=args.new_tokens, reserved_pred_over_weights=pred - simulate(w_ops)["reserved"])
        rows.append(r)
        print({k: v for k, v in r.items() if k not in ("events", "segments_before")}, flush=True)
        del model
        measure.free_memory()
    write(Path(args.out), rows)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
