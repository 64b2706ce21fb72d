"""The per-request output head (rose/head.py) on native rows: Matryoshka dimensions in 1..width, anything else
refused naming the value. A negative value sliced columns off the end (64 wide, -5: 59 columns, silently)."""

import numpy as np
import pytest

from rose.head import Encoding, OutputOptions, apply_head

ROWS = np.random.default_rng(0).standard_normal((2, 64)).astype(np.float32)


@pytest.mark.parametrize("dimensions", [-5, -64, 65])
def test_dimensions_outside_one_to_the_width_are_refused(dimensions) -> None:
    with pytest.raises(ValueError, match=f"dimensions {dimensions}"):
        apply_head(ROWS, OutputOptions(dimensions=dimensions), native_int8=False, default_normalize=True)


def test_dimensions_keep_the_first_columns_renormalized() -> None:
    out = apply_head(ROWS, OutputOptions(dimensions=8), native_int8=False, default_normalize=True)
    assert out.shape == (2, 8) and np.allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-6)
    assert np.allclose(out * np.linalg.norm(ROWS[:, :8], axis=1, keepdims=True), ROWS[:, :8], atol=1e-5)
    full = apply_head(ROWS, OutputOptions(encoding=Encoding.BINARY), native_int8=False, default_normalize=True)
    assert full.shape == (2, 8)  # 0: the full width, 64 bits packed
