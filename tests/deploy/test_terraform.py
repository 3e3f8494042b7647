"""deploy/terraform checked offline with terraform itself: ``fmt -check``, and for every module and every
environment root ``init -backend=false`` against the provider mirror, ``validate``, and ``terraform test``
(its tests/*.tftest.hcl plan against ``mock_provider "aws"`` and assert on the plan). Runs in a copy of
the tree under the test's tmp dir; skips, saying why, without terraform or the mirror (terraform_env)."""

from __future__ import annotations

import os
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from terraform_env import (
    TERRAFORM_DIR,
    Terraform,
    configuration_dirs,
    copy_terraform_tree,
    terraform_or_skip_reason,
)

CONFIG_DIRS = configuration_dirs()
# terraform test's summary line, e.g. "Success! 5 passed, 0 failed." (or "... 1 skipped.")
SUMMARY = re.compile(r"(Success|Failure)! (?P<passed>\d+) passed, (?P<failed>\d+) failed")


@dataclass(frozen=True)
class Step:
    args: tuple[str, ...]
    done: subprocess.CompletedProcess[str]

    def describe(self) -> str:
        output = (self.done.stdout + self.done.stderr).strip()
        return f"terraform {' '.join(self.args)} -> exit {self.done.returncode}\n{output[-4000:]}"


@pytest.fixture(scope="module")
def terraform(tmp_path_factory: pytest.TempPathFactory) -> Terraform:
    found = terraform_or_skip_reason(tmp_path_factory.mktemp("terraform_cli"))
    if isinstance(found, str):
        pytest.skip(found)
    return found


def _check(terraform: Terraform, directory: Path) -> list[Step]:
    """init, validate, test in ``directory``, stopping at the first failure."""
    steps: list[Step] = []
    for args in (("init", "-backend=false", "-input=false"), ("validate",), ("test",)):
        step = Step(args, terraform.run(directory, *args))
        steps.append(step)
        if step.done.returncode != 0:
            break
    return steps


@pytest.fixture(scope="module")
def checked(terraform: Terraform, tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Step]]:
    """Every configuration checked once, a few at a time: each step is mostly the AWS provider starting,
    so running directories side by side roughly halves the wall time on two cores."""
    tree = copy_terraform_tree(tmp_path_factory.mktemp("terraform") / "tree")
    num_workers = max(1, min(4, os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=num_workers) as pool:
        futures = {name: pool.submit(_check, terraform, tree / name) for name in CONFIG_DIRS}
        return {name: future.result() for name, future in futures.items()}


def test_the_layout_is_found() -> None:
    """The parametrisation below is not silently empty: the eight modules and both roots are there."""
    modules = {"network", "eks", "iam", "redis", "postgres", "weights", "files", "bucket"}
    assert {f"modules/{name}" for name in modules} | {"environments/dev", "environments/prod"} <= set(
        CONFIG_DIRS
    ), CONFIG_DIRS


def test_fmt(terraform: Terraform) -> None:
    # NOTE: fmt -check only reads, so it runs on the repository itself.
    done = terraform.run(TERRAFORM_DIR, "fmt", "-check", "-recursive", "-diff")
    assert done.returncode == 0, f"terraform fmt -recursive deploy/terraform would change:\n{done.stdout}"


@pytest.mark.slow
@pytest.mark.parametrize("name", CONFIG_DIRS)
def test_init_validate_and_plan_tests(name: str, checked: dict[str, list[Step]]) -> None:
    steps = checked[name]
    for step in steps:
        assert step.done.returncode == 0, f"{name}: {step.describe()}"
    test_step = steps[-1]
    summary = SUMMARY.search(test_step.done.stdout)
    assert summary is not None, f"{name}: no summary line: {test_step.describe()}"
    # NOTE: terraform test passes with zero test files; a root or module without plan tests fails here.
    assert int(summary["passed"]) > 0, f"{name} has no tests/*.tftest.hcl runs: {test_step.describe()}"


@pytest.mark.parametrize("name", CONFIG_DIRS)
def test_plan_tests_use_the_mocked_provider(name: str) -> None:
    """Every test file plans against mock_provider "aws": a real provider would need credentials and
    the network, and an apply would create infrastructure."""
    test_files = sorted((TERRAFORM_DIR / name / "tests").glob("*.tftest.hcl"))
    assert test_files, f"{name} has no tests/*.tftest.hcl"
    for path in test_files:
        text = path.read_text()
        assert re.search(r'^mock_provider\s+"aws"', text, re.MULTILINE), f"{path}: no mock_provider"
        commands = re.findall(r"^\s*command\s*=\s*(\w+)", text, re.MULTILINE)
        runs = re.findall(r'^run\s+"', text, re.MULTILINE)
        assert commands.count("plan") == len(runs) and "apply" not in commands, (
            f"{path}: every run must be command = plan"
        )
