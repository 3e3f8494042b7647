"""The engine's number format, chosen from what this CPU can do (``EngineConfig.dtype = "auto"``).

bf16 pays only where the CPU multiplies bf16 pairs in hardware (AVX-512 BF16's vdpbf16ps; CPUs with
AMX-BF16 have it too) AND the linear kernel was compiled to use it (cpu_engine/csrc/linear_bf16.c is
built with -march=native; ``_linear.simd`` says which path it has). Elsewhere the kernel's portable bf16
path is slower than numpy/BLAS float32: 1,098 against 1,686 tokens/s at 32 streams on an AMD EPYC
without AVX-512 (issue 10). So "auto" means bfloat16 where both hold, float32 otherwise.

The KV cache's format is chosen apart (``choose_kv_cache_dtype``): "auto" stores keys and values as bf16
on every CPU, as attention over long contexts is bound by the bytes it reads, and widening bf16 to
float32 is a shift, with or without bf16 instructions. On an AMD EPYC without AVX-512 (float32 linear
layers), the engine alone made 14-16% more tokens/s with a bf16 cache on 1,000-token prompts at 16
streams and 5-9% more on 128-token prompts at 8 and 32 streams (issue 22). A float32 ``dtype`` set
explicitly asks for the reference numerics, so "auto" then keeps the cache float32 too.

``choose_dtype`` is the pure decision (what was asked, the CPU's flags and the kernel's build in; a
``DTypeChoice`` out) and is what the tests drive with fake flag sets. ``detect_dtype`` applies it to this
machine: the flags from /proc/cpuinfo, the kernel's build from the extension.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from cpu_engine.config import DTYPE_SETTINGS, DTypeSetting, LinearDType, check_dtype_setting

# Either flag means the CPU has vdpbf16ps (every AMX-BF16 CPU also has AVX-512 BF16).
BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
# The flags worth reporting (in logs and as a metric label, so a bounded set): those the kernels and
# this choice depend on, in this order.
REPORTED_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_bf16", "amx_tile", "amx_bf16")
# The bf16 kernel's names when it was compiled for the CPU's bf16 instructions: ``_linear.tiles`` where it
# multiplies with AMX tiles, else ``_linear.simd`` ("portable" when neither).
NATIVE_BF16_KERNELS = ("amx_bf16", "avx512_bf16")
CPUINFO_PATH = Path("/proc/cpuinfo")

__all__ = [
    "DTYPE_SETTINGS",
    "DTypeChoice",
    "choose_dtype",
    "choose_kv_cache_dtype",
    "detect_dtype",
    "parse_cpuinfo_flags",
]


@dataclass(frozen=True)
class DTypeChoice:
    """The dtypes the engine runs in (linear layers, KV cache), what was asked for, and what the choice
    was based on."""

    dtype: LinearDType
    requested: DTypeSetting
    cpu_flags: tuple[str, ...] | None  # the REPORTED_FLAGS the CPU has; None: its flags are unknown
    bf16_kernel: str  # what the bf16 kernel multiplies with: "amx_bf16", "avx512_bf16" or "portable"
    reason: str
    kv_cache_dtype: LinearDType
    kv_cache_requested: DTypeSetting

    @property
    def cpu_flags_label(self) -> str:
        """The reported flags as one space-separated string ("none" or "unknown" when there are none)."""
        if self.cpu_flags is None:
            return "unknown"
        return " ".join(self.cpu_flags) or "none"

    def describe(self) -> str:
        """One readable line for the start-up log."""
        return (
            f"engine dtype {self.dtype} (requested {self.requested}): {self.reason}; KV cache "
            f"{self.kv_cache_dtype} (requested {self.kv_cache_requested}); "
            f"CPU flags: {self.cpu_flags_label}; bf16 kernel: {self.bf16_kernel}"
        )

    def metric_labels(self) -> dict[str, str]:
        """Labels of the ``sluice_engine_info`` gauge."""
        return {
            "dtype": self.dtype,
            "requested_dtype": self.requested,
            "kv_cache_dtype": self.kv_cache_dtype,
            "cpu_flags": self.cpu_flags_label,
            "bf16_kernel": self.bf16_kernel,
        }


def choose_kv_cache_dtype(kv_cache_requested: str, requested: str) -> LinearDType:
    """The KV cache's dtype for ``kv_cache_requested`` when the linear layers' setting is ``requested``:
    an explicit one wins; "auto" is float32 only where ``requested`` is float32 (the reference numerics,
    asked for by name), bfloat16 elsewhere (the module docstring says why). Pure."""
    setting = check_dtype_setting(kv_cache_requested, "kv_cache_dtype")
    if setting != "auto":
        return setting
    return "float32" if check_dtype_setting(requested) == "float32" else "bfloat16"


def choose_dtype(
    requested: str, cpu_flags: Iterable[str] | None, bf16_kernel: str, kv_cache_requested: str = "auto"
) -> DTypeChoice:
    """The dtype for ``requested`` ("auto", "float32" or "bfloat16") on a CPU with ``cpu_flags`` (None:
    unknown) and a bf16 kernel compiled as ``bf16_kernel``, and the KV cache's for ``kv_cache_requested``
    (``choose_kv_cache_dtype``). An explicit dtype always wins; "auto" is bfloat16 only where the CPU has
    AVX-512 BF16 or AMX-BF16 and the kernel was compiled to use it. An unknown setting raises ValueError.
    Pure: no I/O.
    """
    setting = check_dtype_setting(requested)
    flags = None if cpu_flags is None else frozenset(cpu_flags)
    reported = None if flags is None else tuple(f for f in REPORTED_FLAGS if f in flags)
    native = bf16_kernel in NATIVE_BF16_KERNELS
    dtype: LinearDType
    if setting != "auto":
        dtype, reason = setting, "set explicitly"
    elif flags is None:
        # No flag list (not Linux): the kernel is compiled with -march=native, so a native bf16 kernel
        # means the machine that built it (normally this one) has AVX-512 BF16.
        dtype = "bfloat16" if native else "float32"
        reason = f"CPU flags unknown; the bf16 kernel was built {'for' if native else 'without'} AVX-512 BF16"
    elif not flags & BF16_FLAGS:
        dtype, reason = "float32", "the CPU has neither AVX-512 BF16 nor AMX-BF16"
    elif not native:
        dtype = "float32"
        reason = "the CPU has bf16 instructions but the bf16 kernel was built without them (rebuild it here)"
    else:
        dtype, reason = "bfloat16", "the CPU has bf16 instructions and the kernel uses them"
    kv_setting = check_dtype_setting(kv_cache_requested, "kv_cache_dtype")
    kv_dtype = choose_kv_cache_dtype(kv_setting, setting)
    return DTypeChoice(dtype, setting, reported, bf16_kernel, reason, kv_dtype, kv_setting)


def parse_cpuinfo_flags(text: str) -> frozenset[str] | None:
    """The flags of the first processor in /proc/cpuinfo's text ("flags" on x86, "Features" on Arm);
    None if there is no such line."""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return None


def read_cpu_flags(path: Path = CPUINFO_PATH) -> frozenset[str] | None:
    """This CPU's flags, or None where /proc/cpuinfo cannot be read or lists none."""
    try:
        return parse_cpuinfo_flags(path.read_text())
    except OSError:
        return None


@lru_cache(maxsize=4)
def detect_dtype(requested: str = "auto", kv_cache_requested: str = "auto") -> DTypeChoice:
    """``choose_dtype`` on this machine (read once per process and request)."""
    from cpu_engine.native import linear_ext  # NOTE: here, so that importing this module loads no kernels

    return choose_dtype(requested, read_cpu_flags(), linear_ext.tiles or linear_ext.simd, kv_cache_requested)
