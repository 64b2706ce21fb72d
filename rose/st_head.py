"""The sentence-transformers Dense modules on the device, applied to the pooled rows.

`ModelRunner.forward` is model -> span pooling -> `runner.transform`; `attach_dense` makes that transform
`family transform(Dense_n(...Dense_1(pooled)))`, so the eager path and every CUDA graph (captured from
`forward`) include the Dense layers. Their weights stay float32 (the pooled rows are float32), read from
the Dense folder's model.safetensors, or pytorch_model.bin with `weights_only=True`. Normalize is the
output head's (rose.head, per request, after Matryoshka truncation), as sentence-transformers' is after Dense.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import nn

from rose.checkpoint import open_weights
from rose.spec import ModelFolderError, ModelSpec
from rose.st_modules import DenseSpec

_ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "identity": nn.Identity, "tanh": nn.Tanh, "relu": nn.ReLU, "gelu": nn.GELU, "sigmoid": nn.Sigmoid,
    "silu": nn.SiLU}


def _dense_state(folder: Path) -> dict[str, torch.Tensor]:
    """The Dense folder's weights through rose.checkpoint's reader (safetensors first; a pickle with
    weights_only=True, refused naming the file when it names anything but tensors)."""
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (folder / name).is_file():
            with open_weights(folder / name) as f:
                return {key: f.get(key) for key in f.keys()}
    raise ModelFolderError(f"{folder}: Dense weights not found (model.safetensors or pytorch_model.bin)")


def load_dense(dense: DenseSpec, device: torch.device) -> nn.Sequential:
    """Linear(in, out, bias) + activation, float32 on `device`, eval, without grads."""
    state = _dense_state(dense.folder)
    want = {"linear.weight": (dense.out_features, dense.in_features)}
    if dense.bias:
        want["linear.bias"] = (dense.out_features,)
    params = {}
    for name, shape in want.items():
        if name not in state:
            raise ModelFolderError(f"{dense.folder}: Dense tensor {name!r} not found (has {sorted(state)})")
        if tuple(state[name].shape) != shape:
            raise ModelFolderError(f"{dense.folder}: Dense tensor {name!r} has shape {tuple(state[name].shape)}, "
                                   f"its config implies {shape}")
        params[name.removeprefix("linear.")] = state[name]
    linear = nn.Linear(dense.in_features, dense.out_features, bias=dense.bias, device="meta")
    linear.load_state_dict(params, strict=True, assign=True)
    layer = nn.Sequential(linear, _ACTIVATIONS[dense.activation]())
    layer.to(device=device, dtype=torch.float32).eval().requires_grad_(False)
    return layer


class DenseTransform:
    """The family's transform after the Dense stack: what forward() applies to the pooled rows."""

    def __init__(self, layers: Sequence[nn.Module], transform: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.layers, self.transform = list(layers), transform

    def __call__(self, pooled: torch.Tensor) -> torch.Tensor:
        x = pooled
        for layer in self.layers:
            x = layer(x)
        return self.transform(x)


def attach_dense(runner, spec: ModelSpec) -> None:
    """Put the folder's Dense modules into `runner`'s forward; before any step, so graphs capture them."""
    if not spec.dense:
        return
    if runner.runs or (runner.graphs is not None and runner.graphs.graphs):
        raise RuntimeError("attach_dense must run before the runner's first step")
    layers = [load_dense(d, runner.device) for d in spec.dense]
    runner.transform = DenseTransform(layers, runner.transform)
    runner.dense_layers = layers
