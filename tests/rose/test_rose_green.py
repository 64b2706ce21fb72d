"""rose.green: green-context streams (SMs held for the express lane). On a CPU it must refuse clearly; on a
device a GEMM on a green stream must give the ordinary stream's result.

    pytest tests/rose/test_rose_green.py            # the CPU half
    pytest -m gpu tests/rose/test_rose_green.py     # the device half
"""

from __future__ import annotations

import pytest
import torch

from rose.green import GreenContextUnavailable, green_stream


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU behaviour")
def test_green_stream_refuses_without_cuda():
    with pytest.raises(GreenContextUnavailable, match="CUDA is not available"):
        green_stream(8)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_green_stream_runs_work_correctly():
    try:
        ctx, stream = green_stream(16, 0)
    except GreenContextUnavailable as e:
        pytest.skip(str(e))
    a = torch.randn(512, 256, device="cuda")
    b = torch.randn(256, 128, device="cuda")
    want = a @ b
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        got = a @ b
    stream.synchronize()
    torch.testing.assert_close(got, want)
    del ctx
