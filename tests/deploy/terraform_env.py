"""How the deploy tests run terraform offline: where the binary and the provider mirror are, why a test
skips when one is missing, and the environment every terraform command gets (a CLI configuration that
installs providers only from the filesystem mirror, no update checks, automation output).

Nothing here writes into the repository: callers copy deploy/terraform into a temporary directory
(``copy_terraform_tree``) and run there, so ``.terraform/`` and lock files land in the copy."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TERRAFORM_DIR = ROOT / "deploy" / "terraform"
DEFAULT_MIRROR = Path("/opt/tf-plugins")
AWS_PROVIDER = Path("registry.terraform.io") / "hashicorp" / "aws"
AWS_MAJOR_MINOR = (5, 100)  # versions.tf: "~> 5.100"
MIN_TERRAFORM = (1, 10)  # the root's S3 backend uses use_lockfile; mock_provider needs 1.7
COMMAND_TIMEOUT_S = 300

CLI_CONFIG = """\
provider_installation {{
  filesystem_mirror {{
    path    = "{mirror}"
    include = ["registry.terraform.io/*/*"]
  }}
  direct {{
    exclude = ["registry.terraform.io/*/*"]
  }}
}}
"""


@dataclass(frozen=True)
class Terraform:
    """A terraform binary with the offline mirror's CLI configuration."""

    binary: str
    cli_config_path: Path

    def env(self) -> dict[str, str]:
        """The process environment: ours, minus any TF_* the caller's shell set (TF_CLI_ARGS, TF_VAR_*,
        TF_DATA_DIR... would change what is checked), plus the offline settings."""
        env = {key: value for key, value in os.environ.items() if not key.startswith("TF_")}
        env.update(
            TF_CLI_CONFIG_FILE=str(self.cli_config_path),
            CHECKPOINT_DISABLE="1",
            TF_IN_AUTOMATION="1",
            TF_INPUT="0",
            # NOTE: most of each command is the AWS provider decoding its schema; collecting garbage 4x
            # less often cuts a quarter of the CPU for a few hundred MB more per process.
            GOGC="400",
        )
        return env

    def run(self, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
        """Runs ``terraform <args> -no-color`` in ``cwd``; never raises on a non-zero exit."""
        return subprocess.run(
            [self.binary, *args, "-no-color"],
            cwd=cwd,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
            check=False,
        )


def plugin_mirror() -> Path:
    """The provider mirror: $TF_PLUGIN_MIRROR, else /opt/tf-plugins."""
    return Path(os.environ.get("TF_PLUGIN_MIRROR") or DEFAULT_MIRROR)


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def _mirror_reason(mirror: Path) -> str | None:
    """Why the mirror cannot serve hashicorp/aws ~> 5.100 for linux/amd64-like platforms, or None."""
    if not mirror.is_dir():
        return (
            f"no offline provider mirror at {mirror} (set TF_PLUGIN_MIRROR to a directory laid out as "
            f"{AWS_PROVIDER}/<version>/<os>_<arch>)"
        )
    versions = [p for p in (mirror / AWS_PROVIDER).glob("*/*_*") if p.is_dir()]
    usable = [p for p in versions if _version_tuple(p.parent.name)[:2] == AWS_MAJOR_MINOR]
    if not usable:
        found = sorted(f"{p.parent.name}/{p.name}" for p in versions) or ["nothing"]
        return f"the mirror {mirror} has no hashicorp/aws 5.100.x (found {', '.join(found)})"
    return None


def terraform_or_skip_reason(work_dir: Path) -> Terraform | str:
    """A ready Terraform (its CLI configuration written under ``work_dir``), or the reason to skip."""
    binary = os.environ.get("TERRAFORM") or shutil.which("terraform")
    if binary is None:
        return "terraform is not installed (not on PATH; set TERRAFORM to the binary)"
    try:
        done = subprocess.run(
            [binary, "version", "-json"], capture_output=True, text=True, timeout=60, check=True
        )
        version = str(json.loads(done.stdout)["terraform_version"])
    except (OSError, subprocess.SubprocessError, ValueError, KeyError) as exc:
        return f"{binary} version -json failed: {exc}"
    if _version_tuple(version)[:2] < MIN_TERRAFORM:
        wanted = ".".join(map(str, MIN_TERRAFORM))
        return f"terraform {version} at {binary} is older than {wanted}, which the root needs"
    mirror = plugin_mirror()
    reason = _mirror_reason(mirror)
    if reason is not None:
        return reason
    cli_config_path = work_dir / "terraform.tfrc"
    cli_config_path.write_text(CLI_CONFIG.format(mirror=mirror.resolve()))
    return Terraform(binary=binary, cli_config_path=cli_config_path)


def copy_terraform_tree(destination: Path) -> Path:
    """deploy/terraform copied to ``destination`` without working files (.terraform/, lock files,
    state), so modules resolve ``../../modules/x`` as in the repository and nothing is written there."""
    ignore = shutil.ignore_patterns(".terraform", ".terraform.lock.hcl", "*.tfstate", "*.tfstate.*")
    shutil.copytree(TERRAFORM_DIR, destination, ignore=ignore)
    return destination


def configuration_dirs() -> list[str]:
    """Every module and root, relative to deploy/terraform (e.g. ``modules/eks``, ``sluice``): a root is a
    directory of deploy/terraform itself with a versions.tf."""
    found = [
        path.parent.relative_to(TERRAFORM_DIR).as_posix()
        for pattern in ("modules/*/versions.tf", "*/versions.tf")
        for path in TERRAFORM_DIR.glob(pattern)
    ]
    return sorted(found)


def environment_names(directory: Path) -> list[str]:
    """The environments a root is planned for: one ``envs/<env>.tfvars`` each (none for a module)."""
    return sorted(path.name.removesuffix(".tfvars") for path in directory.glob("envs/*.tfvars"))
