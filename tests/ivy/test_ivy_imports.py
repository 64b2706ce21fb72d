"""Ivy's import boundary (DESIGN.md): the gateway never loads torch, tulip or the ROSE engine."""

import subprocess
import sys


def test_gateway_modules_import_without_torch_tulip_or_engine() -> None:
    code = (
        "import sys\n"
        "import ivy.app, ivy.cli, ivy.up, ivy.gateway, ivy.replicas\n"
        "app = ivy.app.create_app(ivy.config.IvyConfig())\n"
        "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'tulip', 'rose.engine')))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"ivy imported {out.stdout.strip()}"
