"""Settings: defaults for the embedded dev set-up, derived paths, range checks, unknown names refused."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice.settings import Settings, SettingsError, env_names, get_settings, load_settings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No SLUICE_* variable from the caller's shell leaks in; get_settings() reads afresh."""
    for name in list(os.environ):
        if name.upper().startswith("SLUICE_"):
            monkeypatch.delenv(name)
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def test_defaults_are_the_embedded_dev_setup() -> None:
    s = get_settings()
    assert s.state_dir == Path(".sluice")
    assert s.database_url is None and s.sqlite_path == Path(".sluice/sluice.db")
    assert s.redis_url is None
    assert (s.gateway_host, s.gateway_port) == ("127.0.0.1", 8080)
    assert s.engine_client == "triton"
    assert s.triton_grpc_url == "127.0.0.1:8001"
    assert s.triton_metrics_url == "http://127.0.0.1:8002/metrics"
    assert s.model_name == "sluice-tiny"
    assert s.checkpoint_dir == Path(".sluice/models/sluice-tiny")
    assert s.telemetry_path == Path(".sluice/telemetry.jsonl")
    assert (s.max_prompt_tokens, s.max_output_tokens, s.default_max_tokens) == (1536, 512, None)
    assert s.request_deadline_s == 60.0 and s.max_body_bytes == 1024 * 1024
    assert s.tenant_cache_ttl_s == 5.0
    assert s.dev_tenants is False  # keys anyone can read in the source: only when asked for (make run)
    assert (s.client_write_timeout_s, s.client_header_timeout_s, s.keep_alive_timeout_s) == (30.0, 10.0, 5)
    assert s.client_send_buffer_bytes == 64 * 1024 and s.max_connections == 512
    assert s.telemetry_max_bytes == 64 * 1024 * 1024 and s.telemetry_num_backups == 3


def test_read_once_and_cached() -> None:
    assert get_settings() is get_settings()


def test_environment_overrides_and_derived_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICE_STATE_DIR", "/srv/sluice")
    monkeypatch.setenv("SLUICE_GATEWAY_PORT", "9090")
    monkeypatch.setenv("SLUICE_ENGINE_CLIENT", "inprocess")
    monkeypatch.setenv("SLUICE_DEV_TENANTS", "false")
    monkeypatch.setenv("SLUICE_DATABASE_URL", "postgresql://sluice@db:5432/sluice")
    s = get_settings()
    assert s.gateway_port == 9090 and s.engine_client == "inprocess" and s.dev_tenants is False
    assert s.checkpoint_dir == Path("/srv/sluice/models/sluice-tiny")
    assert s.telemetry_path == Path("/srv/sluice/telemetry.jsonl")
    assert s.sqlite_path == Path("/srv/sluice/sluice.db")
    assert s.database_url == "postgresql://sluice@db:5432/sluice"
    # An explicit path wins over the derived one.
    monkeypatch.setenv("SLUICE_CHECKPOINT_DIR", "/models/x")
    assert load_settings().checkpoint_dir == Path("/models/x")


def test_an_unknown_sluice_variable_fails_naming_it_and_the_valid_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SLUICE_GATEWAY_PROT", "9090")
    with pytest.raises(SettingsError) as exc:
        get_settings()
    message = str(exc.value)
    assert "SLUICE_GATEWAY_PROT" in message
    assert all(name in message for name in env_names())
    assert "SLUICE_GATEWAY_PORT" in env_names()
    with pytest.raises(SettingsError):
        Settings()  # constructing directly checks too


@pytest.mark.parametrize(
    ("name", "value", "fragment"),
    [
        ("SLUICE_GATEWAY_PORT", "70000", "less than or equal to 65535"),
        ("SLUICE_GATEWAY_PORT", "http", "valid integer"),
        ("SLUICE_MAX_PROMPT_TOKENS", "0", "greater than or equal to 1"),
        ("SLUICE_REQUEST_DEADLINE_S", "0", "greater than 0"),
        ("SLUICE_TENANT_CACHE_TTL_S", "-1", "greater than or equal to 0"),
        ("SLUICE_ENGINE_CLIENT", "vllm", "'triton' or 'inprocess'"),
        ("SLUICE_DATABASE_URL", "mysql://x", "PostgreSQL URL"),
        ("SLUICE_REDIS_URL", "localhost:6379", "redis://"),
        ("SLUICE_TRITON_GRPC_URL", "grpc://127.0.0.1:8001", "host:port"),
        ("SLUICE_TRITON_METRICS_URL", "127.0.0.1:8002", "http"),
        ("SLUICE_MODEL_NAME", "no spaces", "letters and digits"),
        ("SLUICE_MAX_BODY_BYTES", "10", "greater than or equal to 1024"),
        ("SLUICE_CLIENT_WRITE_TIMEOUT_S", "0", "greater than 0"),
        ("SLUICE_CLIENT_SEND_BUFFER_BYTES", "100", "greater than or equal to 4096"),
        ("SLUICE_MAX_CONNECTIONS", "0", "greater than or equal to 1"),
        ("SLUICE_TELEMETRY_MAX_BYTES", "1", "greater than or equal to 4096"),
    ],
)
def test_out_of_range_values_fail_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, fragment: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError) as exc:
        get_settings()
    assert name in str(exc.value) and fragment in str(exc.value)


def test_engine_dtype_is_auto_unless_set_and_an_unknown_one_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert get_settings().engine_dtype == "auto"
    monkeypatch.setenv("SLUICE_ENGINE_DTYPE", "float32")
    get_settings.cache_clear()
    assert get_settings().engine_dtype == "float32"
    monkeypatch.setenv("SLUICE_ENGINE_DTYPE", "fp16")
    get_settings.cache_clear()
    with pytest.raises(SettingsError) as exc:
        get_settings()
    assert "SLUICE_ENGINE_DTYPE='fp16'" in str(exc.value)
    assert "'auto', 'float32' or 'bfloat16'" in str(exc.value)


def test_default_max_tokens_must_fit_max_output_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICE_DEFAULT_MAX_TOKENS", "600")
    with pytest.raises(SettingsError, match="default_max_tokens"):
        get_settings()
    monkeypatch.setenv("SLUICE_MAX_OUTPUT_TOKENS", "1024")
    assert get_settings().default_max_tokens == 600


@pytest.mark.parametrize(
    ("name", "value", "shown"),
    [
        ("SLUICE_DATABASE_URL", "mysql://sluice:hunter2@db:3306/x", "mysql://sluice:***@db:3306/x"),
        # A raw "@" or "/" in the password does not end the redaction early.
        ("SLUICE_DATABASE_URL", "mysql://sluice:hun@ter/2@db/x", "mysql://sluice:***@db/x"),
        ("SLUICE_DATABASE_URL", "host=db password=hunter2", "host=db password=***"),
        ("SLUICE_REDIS_URL", "http://:hunter2@cache:6379/0", "http://:***@cache:6379/0"),
    ],
)
def test_a_settings_error_never_echoes_a_password(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, shown: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError) as exc:
        get_settings()
    message = str(exc.value)
    assert name in message and shown in message
    assert "hunter2" not in message and "hun@ter" not in message


def test_a_model_level_error_redacts_the_urls_among_the_values_it_shows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SLUICE_DATABASE_URL", "postgresql://sluice:hunter2@db/sluice")
    monkeypatch.setenv("SLUICE_REDIS_URL", "redis://:hunter2@cache:6379/0")
    monkeypatch.setenv("SLUICE_DEFAULT_MAX_TOKENS", "600")  # over max_output_tokens: a model-level error
    with pytest.raises(SettingsError) as exc:
        get_settings()
    message = str(exc.value)
    assert "default_max_tokens" in message and "hunter2" not in message
    assert "postgresql://sluice:***@db/sluice" in message and "redis://:***@cache:6379/0" in message


def test_the_control_plane_has_a_host_and_port_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    s = get_settings()
    assert (s.control_plane_host, s.control_plane_port) == ("127.0.0.1", 8090)
    monkeypatch.setenv("SLUICE_CONTROL_PLANE_HOST", "0.0.0.0")
    monkeypatch.setenv("SLUICE_CONTROL_PLANE_PORT", "9191")
    s = load_settings()
    assert (s.control_plane_host, s.control_plane_port) == ("0.0.0.0", 9191)
    assert {"SLUICE_CONTROL_PLANE_HOST", "SLUICE_CONTROL_PLANE_PORT"} <= set(env_names())
    for value, fragment in [("0", "greater than or equal to 1"), ("65536", "less than or equal to 65535")]:
        monkeypatch.setenv("SLUICE_CONTROL_PLANE_PORT", value)
        with pytest.raises(SettingsError) as exc:
            load_settings()
        assert "SLUICE_CONTROL_PLANE_PORT" in str(exc.value) and fragment in str(exc.value)
    # The gateway's port is the client API's: the admin API never shares it.
    monkeypatch.setenv("SLUICE_CONTROL_PLANE_PORT", "8080")
    with pytest.raises(SettingsError, match="control_plane_port \\(8080\\) must differ from gateway_port"):
        load_settings()
    monkeypatch.setenv("SLUICE_GATEWAY_PORT", "8081")
    assert load_settings().control_plane_port == 8080


def test_static_build_config_carries_the_replicas_target_and_engine_limits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    limits = {"max_input_len": 512, "max_seq_len": 1024, "max_batch_size": 8, "max_num_tokens": 2048}
    monkeypatch.setenv(
        "SLUICE_STATIC_BUILD_CONFIG", json.dumps({"target": "trtllm", "engine_limits": limits})
    )
    assert load_settings().static_build == {"target": "trtllm", "engine_limits": limits}
    monkeypatch.delenv("SLUICE_STATIC_BUILD_CONFIG")
    assert load_settings().static_build == {}  # unset: a CPU engine replica


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("{not json", "not valid JSON"),
        ('["trtllm"]', "must be a JSON object"),
        ('{"target": "tpu"}', "unknown build target 'tpu'"),
        ('{"target": "trtllm-llmapi"}', "cannot be served"),
        ('{"target": "trtllm", "engine_limits": {"max_input_len": 0}}', "max_input_len must be a positive"),
    ],
)
def test_a_bad_static_build_config_fails_at_start(
    monkeypatch: pytest.MonkeyPatch, value: str, fragment: str
) -> None:
    monkeypatch.setenv("SLUICE_STATIC_BUILD_CONFIG", value)
    with pytest.raises(SettingsError) as exc:
        load_settings()
    assert "SLUICE_STATIC_BUILD_CONFIG" in str(exc.value) and fragment in str(exc.value)


def test_static_build_config_is_for_static_routing_to_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICE_STATIC_BUILD_CONFIG", '{"target": "trtllm"}')
    monkeypatch.setenv("SLUICE_ROUTING", "registry")
    with pytest.raises(SettingsError, match="needs routing 'static' and engine_client 'triton'"):
        load_settings()
