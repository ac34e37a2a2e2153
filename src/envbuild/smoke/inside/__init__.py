"""envbuild smoke test: prove that this environment really trains.

Runs inside every envbuild image (`envbuild-smoke`) or in any interpreter
(`python -m envbuild_smoke` with this package on the path). Needs only the
standard library, torch and numpy, so it is copied into an image whole and
imports nothing of envbuild's.

Each check reports pass / fail / skip with a reason, its duration, the facts
it found, and on failure a remedy. Exit 0 only when every required check
passes. `--json FILE` (or `-` for stdout) writes a versioned report.
"""
