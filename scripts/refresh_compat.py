"""Re-read src/envbuild/data/compat.json's columns from their sources (`make compat-refresh`).

python scripts/refresh_compat.py          # update the PyPI-derived columns, print what changed
python scripts/refresh_compat.py --check  # exit 1 when PyPI disagrees with the file

Every torch release on PyPI is also held to its `auto` torchvision/torchaudio (a release there, not
older than an earlier patch's): reported, never written, as the tables below are.

Where download.pytorch.org or GitHub are reachable, the other tables are compared too (reported as
a table of field, ours, theirs, source; never written: a person settles a disagreement):

python scripts/refresh_compat.py --check --index cu121 --index cu128 --index rocm6.3 \\
    --test-infra 2.14=path/or/url/to/generate_binary_build_matrix.py
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import urllib.request
from pathlib import Path

from envbuild.compat_refresh import (
    PYPI_JSON,
    build_matrix,
    companion_gaps,
    disagreements,
    fetch_json,
    index_listing,
    refresh,
)

DATA = Path(__file__).resolve().parents[1] / "src" / "envbuild" / "data" / "compat.json"
INDEX_ROOT = "https://download.pytorch.org/whl"


def _read(location: str) -> str:
    if location.startswith(("http://", "https://")):
        with urllib.request.urlopen(location, timeout=60) as resp:  # noqa: S310 - a URL the user named
            return str(resp.read().decode("utf-8"))
    return Path(location).read_text("utf-8")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true", help="report drift, write nothing")
    parser.add_argument("--skip-pypi", action="store_true", help="compare only the tables named below")
    parser.add_argument("--index", action="append", default=[], metavar="BUILD", help="a PyTorch index build (cu121)")
    parser.add_argument("--index-root", default=INDEX_ROOT, help="where the PyTorch index (or a mirror) is")
    parser.add_argument(
        "--test-infra", action="append", default=[], metavar="MINOR=FILE", help="test-infra's matrix file"
    )
    args = parser.parse_args()
    data = json.loads(DATA.read_text())
    fetch = functools.cache(fetch_json)  # torch's PyPI index serves refresh and the companion check
    changes = [] if args.skip_pypi else refresh(data, fetch=fetch)
    for line in changes:
        print(line)
    index = {b: index_listing(_read(f"{args.index_root.rstrip('/')}/{b}/torch/")) for b in args.index}
    matrices = {}
    for spec in args.test_infra:
        minor, _, where = spec.partition("=")
        matrices[minor] = build_matrix(_read(where))
    table = disagreements(data, index=index, matrices=matrices)
    if not args.skip_pypi:  # every torch release on PyPI gets `auto` companions that exist there
        indexes = {name: fetch(PYPI_JSON.format(name=name)) for name in ("torch", "torchvision", "torchaudio")}
        table += companion_gaps(data, indexes)
    if table:
        width = max(len(row[0]) for row in table)
        print(f"{'field':<{width}}  ours | theirs | source")
        for field, ours, theirs, source in table:
            print(f"{field:<{width}}  {ours} | {theirs} | {source}")
    if not changes and not table:
        print("compat data agrees with " + ("PyPI" if not args.skip_pypi else "the tables named"))
        return 0
    if args.check:
        return 1
    if changes:
        DATA.write_text(json.dumps(data, indent=1) + "\n")
        print(f"updated {DATA}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
