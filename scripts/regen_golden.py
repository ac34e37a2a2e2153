"""Regenerate tests/golden/<profile>/ from the shipped profiles (`make golden`).

Review the diff before committing: a golden change is a change of what users get.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from envbuild import layering, render, validate
from envbuild import plan as plan_mod

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    golden = REPO / "tests" / "golden"
    if golden.exists():
        shutil.rmtree(golden)
    for path in sorted((REPO / "profiles").glob("*.yaml")):
        if path.name.startswith("_"):
            continue
        prof = validate.load_valid(path)
        outputs = render.render(plan_mod.for_profile(prof, templates_dir=REPO / "templates"))
        plan = plan_mod.for_profile(prof, templates_dir=REPO / "templates")
        built = layering.dockerfile_from(plan, REPO / "lockfiles" / prof.name)
        if built is not None:
            outputs["Dockerfile.build"] = built
        render.write_outputs(outputs, golden / prof.name)
        print(f"golden: {prof.name}: {', '.join(sorted(outputs))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
