"""Reusable layer math shared by the model files (which only compose these)."""

from rose.layers.activations import get_activation
from rose.layers.encoder_norms import embed_layer_norm
from rose.layers.linear import MergedLinear
from rose.layers.norms import GemmaRMSNorm, LayerNorm, RMSNorm
from rose.layers.pooling import output_transform, segment_mean
from rose.layers.rotary import RotaryEmbedding, apply_rotary

__all__ = [
           "GemmaRMSNorm",
           "LayerNorm",
           "MergedLinear",
           "RMSNorm",
           "RotaryEmbedding",
           "apply_rotary",
           "embed_layer_norm",
           "get_activation",
           "output_transform",
           "segment_mean",
]
