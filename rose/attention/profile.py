"""The model's serving profile: which attention backend wins at which token bucket, measured on a GPU.

Why per bucket: no kernel wins everywhere. On the H200 with Qwen3-0.6B's shape, FlashInfer's fa3 beats
torch's varlen by 1.9x at 4096 tokens, while tiny batches favour the kernel with the least launch work.
`python -m benchmarks.attention_ab` measures every installed backend and writes the winners beside the
model (MODEL_DIR/rose_profile.json):

    {"version": 1, "attention": {"128": "varlen", "4096": "flashinfer-fa3", ...},
     "gpu": "NVIDIA H200", "dtype": "bfloat16", "measured": [...]}

A batch of T tokens uses the entry of the smallest bucket >= T (above the largest: the largest's).
`PerBucketBackend` dispatches on meta.layout.tokens, which a CUDA graph fixes, so each captured graph
holds exactly one backend's kernels; plan() forwards to that backend's host-side planning.
"""

from __future__ import annotations

import bisect
import json
import math
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rose.attention.base import FULL, AttentionBackend, AttentionBackendError
from rose.meta import ForwardMeta

PROFILE_NAME = "rose_profile.json"
PROFILE_VERSION = 1


class ProfileError(AttentionBackendError):
    """The serving profile file is unreadable or malformed."""


@dataclass(frozen=True)
class ServingProfile:
    attention: dict[int, str]  # token bucket -> backend name
    info: dict[str, Any] = field(default_factory=dict)  # gpu, dtype, model, measured rows: for people

    def __post_init__(self) -> None:
        if not self.attention:
            raise ProfileError("a serving profile needs at least one token bucket")

    @property
    def buckets(self) -> list[int]:
        return sorted(self.attention)

    def backend_for(self, tokens: int) -> str:
        edges = self.buckets
        i = bisect.bisect_left(edges, tokens)
        return self.attention[edges[min(i, len(edges) - 1)]]

    def to_json(self) -> dict[str, Any]:
        return {"version": PROFILE_VERSION, "attention": {str(t): self.attention[t] for t in self.buckets},
                **{k: v for k, v in self.info.items() if k not in ("version", "attention")}}

    @classmethod
    def from_json(cls, data: Any, source: str = "profile") -> ServingProfile:
        if not isinstance(data, dict) or not isinstance(data.get("attention"), dict):
            raise ProfileError(f"{source}: expected an object with an 'attention' map of token bucket -> backend")
        if data.get("version", PROFILE_VERSION) != PROFILE_VERSION:
            raise ProfileError(f"{source}: version {data.get('version')!r}, this ROSE reads {PROFILE_VERSION}")
        try:
            attention = {int(t): str(name) for t, name in data["attention"].items()}
        except (TypeError, ValueError):
            raise ProfileError(f"{source}: token buckets must be integers") from None
        if any(t <= 0 for t in attention):
            raise ProfileError(f"{source}: token buckets must be positive")
        info = {k: v for k, v in data.items() if k not in ("version", "attention")}
        return cls(attention, info)

    @classmethod
    def load(cls, path: str | Path) -> ServingProfile:
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ProfileError(f"{path}: cannot read the serving profile ({exc})") from None
        return cls.from_json(data, str(path))

    def save(self, path: str | Path) -> Path:
        """Atomically (write, then rename) so a serving replica never reads half a file."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, path)
        return path


def profile_path(model_dir: str | Path) -> Path:
    return Path(model_dir) / PROFILE_NAME


def winners_per_bucket(measured: Iterable[tuple[int, str]], buckets: Iterable[int]) -> dict[int, str]:
    """Each engine token bucket takes the winner of the measured shape nearest in tokens (log scale; on a
    tie the smaller shape). `measured` holds (tokens, winning backend) pairs."""
    points = sorted(measured)
    if not points:
        raise ProfileError("no measured shape has a winner")
    out = {}
    for bucket in sorted({int(b) for b in buckets}):
        _, name = min(points, key=lambda p: (abs(math.log(p[0]) - math.log(bucket)), p[0]))
        out[bucket] = name
    return out


class PerBucketBackend(AttentionBackend):
    """Dispatches each batch to the backend its padded token count maps to (one per bucket range)."""

    def __init__(self, profile: ServingProfile, backends: dict[str, AttentionBackend]) -> None:
        missing = set(profile.attention.values()) - set(backends)
        if missing:
            raise AttentionBackendError(f"no backend instance for {sorted(missing)}")
        unsafe = [name for name, b in backends.items() if not b.graph_safe]
        if unsafe:
            raise AttentionBackendError(f"per-bucket dispatch needs graph-safe backends; {unsafe} are not")
        self.profile, self.backends = profile, backends
        self.graph_safe = True
        self.bidirectional_window = all(b.bidirectional_window for b in backends.values())
        self.host_plan_state = any(b.host_plan_state for b in backends.values())
        self.name = "profile(" + ",".join(f"{name}<={edge}" for edge, name in _ranges(profile)) + ")"

    def backend_for(self, meta: ForwardMeta) -> AttentionBackend:
        return self.backends[self.profile.backend_for(meta.layout.tokens)]

    def plan(self, meta: ForwardMeta) -> None:
        self.backend_for(meta).plan(meta)

    def prepare(self, meta: ForwardMeta, causal: bool, window: int = FULL) -> Any:
        return self.backend_for(meta).prepare(meta, causal, window)

    def forward(self, q, k, v, meta: ForwardMeta, causal: bool, scale: float, state: Any = None,
                window: int = FULL):
        return self.backend_for(meta).forward(q, k, v, meta, causal, scale, state, window)


def _ranges(profile: ServingProfile) -> list[tuple[int, str]]:
    """Consecutive buckets with the same backend collapsed to (last edge, name)."""
    out: list[tuple[int, str]] = []
    for edge in profile.buckets:
        name = profile.attention[edge]
        if out and out[-1][1] == name:
            out[-1] = (edge, name)
        else:
            out.append((edge, name))
    return out


def backend_from_profile(profile: ServingProfile, build: Callable[[str], AttentionBackend],
                         fallback: str, warn: Callable[[str], None]) -> AttentionBackend:
    """Build the profile's backends with `build(name)`; a backend that cannot run here (package missing,
    other GPU) is replaced by `fallback` with a warning. One backend left: returned as is."""
    built: dict[str, AttentionBackend] = {}
    failed: set[str] = set()
    chosen: dict[int, str] = {}
    for edge in profile.buckets:
        name = profile.attention[edge]
        if name not in built and name not in failed:
            try:
                built[name] = build(name)
            except AttentionBackendError as exc:
                failed.add(name)
                warn(f"serving profile asks for attention {name!r} (up to {edge} tokens), which cannot run "
                     f"here ({exc}); using {fallback!r}")
        if name in failed:
            name = fallback
            if name not in built:
                built[name] = build(name)
        chosen[edge] = name
    used = {name: built[name] for name in set(chosen.values())}
    if len(used) == 1:
        return next(iter(used.values()))
    return PerBucketBackend(ServingProfile(chosen, profile.info), used)
