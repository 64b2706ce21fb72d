"""`python -m ivy serve|up ...` (same as the `ivy` console script)."""

from ivy.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
