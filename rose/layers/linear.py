"""Linear layers whose weights are several checkpoint tensors concatenated at load (QKV, gate-up).

One matmul instead of three (or two) is fewer kernel launches and better tensor-core occupancy; the
loader concatenates the checkpoint's separate weights along the output dimension.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


class MergedLinear(nn.Linear):
    def __init__(self, in_features: int, output_sizes: Sequence[int], bias: bool) -> None:
        super().__init__(in_features, int(sum(output_sizes)), bias=bias)
        self.output_sizes = tuple(int(s) for s in output_sizes)

    def forward_split(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The projection, split back into its parts (views, no copies)."""
        return self.forward(x).split(self.output_sizes, dim=-1)
