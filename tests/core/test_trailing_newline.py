"""Every name validator anchors its pattern at both ends for real: ``re.match`` with ``$`` accepts a
trailing newline ("acme\\n"), which would then reach keys, logs and SQL as a second name; each refuses it."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from build_engines.spec import BuildSpec
from sluice.names import model_name_problem, triton_model_name_problem
from sluice.stores.admin_tokens.base import check_token_name, is_admin_token_format
from sluice.stores.registry.base import InvalidChange, check_model_name, check_replica_id, check_version_name
from sluice.stores.tenants.base import check_tenant_id


def _check_triton_model_name(name: str) -> str:
    if (problem := triton_model_name_problem(name)) is not None:
        raise ValueError(problem)
    return name


def _build_spec_model(name: str) -> BuildSpec:
    return BuildSpec("s3://weights/tiny", name, "1", "cpu")


CHECKS: list[tuple[str, Callable[[str], object], str]] = [
    ("triton model name", _check_triton_model_name, "sluice-tiny"),
    ("build model name", _build_spec_model, "sluice-tiny"),
    ("tenant id", check_tenant_id, "acme"),
    ("admin token name", check_token_name, "release-bot"),
    ("model name", check_model_name, "sluice-tiny"),
    ("version", check_version_name, "1"),
    ("replica id", check_replica_id, "local-1"),
]


@pytest.mark.parametrize(("what", "check", "good"), CHECKS, ids=[c[0] for c in CHECKS])
def test_a_trailing_newline_is_refused(what: str, check: Callable[[str], object], good: str) -> None:
    check(good)  # the name itself is fine
    with pytest.raises((ValueError, InvalidChange)):
        check(good + "\n")


def test_an_admin_token_with_a_trailing_newline_is_not_one() -> None:
    token = "sladm-" + "a" * 32
    assert is_admin_token_format(token) and not is_admin_token_format(token + "\n")


def test_the_two_model_name_rules() -> None:
    """A client's model name may hold "/" and ":"; one served from a Triton repository is a folder."""
    for name in ("org/model", "model:tag"):
        assert model_name_problem(name) is None and triton_model_name_problem(name) is not None
    for name in ("", "-lead", "a b", "x" * 129):
        assert model_name_problem(name) is not None and triton_model_name_problem(name) is not None
    assert model_name_problem("x" * 128) is None and triton_model_name_problem("sluice-tiny.v2_1") is None
