"""``sluice trtllm-smoke``, the first-GPU-node check. This machine has no GPU, no TensorRT-LLM and no NGC
image, so: the refusal is tested as it is (every missing piece named, exit 2, nothing built); and the
orchestration runs for real with two named fakes in place of what needs a GPU: the FAKE TensorRT-LLM
tools (tests/fake_trtllm_tools.py) under the real ``build_local``, and a FAKE replica, the pytriton
wheel's real tritonserver serving the rendered ``tensorrt_llm`` config with a fake python model behind it
(tests/engine_client/fake_trtllm_model.py). Render, gateway (static routing with the trtllm dialect and
engine limits), the five checks through the official openai client, and the stop in one ``finally`` are
the real code. It shows the path around TensorRT-LLM, not that TensorRT-LLM serves (docs/operations.md).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from fake_trtllm_tools import install_fake_tensorrt_llm

from build_engines.spec import BuildSpec
from control_plane.cli.main import main
from control_plane.cli.trtllm_smoke import render_results
from control_plane.smoke.checks import CheckResult, stop_string_in
from control_plane.smoke.preconditions import node_problems
from control_plane.smoke.stack import SmokeOptions, engine_build, replica_config, run_smoke
from replicas.launcher import TritonServer

FAKE_MODEL = Path(__file__).parents[1] / "engine_client" / "fake_trtllm_model.py"
CHECKS = ["greedy", "sampled", "stop-word", "cancelled", "too-long"]


def _fake_triton_root(tmp_path: Path, with_backend: bool = True) -> Path:
    root = tmp_path / "tritonserver"
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "tritonserver").write_text("#!/bin/sh\nexit 1\n")
    if with_backend:
        (root / "backends" / "tensorrtllm").mkdir(parents=True)
    return root


def _spec(checkpoint: Path) -> BuildSpec:
    return SmokeOptions(work_dir=Path("unused")).spec(checkpoint)


def test_a_node_without_gpu_tensorrt_llm_or_the_image_is_refused_with_every_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi, whatever this machine has
    code = main(["trtllm-smoke", "--work-dir", str(tmp_path / "work")])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert "cannot run the TensorRT-LLM smoke check" in err and "nothing was built or started" in err
    for reason in (
        "no GPU: nvidia-smi is not on PATH",
        "tensorrt_llm is not importable",
        "no tritonserver at /opt/tritonserver/bin/tritonserver",
        "convert_checkpoint.py does not exist",
    ):
        assert reason in err
    assert not (tmp_path / "work").exists()


def test_preconditions_name_a_wrong_tensorrt_llm_and_a_triton_without_its_backend(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dev_checkpoint: Path
) -> None:
    examples = install_fake_tensorrt_llm(tmp_path, monkeypatch, trtllm_version="1.1.0")
    root = _fake_triton_root(tmp_path, with_backend=False)
    problems = node_problems(_spec(dev_checkpoint), examples=examples, triton_root=root)
    assert len(problems) == 2, problems
    assert "tensorrt_llm 1.1.0 is installed, but Sluice builds and serves with 1.2.0" in problems[0]
    assert "has no TensorRT-LLM backend" in problems[1]


def test_a_node_with_everything_passes_the_preconditions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dev_checkpoint: Path
) -> None:
    examples = install_fake_tensorrt_llm(tmp_path, monkeypatch)
    root = _fake_triton_root(tmp_path)
    assert node_problems(_spec(dev_checkpoint), examples=examples, triton_root=root) == []


def test_the_stop_string_comes_from_the_greedy_text_after_its_first_character() -> None:
    assert stop_string_in("(5,(5,(5,") == ("5,(", "(")
    assert stop_string_in("aaaab") == ("aab", "aa")  # "aaa" first occurs at 0: not a later stop
    assert stop_string_in("  x") is None and stop_string_in("ab") is None


def fake_trtllm_replica(repository: Path, build_config: Mapping[str, Any], state_dir: Path) -> TritonServer:
    """The FAKE replica: the rendered tensorrt_llm model with its backend swapped to python and the fake
    model behind it, on the pytriton wheel's tritonserver (the real one is the image's, on a GPU)."""
    model_dir = next(p.parent for p in repository.glob("*/config.pbtxt"))
    config = (model_dir / "config.pbtxt").read_text()
    assert 'backend: "tensorrtllm"' in config
    (model_dir / "config.pbtxt").write_text(config.replace('backend: "tensorrtllm"', 'backend: "python"'))
    shutil.copy(FAKE_MODEL, model_dir / SmokeOptions.version / "model.py")
    return TritonServer(replica_config(repository, state_dir, ready_timeout_s=60))


def test_the_smoke_check_builds_serves_and_passes_every_check_through_a_real_gateway(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dev_checkpoint: Path
) -> None:
    examples = install_fake_tensorrt_llm(tmp_path, monkeypatch)
    # A stream long enough to be cancelled mid-way (the fake model waits before each token).
    monkeypatch.setenv("FAKE_TRTLLM_TOKEN_DELAY_S", "0.005")
    options = SmokeOptions(
        work_dir=tmp_path / "work", checkpoint_dir=dev_checkpoint, trtllm_examples=examples
    )
    progress: list[str] = []
    results = run_smoke(
        options, build=engine_build(options), replica=fake_trtllm_replica, say=progress.append
    )

    assert [r.name for r in results] == CHECKS
    assert all(r.passed for r in results), "\n" + render_results(results)
    by_name = {r.name: r for r in results}
    assert by_name["greedy"].num_output_tokens == 48 and by_name["greedy"].ttft_ms is not None
    assert by_name["greedy"].tokens_per_s is not None and by_name["greedy"].tokens_per_s > 0
    assert "gateway counted it cancelled" in by_name["cancelled"].detail
    # The engine's own limit (the fake trtllm-build's config.json), not the gateway's, refused it.
    assert "maximum prompt length is 1024 tokens" in by_name["too-long"].detail
    assert any(line.startswith("[4/8] build") for line in progress)
    assert progress[-1].startswith("stopped the gateway and tritonserver")
    log = (tmp_path / "work" / "gateway" / "gateway.log").read_text()
    assert '"target": "trtllm"' in log  # the start-up line names the static build config
    table = render_results(results)
    assert table.splitlines()[0].split() == ["check", "result", "TTFT", "ms", "tok/s", "tokens", "detail"]
    assert table.endswith("5/5 checks passed")


def test_the_checks_against_an_unreachable_gateway_fail_each_with_the_reason(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["trtllm-smoke", "--gateway", "http://127.0.0.1:9/v1", "--api-key", "sk-x", "--model", "m"]
    assert main([*argv, "--max-input-len", "16", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] is False and [c["name"] for c in report["checks"]] == CHECKS
    assert all(
        not c["passed"] and "Connection" in c["detail"] for c in report["checks"] if c["name"] != "stop-word"
    )
    assert main(argv) == 2  # --gateway without --max-input-len
    assert "--gateway needs --max-input-len" in capsys.readouterr().err


def test_results_render_as_a_table_with_a_dash_for_what_was_not_measured() -> None:
    table = render_results([CheckResult("too-long", False, "500 instead of 400", None, None, None)])
    assert table.splitlines()[1].split() == ["too-long", "FAIL", "-", "-", "-", "500", "instead", "of", "400"]
    assert table.endswith("0/1 checks passed")
