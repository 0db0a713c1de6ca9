"""Before a workshop: build every quantized variant, checkpoint and remembered measurement the notebooks
use into one shared course cache, so that during the session no notebook quantizes with a library.

    COURSE_CACHE=/shared/course-cache python scripts/prebuild.py          # the workshop profile
    COURSE_CACHE=/shared/course-cache python scripts/prebuild.py --check  # is everything there?
    COURSE_CACHE=/shared/course-cache python scripts/prebuild.py --only 08  # again, after 08 changed

It runs notebooks 03–09 headless in the ``workshop`` profile (the same code, so exactly the variants
the participants' notebooks will ask for: ours and llm-compressor's GPTQ and AWQ, RTN, the W4
checkpoints of 07–09, the load-peak measurements), with one progress bar over all their cells, and
writes the per-notebook times to ``build/prebuild/run_all.json`` (the agenda in docs/workshop.md uses
them). ``--check`` runs nothing: it lists the cache's variants, and fails when there are none for the
workshop profile (or holds only variants of an older store version, or of another size than written).
Point every participant's Jupyter at the same ``COURSE_CACHE`` and set ``COURSE_PROFILE=workshop`` there too.
The cache must stay writable by the participants: the notebooks take its file locks and remember their
perplexities in it (``scores.json``), and a variant that fails its checks is deleted and rebuilt.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILDERS = ["03_quantization_basics", "04_gptq", "05_awq", "06_perplexity", "07_kv_cache_ab",
            "08_quantized_inference", "09_clinic"]


def cache_root() -> Path:
    from helpers.config import cache_dir  # the course's one definition of the cache (COURSE_CACHE)
    return cache_dir()


def stored_variants(profile: str = "workshop") -> list[dict]:
    """The usable variants in the cache built under ``profile`` (their stored facts): of this store's
    version (``helpers.variants.CACHE_VERSION``: older ones are rebuilt when asked for) and with their
    safetensors of the size written."""
    from helpers.variants import CACHE_VERSION
    folder = cache_root() / "variants"
    rows = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        meta, weights = json.loads(path.read_text()), path.with_suffix(".safetensors")
        if (meta.get("profile") == profile and meta.get("cache_version") == CACHE_VERSION and weights.exists()
                and weights.stat().st_size == meta.get("file_bytes")):
            rows.append({"variant": path.stem, "seconds": meta.get("seconds"), "file_bytes": meta.get("file_bytes")})
    return rows


def select_builders(only: list[str] | None) -> list[str]:
    """The notebooks of :data:`BUILDERS` to run: all, or those whose names start with one of ``only``
    (``["07", "08"]`` or whole names) — to rebuild what one notebook uses after it changed."""
    if not only:
        return list(BUILDERS)
    unknown = [o for o in only if not any(b.startswith(o) for b in BUILDERS)]
    if unknown:
        raise ValueError(f"--only {unknown}: not notebooks the prebuild runs; they are {BUILDERS} "
                         "(give their numbers, e.g. --only 07 08)")
    return [b for b in BUILDERS if any(b.startswith(o) for o in only)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only list what the cache holds for the profile")
    ap.add_argument("--profile", default="workshop")
    ap.add_argument("--out", default=str(ROOT / "build" / "prebuild"))
    ap.add_argument("--only", nargs="+", default=None, metavar="NN",
                    help="run only these of the prebuild's notebooks (their numbers: --only 07 08 09)")
    args = ap.parse_args(argv)
    try:
        builders = select_builders(args.only)
    except ValueError as e:
        ap.error(str(e))
    if not args.check:
        spec = importlib.util.spec_from_file_location("run_all", ROOT / "scripts" / "run_all.py")
        run_all = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(run_all)
        print(f"building into {cache_root()} (profile {args.profile}) …")
        rows = run_all.run([ROOT / "notebooks" / f"{n}.ipynb" for n in builders], Path(args.out), args.profile,
                           progress=True)
        failed = [r["name"] for r in rows if not r["ok"]]
        if failed:
            print(f"FAILED: {failed} — see {args.out}/run_all.json; the cache holds what was built before")
            return 1
    found = stored_variants(args.profile)
    for r in found:
        print(f"  {r['variant'][:90]}")
    print(f"{len(found)} variants for the {args.profile} profile in {cache_root() / 'variants'}")
    if not found:
        print("none: run `python scripts/prebuild.py` (without --check) with the same COURSE_CACHE first")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
