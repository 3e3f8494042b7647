"""checkov over deploy/terraform (and the Kubernetes manifests when they exist), from its own virtualenv:
its pins (boto3, networkx, its own HCL parser...) clash with ours. The virtualenv is made on first use in
the user's cache (``$XDG_CACHE_HOME`` or ~/.cache, ``sluice/checkov-<version>-venv``: a few minutes, needs
the package index), so later checkouts on the machine (CI's fresh clones) reuse it; the test skips, saying
why, when it cannot be made.
Every skipped check is listed in deploy/terraform/.checkov.yaml (or an inline `checkov:skip`), with why."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TF_DIR = ROOT / "deploy" / "terraform"
KUBE_DIR = ROOT / "deploy" / "kubernetes"
CONFIG = TF_DIR / ".checkov.yaml"
TF_ROOT = TF_DIR / "sluice"  # the one root; .checkov.yaml scans it with prod's var file
CHECKOV_VERSION = "3.3.30"
CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
VENV = CACHE_DIR / "sluice" / f"checkov-{CHECKOV_VERSION}-venv"
INSTALLED_MARKER = VENV / f"installed-checkov-{CHECKOV_VERSION}"
INSTALL_TIMEOUT_S = 900
RUN_TIMEOUT_S = 300
SKIP_LINE = re.compile(r"^\s*-\s*(?P<item>[^\s#]+)\s*(#\s*(?P<reason>.*))?$")  # skip-check, skip-path
SECTION = re.compile(r"^(?P<key>[\w-]+):")  # a top-level key of .checkov.yaml
SKIP_SECTIONS = ("skip-check", "skip-path")
INLINE_SKIP = re.compile(r"checkov:skip=(CKV2?_[A-Z0-9]+_\d+)(:(?P<reason>.*))?")


def _install() -> Path:
    """Creates the virtualenv with the pinned checkov, or skips the test with pip's last words."""
    shutil.rmtree(VENV, ignore_errors=True)
    VENV.parent.mkdir(parents=True, exist_ok=True)
    started_s = time.monotonic()
    steps = [
        [sys.executable, "-m", "venv", str(VENV)],
        [str(VENV / "bin" / "python"), "-m", "pip", "install", "-q", "--retries", "1", "--timeout", "30",
         f"checkov=={CHECKOV_VERSION}"],
    ]  # fmt: skip
    for step in steps:
        try:
            done = subprocess.run(
                step, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired:
            shutil.rmtree(VENV, ignore_errors=True)
            pytest.skip(f"installing checkov {CHECKOV_VERSION} took over {INSTALL_TIMEOUT_S} s")
        if done.returncode != 0:
            shutil.rmtree(VENV, ignore_errors=True)
            tail = (done.stdout + done.stderr).strip()[-600:]
            pytest.skip(f"cannot create the checkov virtualenv ({' '.join(step[:4])}...): {tail}")
    INSTALLED_MARKER.write_text(f"installed in {time.monotonic() - started_s:.0f} s\n")
    return VENV / "bin" / "checkov"


@pytest.fixture(scope="module")
def checkov() -> Path:
    if INSTALLED_MARKER.exists():
        return VENV / "bin" / "checkov"
    return _install()


def run_checkov(
    checkov: Path, directory: Path, framework: str, *extra: str
) -> subprocess.CompletedProcess[str]:
    command = [str(checkov), "-d", str(directory), "--framework", framework, "--skip-download", "--compact",
               "--quiet", *extra]  # fmt: skip
    # NOTE: BC_SKIP_MAPPING stops checkov fetching its guideline mapping; nothing else needs the network.
    env = {**os.environ, "BC_SKIP_MAPPING": "TRUE", "CHECKOV_RUN_SCA_PACKAGE_SCAN_V2": "false"}
    return subprocess.run(
        command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=ROOT, env=env, check=False
    )


@pytest.mark.slow
def test_terraform_passes_checkov(checkov: Path) -> None:
    done = run_checkov(checkov, TF_DIR, "terraform", "--config-file", str(CONFIG))
    assert done.returncode == 0, f"checkov failed checks on deploy/terraform:\n{done.stdout}\n{done.stderr}"


def test_the_root_is_scanned_as_prod() -> None:
    """Without a var file checkov passes what it cannot resolve (every size of the root is a variable), so
    the configuration names prod's inputs, relative to the repository root the scans run from."""
    var_files = re.findall(r"^var-file:\n((?:\s+-\s*\S+\n)+)", CONFIG.read_text(), re.MULTILINE)
    assert var_files, f"{CONFIG.name} names no var-file"
    named = re.findall(r"-\s*(\S+)", var_files[0])
    assert named == [(TF_ROOT / "envs" / "prod.tfvars").relative_to(ROOT).as_posix()], named
    assert (ROOT / named[0]).is_file()


@pytest.mark.slow
def test_the_var_file_reaches_the_root(checkov: Path) -> None:
    """The same configuration with dev's inputs fails prod's protections on the root's database: the var
    file is what decides, and the prod scan above passes because prod is protected."""
    dev = (TF_ROOT / "envs" / "dev.tfvars").relative_to(ROOT).as_posix()
    done = run_checkov(checkov, TF_ROOT, "terraform", "--config-file", str(CONFIG), "--var-file", dev)
    assert done.returncode != 0, done.stdout
    assert "CKV_AWS_293" in done.stdout and "CKV_AWS_157" in done.stdout, done.stdout


@pytest.mark.slow
def test_kubernetes_overlays_pass_checkov(checkov: Path, tmp_path: Path) -> None:
    """What the cluster would get: each overlay rendered by kubectl kustomize, then checked."""
    kubectl = shutil.which("kubectl")
    if not KUBE_DIR.is_dir() or kubectl is None:
        pytest.skip("deploy/kubernetes or kubectl is missing: no overlay to render")
    for overlay in sorted(p.name for p in (KUBE_DIR / "overlays").iterdir() if p.is_dir()):
        rendered = subprocess.run(
            [kubectl, "kustomize", str(KUBE_DIR / "overlays" / overlay)],
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        (tmp_path / f"{overlay}.yaml").write_text(rendered.stdout)
    done = run_checkov(checkov, tmp_path, "kubernetes", "--config-file", str(CONFIG))
    assert done.returncode == 0, (
        f"checkov failed checks on the rendered overlays:\n{done.stdout}\n{done.stderr}"
    )


@pytest.mark.slow
def test_checkov_fails_an_insecure_module(checkov: Path, tmp_path: Path) -> None:
    """The same configuration still fails a public, unencrypted database: a pass means something."""
    (tmp_path / "main.tf").write_text(
        'resource "aws_db_instance" "bad" {\n  instance_class = "db.t3.micro"\n'
        "  publicly_accessible = true\n  storage_encrypted = false\n}\n"
    )
    done = run_checkov(checkov, tmp_path, "terraform", "--config-file", str(CONFIG))
    assert done.returncode != 0, done.stdout
    assert "CKV_AWS_16" in done.stdout and "CKV_AWS_17" in done.stdout, done.stdout


def test_every_skipped_check_is_justified() -> None:
    """Each skipped check or path in .checkov.yaml has a `# reason`, each inline skip a `:reason`."""
    unjustified = []
    skipped = []
    section = ""
    for number, line in enumerate(CONFIG.read_text().splitlines(), start=1):
        if heading := SECTION.match(line):
            section = heading.group("key")
        elif section in SKIP_SECTIONS and (match := SKIP_LINE.match(line)):
            skipped.append(match.group("item"))
            if len((match.group("reason") or "").split()) < 4:
                unjustified.append(f"{CONFIG.relative_to(ROOT)}:{number}: {match.group('item')}")
    for path in sorted(TF_DIR.rglob("*.tf")):
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if match := INLINE_SKIP.search(line):
                skipped.append(match.group(1))
                if len((match.group("reason") or "").split()) < 4:
                    unjustified.append(f"{path.relative_to(ROOT)}:{number}: {match.group(1)}")
    assert skipped, "no skipped check found: the parser of .checkov.yaml is out of step with the file"
    assert not unjustified, "skipped checks without a reason:\n" + "\n".join(unjustified)
