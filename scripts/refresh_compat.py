"""Re-read the PyPI-derived columns of src/envbuild/data/compat.json (`make compat-refresh`).

python scripts/refresh_compat.py          # update the file, print what changed
python scripts/refresh_compat.py --check  # exit 1 when PyPI disagrees with the file
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from envbuild.compat_refresh import refresh

DATA = Path(__file__).resolve().parents[1] / "src" / "envbuild" / "data" / "compat.json"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true", help="report drift, write nothing")
    args = parser.parse_args()
    data = json.loads(DATA.read_text())
    changes = refresh(data)
    for line in changes:
        print(line)
    if not changes:
        print("compat data agrees with PyPI")
        return 0
    if args.check:
        return 1
    DATA.write_text(json.dumps(data, indent=1) + "\n")
    print(f"updated {DATA}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
