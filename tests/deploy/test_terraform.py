"""deploy/terraform checked offline with terraform itself: ``fmt -check``, and for every module and the root
``init -backend=false`` against the provider mirror and ``terraform test`` (its tests/*.tftest.hcl plan
against ``mock_provider "aws"`` and assert on the plan). ``terraform test`` validates the configuration and
its test files before it plans (a module given an argument its resource does not take fails there, "An
argument named ... is not expected here"), so a separate ``validate`` would start the provider once more per
directory for nothing (~2 s of CPU each). The root is tested once per
environment, with that environment's var file and test file. Runs in a copy of the tree under the test's tmp
dir; skips, saying why, without terraform or the mirror (terraform_env)."""

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
    environment_names,
    terraform_or_skip_reason,
)

CONFIG_DIRS = configuration_dirs()
ROOT_DIR = "sluice"
ENVIRONMENTS = ("dev", "prod")
# The state keys the two roots had before they were one (environments/<env>): a changed key would start an
# empty state, and the next apply would create a second copy of the environment.
STATE_KEYS = {env: f"sluice/{env}/terraform.tfstate" for env in ENVIRONMENTS}
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


def _test_commands(directory: Path) -> list[tuple[str, ...]]:
    """``terraform test`` once per environment of a root (its envs/<env>.tfvars with only its
    tests/<env>.tftest.hcl: the root has no default sizes), or once for a module."""
    return [
        ("test", f"-var-file=envs/{env}.tfvars", f"-filter=tests/{env}.tftest.hcl")
        for env in environment_names(directory)
    ] or [("test",)]


def _check(terraform: Terraform, directory: Path) -> list[Step]:
    """init, then test, in ``directory``, stopping at the first failure."""
    steps: list[Step] = []
    for args in (("init", "-backend=false", "-input=false"), *_test_commands(directory)):
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
    """The parametrisation below is not silently empty: the eight modules, the root and both of its
    environments are there."""
    modules = {"network", "eks", "iam", "redis", "postgres", "weights", "files", "bucket"}
    assert {f"modules/{name}" for name in modules} | {ROOT_DIR} <= set(CONFIG_DIRS), CONFIG_DIRS
    assert environment_names(TERRAFORM_DIR / ROOT_DIR) == sorted(ENVIRONMENTS)


def _assignments(path: Path) -> dict[str, str]:
    """``name = value`` lines of a .tfvars or .tfbackend file (values as written, one line each)."""
    found = re.findall(r"^(\w+)\s*=\s*(.+?)\s*$", path.read_text(), re.MULTILINE)
    return dict(found)


@pytest.mark.parametrize("env", ENVIRONMENTS)
def test_each_environment_has_its_inputs_state_key_and_plan_tests(env: str) -> None:
    """An environment is a var file naming it, a partial backend with its old state key, and a test file;
    every var file sets the same variables, so none falls back to a default the others override."""
    envs = TERRAFORM_DIR / ROOT_DIR / "envs"
    inputs = _assignments(envs / f"{env}.tfvars")
    assert inputs.get("environment") == f'"{env}"', f'envs/{env}.tfvars must set environment = "{env}"'
    assert _assignments(envs / f"{env}.s3.tfbackend") == {"key": f'"{STATE_KEYS[env]}"'}
    assert (TERRAFORM_DIR / ROOT_DIR / "tests" / f"{env}.tftest.hcl").is_file()
    for other in ENVIRONMENTS:
        assert inputs.keys() == _assignments(envs / f"{other}.tfvars").keys(), (env, other)


def test_fmt(terraform: Terraform) -> None:
    # NOTE: fmt -check only reads, so it runs on the repository itself.
    done = terraform.run(TERRAFORM_DIR, "fmt", "-check", "-recursive", "-diff")
    assert done.returncode == 0, f"terraform fmt -recursive deploy/terraform would change:\n{done.stdout}"


@pytest.mark.slow
@pytest.mark.parametrize("name", CONFIG_DIRS)
def test_init_and_plan_tests(name: str, checked: dict[str, list[Step]]) -> None:
    steps = checked[name]
    for step in steps:
        assert step.done.returncode == 0, f"{name}: {step.describe()}"
    test_steps = [step for step in steps if step.args[0] == "test"]
    assert len(test_steps) == max(1, len(environment_names(TERRAFORM_DIR / name))), steps
    for test_step in test_steps:
        summary = SUMMARY.search(test_step.done.stdout)
        assert summary is not None, f"{name}: no summary line: {test_step.describe()}"
        # NOTE: terraform test passes with zero test files (or a -filter matching none); a module or an
        # environment without plan tests fails here.
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
