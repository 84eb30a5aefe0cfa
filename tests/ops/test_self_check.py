"""Kernels are used only after their self-check (snip_ops.self_check): a failing kernel is reported
once and not used; the checks' own code runs here against the CPU paths (the GPU test runs them
against the kernels)."""

import warnings

import pytest
import torch

from snip_ops import _ext, self_check


@pytest.fixture
def fresh(monkeypatch):
    """An empty result cache (and the switch restored) for each test."""
    monkeypatch.setattr(self_check, "_results", {})
    monkeypatch.setattr(self_check, "_enabled", True)


def _failing(device):
    raise AssertionError("codes of e4m3/1x128/fp32/rne [37, 300]: differs from the reference")


def test_a_failing_kernel_is_reported_once_and_not_used(monkeypatch, fresh):
    monkeypatch.setattr(self_check, "CHECKS", {"quantize": _failing})
    with pytest.warns(RuntimeWarning, match=r"quantize kernel failed its self-check on cuda:0 .*e4m3/1x128"):
        assert not self_check.passed("quantize", "cuda:0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not self_check.passed("quantize", "cuda:0")  # decided once: no second warning
    with pytest.warns(RuntimeWarning, match="on cuda:1"):  # another device is checked on its own
        assert not self_check.passed("quantize", "cuda:1")


def test_a_check_runs_once_per_device_and_may_use_its_kernel(monkeypatch, fresh):
    runs = []

    def check(device):
        runs.append(device)
        assert self_check.passed("adamw", device)  # the kernel under check is usable inside its check

    monkeypatch.setattr(self_check, "CHECKS", {"adamw": check})
    assert self_check.passed("adamw", "cuda:0") and self_check.passed("adamw", "cuda:0")
    assert self_check.passed("adamw", "cuda:1")
    assert runs == [torch.device("cuda:0"), torch.device("cuda:1")]


def test_opting_out_skips_the_checks(monkeypatch, fresh):
    monkeypatch.setattr(self_check, "CHECKS", {"quantize": _failing})
    self_check.configure(enabled=False)
    assert self_check.passed("quantize", "cuda:0")


def test_kernel_available_asks_the_self_check(monkeypatch, fresh):
    monkeypatch.setattr(_ext, "HAS_KERNELS", True)
    monkeypatch.setattr(_ext, "_native_info", lambda: {"kernels": {"quantize": ["sm_90a"]}})
    monkeypatch.setattr(_ext, "_device_arch", lambda device: "sm_90a")
    monkeypatch.setattr(self_check, "CHECKS", {"quantize": _failing})
    with pytest.warns(RuntimeWarning, match="failed its self-check"):
        assert not _ext.kernel_available("quantize", "cuda:0")
    monkeypatch.setattr(self_check, "CHECKS", {})
    monkeypatch.setattr(self_check, "_results", {})
    assert _ext.kernel_available("quantize", "cuda:0")


@pytest.mark.skipif(not _ext.HAS_KERNELS, reason="snip_ops._C is not built")
def test_every_compiled_kernel_has_a_check():
    kernels, checks = set(_ext.kernels()), set(self_check.CHECKS)
    if not _ext.compiled_archs():  # a build without CUDA: the ops with a CPU implementation only
        assert kernels == {"quantize", "dequantize", "adamw"}
    elif set(_ext.compiled_archs()) == {"sm_90a", "sm_100a"}:
        assert kernels == checks  # and no check is left for a kernel that is gone
    else:  # a build for some of the archs (SNIP_CUDA_ARCHS)
        assert kernels <= checks


def test_the_checks_pass_on_the_cpu_paths_and_catch_wrong_answers(monkeypatch):
    """On the CPU the quantizer and dequantizer are the ops' CPU implementation (the reference without
    the extension) and the GEMM is the fp32 path: the checks' code runs and agrees there (on a GPU the
    same code meets the kernels), and rejects a quantizer, dequantizer or GEMM that answers wrongly."""
    import importlib

    gk = importlib.import_module("snip_ops.gemm_kernels")
    q = importlib.import_module("snip_ops.quantize")  # the module (snip_ops.quantize is also its function)

    cpu = torch.device("cpu")
    monkeypatch.setitem(self_check.GEMM_KERNELS, "cpu_fp32", ("fp32", "fp8"))
    checks = [self_check._check_quantize, self_check._check_dequantize, self_check._gemm_check("cpu_fp32")]
    if _ext.HAS_KERNELS:  # adamw_'s CPU implementation is the kernel's host loop
        checks.append(self_check._check_adamw)
    for check in checks:
        check(cpu)

    real_quantize, real_dequantize, real_qgemm = q.quantize, q.dequantize, gk.qgemm

    def flipped_sign(*args, **kwargs):
        out = real_quantize(*args, **kwargs)
        out.codes = (out.codes.view(torch.uint8) ^ 0x80).view(out.codes.dtype)
        return out

    for name, wrong, check in [
        ("quantize", flipped_sign, self_check._check_quantize),
        ("dequantize", lambda qt: 2 * real_dequantize(qt), self_check._check_dequantize),
    ]:
        with monkeypatch.context() as m:
            m.setattr(q, name, wrong)
            with pytest.raises(AssertionError, match="differs from the reference"):
                check(cpu)
    with monkeypatch.context() as m:
        m.setattr(gk, "qgemm", lambda a, b, **kw: 2 * real_qgemm(a, b, **kw))
        with pytest.raises(AssertionError, match="beyond 2\\^-7"):
            self_check._gemm_check("cpu_fp32")(cpu)


@pytest.mark.gpu
def test_every_kernel_passes_its_self_check_on_this_gpu():
    compiled = [k for k in _ext.kernels() if _ext.kernel_compiled(k, "cuda")]
    for kernel in compiled:
        self_check.CHECKS[kernel](torch.device("cuda"))
