"""``sluice models|versions|routes|rollout`` run in-process (``main([...])``) against the control plane
running as a real process (``python -m control_plane.service`` on its own port and SQLite file): what a
release manager sees (tables, ``--json``), a rollout driven to a rollback with the versions compared on
live traffic, and the exit codes (0 done, 1 refused or unreachable, 2 usage)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from control_plane_process import running_control_plane
from ports import free_port
from release_helpers import DIGEST, make_tokens, usage_rows, write_usage

from control_plane.cli.main import main
from sluice.settings import Settings, get_settings, load_settings
from sluice.stores.admin_tokens.dev import DEV_ADMIN_TOKEN
from sluice.stores.admin_tokens.roles import Role


class Service:
    def __init__(self, url: str, settings: Settings) -> None:
        self.url = url
        self.settings = settings  # the service's own (its SQLite file)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """The control plane as an operator starts it, with the dev admin token (platform-admin) on."""
    with running_control_plane(tmp_path_factory.mktemp("cp") / "state") as running:
        yield Service(running.url, running.settings())


@pytest.fixture(autouse=True)
def _clean(clean_env: Path) -> Path:
    return clean_env


def sluice(
    capsys: pytest.CaptureFixture[str], service: Service, *argv: str, token: str = DEV_ADMIN_TOKEN
) -> tuple[int, str, str]:
    """One command against the service; (exit code, stdout, stderr)."""
    get_settings.cache_clear()
    code = main([*argv, "--admin-url", service.url, "--token", token])
    out, err = capsys.readouterr()
    return code, out, err


def done(result: tuple[int, str, str]) -> str:
    code, out, err = result
    assert code == 0 and err == "", (code, out, err)
    return out


def rows(out: str, header: str) -> list[list[str]]:
    """The table that starts at the line beginning with ``header``, split into cells."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    return [line.split() for line in lines[start + 1 :] if line.strip() and not line.startswith("(")]


def prepare(capsys: pytest.CaptureFixture[str], service: Service, model: str) -> None:
    """``model``: v1 serving at 100%, v2 warming."""
    run = lambda *argv: done(sluice(capsys, service, *argv))  # noqa: E731
    assert f"Created model {model!r}" in run("models", "create", model, "--description", "the dev model")
    for version in ("v1", "v2"):
        out = run(
            "versions",
            "add",
            model,
            version,
            "--artifact-uri",
            f"s3://m/{version}",
            "--weights-digest",
            DIGEST,
            "--build-config",
            '{"dtype": "bf16"}',
        )
        assert f"Added {model}@{version}, staged" in out
    for version, state in (("v1", "warming"), ("v1", "serving"), ("v2", "warming")):
        assert f"is {state}" in run("versions", "set-state", model, version, state)
    assert "v1       100%   10000" in run("routes", "set", model, "v1=100")


def test_a_release_manager_rolls_out_and_back(capsys: pytest.CaptureFixture[str], service: Service) -> None:
    run = lambda *argv: done(sluice(capsys, service, *argv))  # noqa: E731
    prepare(capsys, service, "tiny")
    listing = rows(run("models", "list"), "MODEL")
    assert ["tiny", "2", "v1", "100%"] in [row[:4] for row in listing]
    shown = run("models", "show", "tiny")
    assert "Model tiny: the dev model" in shown and "Route: v1 100%" in shown
    assert [r[:3] for r in rows(shown, "VERSION")] == [["v1", "serving", "0"], ["v2", "warming", "0"]]
    assert json.loads(run("versions", "list", "tiny", "--json"))["versions"][0]["build_config"] == {
        "dtype": "bf16"
    }

    started = run("rollout", "start", "tiny", "v2", "--steps", "1,10,50,100", "--reason", "new weights")
    assert "v1 -> v2, canary at 1% now (step 1 of 4)" in started and "Route: v1 99%, v2 1%" in started
    assert "Guard: off" in started
    write_usage(
        service.settings,
        usage_rows("tiny", "v1", num_ok=99, num_failed=1, ttft_ms=120)
        + usage_rows("tiny", "v2", num_ok=2, ttft_ms=300),
    )
    status = run("rollout", "status", "tiny")
    assert "Rollout of tiny: v1 -> v2, running, step 1 of 4" in status
    assert "Steps: [1%] > 10% > 50% > 100%" in status and "Last move's reason: new weights" in status
    traffic = rows(status, "VERSION")
    assert traffic[0][:5] == ["v1", "stable", "100", "1", "1.00%"] and traffic[0][7:] == [
        "120",
        "ms",
        "20",
        "ms",
    ]
    assert traffic[1][:5] == ["v2", "canary", "2", "0", "0.00%"] and traffic[1][7:9] == ["300", "ms"]

    assert "running, step 2 of 4" in run("rollout", "advance", "tiny")
    assert "paused, step 2 of 4" in run("rollout", "pause", "tiny")
    code, _out, err = sluice(capsys, service, "rollout", "advance", "tiny")
    assert code == 1 and "400 invalid_change" in err and "resume it first" in err
    assert "running" in run("rollout", "resume", "tiny")
    back = run("rollout", "rollback", "tiny", "--reason", "p95 too high")
    assert "rolled_back, step 2 of 4" in back and "Route: v1 100%" in back
    status_json = json.loads(run("rollout", "status", "tiny", "--json"))
    assert (
        status_json["rollout"]["state"] == "rolled_back"
        and status_json["rollout"]["reason"] == "p95 too high"
    )
    assert rows(run("versions", "list", "tiny"), "VERSION")[1][:2] == ["v2", "draining"]
    assert "VERSION  SHARE  BASIS POINTS" in run("routes", "show", "tiny")


def test_the_guard_flags_and_a_model_name_with_a_slash(
    capsys: pytest.CaptureFixture[str], service: Service
) -> None:
    model = "org/guarded"
    prepare(capsys, service, model)
    out = done(
        sluice(capsys, service, "rollout", "start", model, "v2", "--steps", "5,100", "--min-requests", "7")
    )
    assert "Guard: on, every 30 s once each version has 7 requests" in out
    guard = json.loads(done(sluice(capsys, service, "rollout", "status", model, "--json")))["rollout"][
        "guard"
    ]
    assert guard == {
        "min_requests": 7,
        "max_error_rate_increase": 0.01,
        "max_ttft_p95_ratio": 1.5,
        "max_itl_p95_ratio": 1.5,
        "interval_s": 30.0,
    }


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["rollout", "start", "tiny", "v2", "--steps", "10,5"], "steps must increase"),
        (["rollout", "start", "tiny", "v2", "--steps", "1,10"], "last step must be 100"),
        (["rollout", "start", "tiny", "v2"], "--steps"),
        (["routes", "set", "tiny", "v1=abc"], "percentage"),
        (["routes", "set", "tiny", "v1=100", "--state", "v2=gone"], "state must be one of"),
        (
            ["versions", "add", "tiny", "v3", "--artifact-uri", "s3://m", "--weights-digest", "md5:1"],
            "weights_digest",
        ),
        (
            [
                "versions",
                "add",
                "tiny",
                "v3",
                "--artifact-uri",
                "s3://m",
                "--weights-digest",
                DIGEST,
                "--build-config",
                "[1]",
            ],
            "mapping",
        ),
        (["versions", "set-state", "tiny", "v1", "paused"], "invalid choice"),
        (["rollout", "jump", "tiny"], "invalid choice"),
    ],
)
def test_usage_errors_exit_2_before_any_call(
    capsys: pytest.CaptureFixture[str], argv: list[str], words: str
) -> None:
    get_settings.cache_clear()
    code = main([*argv, "--admin-url", "http://127.0.0.1:9", "--token", DEV_ADMIN_TOKEN])
    _out, err = capsys.readouterr()
    assert code == 2 and words in err and "Traceback" not in err, err


def test_refusals_and_an_unreachable_service_exit_1(
    capsys: pytest.CaptureFixture[str], service: Service
) -> None:
    viewer = make_tokens(load_settings(state_dir=service.settings.state_dir))[Role.VIEWER]
    code, _out, err = sluice(capsys, service, "models", "create", "nope", token=viewer)
    assert code == 1 and "403 insufficient_role" in err
    assert done(sluice(capsys, service, "models", "list", token=viewer))  # viewers read
    code, _out, err = sluice(capsys, service, "models", "show", "missing")
    assert code == 1 and "404 not_found" in err and "no model 'missing'" in err
    code, _out, err = sluice(capsys, service, "rollout", "rollback", "missing")
    assert code == 1 and "404" in err
    get_settings.cache_clear()
    code = main(
        ["models", "list", "--admin-url", f"http://127.0.0.1:{free_port()}", "--token", DEV_ADMIN_TOKEN]
    )
    _out, err = capsys.readouterr()
    assert code == 1 and "unreachable" in err
    code = main(["rollout", "status", "tiny", "--admin-url", service.url])  # no token
    _out, err = capsys.readouterr()
    assert code == 1 and "401 invalid_admin_token" in err
    assert "set SLUICE_ADMIN_TOKEN" in err  # what to do, said by the CLI
