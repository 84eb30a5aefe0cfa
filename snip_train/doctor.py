"""`snip doctor`: on a GPU machine, run every compiled kernel against the PyTorch reference and time it.

Builds nothing. For each kernel compiled for this GPU: its self-check (`snip_ops.self_check`: small
and odd shapes; quantization bit for bit, GEMMs within 2^-7 of |a| |b|^T), a large-shape check of the
same kind, for the Hopper FP8 GEMM which model of the tensor core's accumulation it follows
(snip_ops.tensor_core_model), and a time against what it replaces -- torch.matmul in BF16 for the
GEMMs (and torch._scaled_mm with row-wise scales for the FP8 one), a BF16 copy of the same tensor for
the quantizer, each the GPU's time per call (snip_train.cuda_timer). Prints a table and writes
`<results>/<device>-doctor.json`. Without a GPU it says so and exits 0.
"""

from __future__ import annotations

import base64
import json
import re
import sys
import time
import traceback
from pathlib import Path
from typing import Callable

import numpy as np
import torch

__all__ = ["accumulator_probe_operands", "doctor", "probe_outputs"]

_LARGE = 4096


_TIMING = "GPU time per call: CUDA events, the L2 flushed before each call, median of 20 after 3 warm-up calls"


def _time(fn: Callable[[], object]) -> float:
    """Median GPU seconds of fn(), as _TIMING says."""
    from snip_train.cuda_timer import CudaTimer

    return CudaTimer(warmup=3, iters=20)(fn)


def _large_quantize(device: torch.device) -> dict:
    from snip_ops import self_check
    from snip_ops.formats import QuantSpec
    from snip_ops.quantize import quantize

    self_check.quantize_case(device, "e4m3/1x128/fp32/rne", torch.bfloat16, _LARGE, _LARGE)
    spec = QuantSpec.parse("e4m3/1x128/fp32/rne")
    x = torch.randn(_LARGE, _LARGE, device=device, dtype=torch.bfloat16)
    return {"large_shape": "exact", "time_s": _time(lambda: quantize(x, spec)),
            "baseline": "bf16 copy of the input", "baseline_s": _time(lambda: x.clone())}


def _large_gemm(kernel: str, device: torch.device) -> dict:
    from snip_ops import gemm_kernels, self_check
    from snip_ops.formats import recipe
    from snip_ops.quantize import quantize

    self_check.gemm_case(device, kernel, _LARGE, _LARGE, _LARGE)
    path, name = self_check.GEMM_KERNELS[kernel]
    # The GEMM that runs this kernel: the E5M2 kernels multiply fp8_e5m2grad's gradients (dgrad);
    # operands quantized as training quantizes them (scale layout included).
    gemm = "dgrad" if "e5m2" in kernel else "fprop"
    a_spec, b_spec = gemm_kernels.gemm_operand_specs(recipe(name), gemm)
    x, w = (torch.randn(_LARGE, _LARGE, device=device, dtype=torch.bfloat16) for _ in range(2))
    a = quantize(x, a_spec, scale_layout=gemm_kernels.scale_layout_for(a_spec, device))
    b = quantize(w, b_spec, transpose=gemm == "dgrad", scale_layout=gemm_kernels.scale_layout_for(b_spec, device))
    out = {"gemm": f"{name} {gemm}", "large_shape": "within bound",
           "time_s": _time(lambda: gemm_kernels.qgemm(a, b, path=path)),
           "baseline": "torch.matmul bf16", "baseline_s": _time(lambda: x @ w.t())}
    if path in ("sm90_fp8", "sm100_fp8") and gemm == "fprop":  # torch's row-wise scaled GEMM takes E4M3
        ca, cb = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
        sa, sb = torch.ones(_LARGE, 1, device=device), torch.ones(1, _LARGE, device=device)
        out["scaled_mm_rowwise_s"] = _time(lambda: torch._scaled_mm(ca, cb.t(), sa, sb, out_dtype=torch.bfloat16))
    return out


def accumulator_probe_operands(device: torch.device):
    """The probe's operands (FP8 QTensors a [128, 512], b [128, 512]): magnitudes spread over 13
    binades along K, so that aligning addends to the largest one shows. Seeded on the CPU, so the
    quantized operands are the same on any device (the quantizer is exact); a model of the
    accumulation can be fitted to a recorded probe later, on the CPU, from these and its `outputs`."""
    from snip_ops.formats import recipe
    from snip_ops.quantize import quantize

    g = torch.Generator().manual_seed(0)
    m, n, k = 128, 128, 512
    x = torch.randn(m, k, generator=g) * torch.exp2(torch.randint(-6, 7, (1, k), generator=g).float())
    w = torch.randn(n, k, generator=g)
    r = recipe("fp8")
    return quantize(x.to(device), r.act), quantize(w.to(device), r.weight)


def probe_outputs(probe: dict) -> torch.Tensor:
    """A recorded probe's kernel result, [M, N] float32, bit for bit."""
    m, n, _ = probe["shape"]
    values = np.frombuffer(base64.b64decode(probe["outputs"]), dtype="<f4").astype(np.float32)
    return torch.from_numpy(values.reshape(m, n))


def _accumulator_probe(device: torch.device) -> dict:
    """How the FP8 tensor core sums inside the kernel, which no document says: one fprop GEMM
    (accumulator_probe_operands) reproduced bit for bit by which of snip_ops.tensor_core_model's
    models, its largest error relative to |a| |b|^T (what the GEMM tests' bound, tests/bounds.py,
    must cover), and its outputs (float32 bytes, little-endian, base64; probe_outputs reads them)."""
    from snip_ops import gemm_kernels
    from snip_ops.tensor_core_model import kernel_operands, matching_models

    a, b = accumulator_probe_operands(device)
    y = gemm_kernels.qgemm(a, b, out_dtype=torch.float32, path="sm90_fp8")
    matches = matching_models(y, *kernel_operands(a, b))
    best = max(matches.values())
    da, db = a.dequantize().cpu().double(), b.dequantize().cpu().double()
    err = (y.cpu().double() - da @ db.t()).abs() / (da.abs() @ db.abs().t())
    outputs = base64.b64encode(y.detach().cpu().numpy().astype("<f4").tobytes()).decode()
    return {"shape": [a.shape[0], b.shape[0], a.shape[1]], "best_models": [name for name, f in matches.items() if f == best],
            "best_match": best, "matches": matches, "max_error_over_abs_product": float(err.max()),
            "outputs": outputs}


def _check(kernel: str, device: torch.device) -> dict:
    from snip_ops import self_check

    row: dict = {"kernel": kernel}
    try:
        t = time.perf_counter()
        self_check.CHECKS[kernel](device)
        row["self_check"] = "pass"
        row["self_check_s"] = time.perf_counter() - t
        if kernel == "quantize":
            row.update(_large_quantize(device))
        elif kernel in self_check.GEMM_KERNELS:
            row.update(_large_gemm(kernel, device))
        if kernel == "fp8_gemm_nt_blockwise":
            row["accumulator"] = _accumulator_probe(device)
    except Exception as e:  # a wrong answer or a failing launch: reported, never hidden
        row["self_check"] = row.get("self_check", "FAIL")
        row["error"] = f"{type(e).__name__}: {e}"
        row["traceback"] = traceback.format_exc()
    return row


def doctor(results: Path) -> int:
    """Run the checks and timings; 0 when every kernel passed (or there is no GPU), else 1."""
    from snip_ops import _ext

    if not torch.cuda.is_available():
        print("snip doctor: no CUDA GPU here (torch.cuda.is_available() is False): nothing to check. The kernels "
              "are compiled for sm_90a (H100/H200) and sm_100a (B200/GB200); on this machine snip runs the "
              "exact emulated path.")
        return 0
    device = torch.device("cuda", torch.cuda.current_device())
    info = _ext.build_info()
    arch = info.get("device_arch")
    kernels = sorted(k for k, archs in info["kernels"].items() if arch in archs)
    print(f"snip doctor: {info['device']} ({arch}); extension: {info['extension_error'] or 'loaded'}; "
          f"kernels for this GPU: {', '.join(kernels) or 'none'}", flush=True)
    rows = [_check(k, device) for k in kernels]
    print(f"{'kernel':24} {'self-check':10} {'large shape':12} {'time':>10} {'baseline':>10}  baseline")
    for r in rows:
        ms = (lambda key: f"{1e3 * r[key]:8.3f}ms" if key in r else f"{'-':>10}")
        print(f"{r['kernel']:24} {r['self_check']:10} {r.get('large_shape', '-'):12} "
              f"{ms('time_s')} {ms('baseline_s')}  {r.get('baseline', '')}")
        if "accumulator" in r:
            acc = r["accumulator"]
            print(f"    FP8 accumulator: {', '.join(acc['best_models'])} reproduce {100 * acc['best_match']:.1f}% of "
                  f"the outputs bit for bit; largest error {acc['max_error_over_abs_product']:.2e} |a| |b|^T")
        if "error" in r:
            print(f"    {r['error']}", file=sys.stderr)
    slug = re.sub(r"[^a-z0-9]+", "-", info["device"].lower()).strip("-")
    results.mkdir(parents=True, exist_ok=True)
    path = results / f"{slug}-doctor.json"
    path.write_text(json.dumps({"device": info["device"], "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                                "command": "snip doctor", "build": info, "timing": _TIMING, "kernels": rows}, indent=1, default=str))
    print(f"wrote {path}")
    failed = [r for r in rows if r["self_check"] != "pass" or "error" in r]
    return 1 if failed else 0
