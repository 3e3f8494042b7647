"""``sluice trtllm-smoke``: the check a platform team runs on its first GPU node, inside the NGC image
(``build_engines.trtllm_release.TRITON_IMAGE_REF`` with Sluice, e.g. the build-engine image) on one GPU:

    sluice trtllm-smoke                           # the dev checkpoint: build, serve, check, stop
    sluice trtllm-smoke --checkpoint ./llama-3.2-1b --max-input-len 4096 --max-seq-len 8192
    sluice trtllm-smoke --gateway http://gw:8080/v1 --api-key sk-... --model llama-8b --max-input-len 4096

builds a TensorRT-LLM engine of the checkpoint, renders the replica's repository, starts the image's
tritonserver and a gateway routing to it, and sends one greedy, one sampled, one stop-word, one cancelled
and one too-long request through the gateway (``control_plane.smoke``), printing pass or fail per check
with the TTFT and tokens/s it saw (``--json``: the same as one object). ``--gateway`` runs only the checks,
against any OpenAI-compatible gateway already serving the model.

Before anything is built, a node without an NVIDIA GPU, TensorRT-LLM of the pinned release, its
``examples/`` or the image's tritonserver with the TensorRT-LLM backend is refused with every reason.

Exit codes: 0 every check passed; 1 a check or a step failed; 2 a usage error, or this node cannot run it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from build_engines.checkpoint import CheckpointError
from build_engines.pipeline import BuildRefused
from build_engines.spec import BuildInputError
from build_engines.trtllm_release import EXAMPLES_DIR, TRITON_IMAGE_REF, TRTLLM_VERSION
from control_plane.cli.admin_commands import EXIT_FAILED, EXIT_OK, EXIT_USAGE, fail, positive_int
from control_plane.smoke.checks import CheckResult, SmokeTarget, run_checks
from control_plane.smoke.preconditions import node_problems
from control_plane.smoke.stack import SmokeError, SmokeOptions, engine_build, image_replica, run_smoke
from control_plane.table import render_table
from replicas.launcher import IMAGE_TRITON_ROOT, TritonLaunchError

HEADERS = ("check", "result", "TTFT ms", "tok/s", "tokens", "detail")


def render_results(results: Sequence[CheckResult]) -> str:
    """The table an operator reads, and a last line with the count that passed."""
    rows = [
        (
            r.name,
            "pass" if r.passed else "FAIL",
            _number(r.ttft_ms, "{:.1f}"),
            _number(r.tokens_per_s, "{:.1f}"),
            _number(r.num_output_tokens, "{}"),
            r.detail,
        )
        for r in results
    ]
    num_passed = sum(r.passed for r in results)
    return f"{render_table(HEADERS, rows)}\n{num_passed}/{len(results)} checks passed"


def _number(value: float | int | None, form: str) -> str:
    return "-" if value is None else form.format(value)


def _report(results: Sequence[CheckResult], as_json: bool, where: dict[str, str]) -> int:
    passed = bool(results) and all(r.passed for r in results)
    if as_json:
        print(json.dumps({"passed": passed, **where, "checks": [r.to_dict() for r in results]}, indent=2))
    else:
        print(render_results(results))
    return EXIT_OK if passed else EXIT_FAILED


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)  # progress on stderr: stdout is the table or the JSON


def _against_gateway(args: argparse.Namespace) -> int:
    missing = [
        f"--{n.replace('_', '-')}" for n in ("api_key", "model", "max_input_len") if not getattr(args, n)
    ]
    if missing:
        return fail(f"--gateway needs {', '.join(missing)}", EXIT_USAGE)
    target = SmokeTarget(
        base_url=args.gateway,
        api_key=args.api_key,
        model=args.model,
        max_input_len=args.max_input_len,
        replica_metrics_url=args.replica_metrics_url,
    )
    return _report(run_checks(target), args.json, {"gateway": args.gateway})


def _on_this_node(args: argparse.Namespace) -> int:
    options = SmokeOptions(
        work_dir=args.work_dir or Path(tempfile.gettempdir()),  # made below, once the node can run it
        checkpoint_dir=args.checkpoint,
        model=args.model or SmokeOptions.model,
        max_batch_size=args.max_batch_size,
        max_num_tokens=args.max_num_tokens,
        max_input_len=args.max_input_len or SmokeOptions.max_input_len,
        max_seq_len=args.max_seq_len,
        trtllm_examples=args.trtllm_examples,
        triton_root=args.triton_root,
    )
    try:
        spec = options.spec(args.checkpoint or options.work_dir / "checkpoint")
    except BuildInputError as exc:
        return fail(str(exc), EXIT_USAGE)
    problems = node_problems(spec, examples=options.trtllm_examples, triton_root=options.triton_root)
    if problems:
        print(
            f"sluice: error: this node cannot run the TensorRT-LLM smoke check (it needs {TRITON_IMAGE_REF} "
            "on an NVIDIA GPU); nothing was built or started:" + "".join(f"\n  - {p}" for p in problems),
            file=sys.stderr,
        )
        return EXIT_USAGE
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="sluice-smoke-"))
    options = dataclasses.replace(options, work_dir=work_dir)
    try:
        results = run_smoke(options, build=engine_build(options), replica=image_replica(options), say=_say)
    except BuildRefused as exc:
        return fail(str(exc), EXIT_USAGE)
    except (SmokeError, TritonLaunchError, CheckpointError, ValueError) as exc:
        return fail(f"{exc}\n(work folder kept: {work_dir})", EXIT_FAILED)
    except subprocess.CalledProcessError as exc:
        command = " ".join(map(str, exc.cmd))
        return fail(
            f"step failed: {command} exited with {exc.returncode} (work folder: {work_dir})", EXIT_FAILED
        )
    return _report(results, args.json, {"work_dir": str(work_dir)})


def _smoke(args: argparse.Namespace) -> int:
    if args.gateway:
        return _against_gateway(args)
    return _on_this_node(args)


def register(parser: argparse.ArgumentParser) -> None:
    """The options of ``sluice trtllm-smoke`` (one command, no subcommands)."""
    parser.add_argument(
        "--checkpoint",
        type=Path,
        default=None,
        help="a local Hugging Face checkpoint folder (default: the dev checkpoint, written into the "
        "work folder)",
    )
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=None,
        help="engine, repository, logs (default: a new temporary folder, kept)",
    )
    parser.add_argument(
        "--model", default=None, help=f"the model name to serve it as (default {SmokeOptions.model})"
    )
    parser.add_argument(
        "--max-batch-size", type=positive_int, default=SmokeOptions.max_batch_size, help="engine limit"
    )
    parser.add_argument(
        "--max-num-tokens", type=positive_int, default=SmokeOptions.max_num_tokens, help="engine limit"
    )
    parser.add_argument(
        "--max-input-len",
        type=positive_int,
        default=None,
        help=f"the engine's longest prompt (default {SmokeOptions.max_input_len}); with --gateway, the "
        "served engine's",
    )
    parser.add_argument(
        "--max-seq-len",
        type=positive_int,
        default=SmokeOptions.max_seq_len,
        help="engine limit: prompt + output",
    )
    parser.add_argument(
        "--trtllm-examples",
        type=Path,
        default=EXAMPLES_DIR,
        help=f"TensorRT-LLM {TRTLLM_VERSION}'s examples/ folder (default {EXAMPLES_DIR}, the build-engine "
        "image's)",
    )
    parser.add_argument(
        "--triton-root",
        type=Path,
        default=IMAGE_TRITON_ROOT,
        help=f"the image's Triton install (default {IMAGE_TRITON_ROOT})",
    )
    parser.add_argument(
        "--gateway", default=None, help="only run the checks, against this OpenAI base URL (…/v1)"
    )
    parser.add_argument("--api-key", default=None, help="--gateway: a tenant's API key")
    parser.add_argument(
        "--replica-metrics-url", default=None, help="--gateway: the replica's Triton /metrics (optional)"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    parser.set_defaults(handler=_smoke)
