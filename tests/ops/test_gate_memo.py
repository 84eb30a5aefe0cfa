"""Kernel decisions kept per call signature (snip_ops._ext.GateMemo): a layer call does not re-derive which
kernels may run, its operands' scale layouts, its GEMMs' paths and tiles; every kept decision is dropped when
the kernel gate's answers may change, so that none outlives the self-check it followed from."""

import pytest
import torch

from snip_ops import _ext, autotune, self_check
from snip_ops import gemm_kernels as gk
from snip_ops.formats import E4M3, QuantSpec, recipe
from snip_ops.reference import quantize


def test_a_decision_is_kept_until_the_gate_changes():
    memo, computed = _ext.GateMemo(), []
    compute = lambda: computed.append(1) or "hopper"  # noqa: E731
    assert memo.get_or("k", compute) == memo.get_or("k", compute) == "hopper"
    assert len(computed) == 1
    _ext.gate_changed()
    assert memo.lookup("k") is None
    assert memo.get_or("k", compute) == "hopper" and len(computed) == 2


def test_a_decision_computed_while_the_gate_changed_is_not_kept():
    memo = _ext.GateMemo()

    def during_a_check():  # a self-check that ran and finished inside the computation
        _ext.gate_changed()
        return True

    assert memo.get_or("k", during_a_check) is True
    assert memo.lookup("k") is None


@pytest.fixture
def fresh_checks(monkeypatch):
    monkeypatch.setattr(self_check, "_results", {})
    monkeypatch.setattr(self_check, "_enabled", True)
    monkeypatch.setattr(_ext, "HAS_KERNELS", True)
    monkeypatch.setattr(_ext, "_native_info", lambda: {"kernels": {"quantize": ["sm_90a"]}})
    monkeypatch.setattr(_ext, "_device_arch", lambda device: "sm_90a")
    _ext.gate_changed()


def test_a_kernel_that_fails_its_check_is_never_used_from_a_kept_answer(monkeypatch, fresh_checks):
    """While its check runs the kernel counts as usable (the check calls it); that answer must not outlive
    the check's failure."""
    inside, layouts = [], _ext.GateMemo()  # `layouts`: a decision derived from the kernel's use, kept
    derived = lambda: _ext.kernel_available("quantize", "cuda:0")  # noqa: E731

    def check(device):
        inside.append(_ext.kernel_available("quantize", device))
        inside.append(layouts.get_or("x", derived))
        raise AssertionError("codes differ from the reference")

    monkeypatch.setattr(self_check, "CHECKS", {"quantize": check})
    with pytest.warns(RuntimeWarning, match="failed its self-check"):
        assert not _ext.kernel_available("quantize", "cuda:0")
    assert inside == [True, True]
    assert not _ext.kernel_available("quantize", "cuda:0")
    assert not _ext.kernel_available("quantize", torch.device("cuda", 0))
    assert layouts.get_or("x", derived) is False  # what was derived during the check is gone with it


def test_switching_the_checks_off_drops_kept_answers(monkeypatch, fresh_checks):
    def failing(device):
        raise AssertionError("wrong")

    monkeypatch.setattr(self_check, "CHECKS", {"quantize": failing})
    with pytest.warns(RuntimeWarning):
        assert not _ext.kernel_available("quantize", "cuda:0")
    self_check.configure(enabled=False)
    try:
        assert _ext.kernel_available("quantize", "cuda:0")  # used unchecked from now on, as asked
    finally:
        self_check.configure(enabled=True)
    assert not _ext.kernel_available("quantize", "cuda:0")


def test_select_path_asks_the_gate_once_per_signature(monkeypatch):
    asked = []
    monkeypatch.setattr(gk, "device_arch", lambda device: (9, 0))
    monkeypatch.setattr(gk._ext, "kernel_available", lambda name, device: asked.append(name) or True)
    r = recipe("fp8")
    g = torch.Generator().manual_seed(0)
    a, b = quantize(torch.randn(16, 256, generator=g), r.act), quantize(torch.randn(24, 256, generator=g), r.weight)
    assert gk.select_path(a, b).path == "sm90_fp8"
    n = len(asked)
    assert n > 0
    a2 = quantize(torch.randn(16, 256, generator=g), r.act)  # other values, the same signature
    assert gk.select_path(a2, b).path == "sm90_fp8" and len(asked) == n
    c = quantize(torch.randn(40, 256, generator=g), r.act)  # another shape: decided on its own
    assert gk.select_path(c, b).path == "sm90_fp8" and len(asked) > n
    monkeypatch.setattr(gk, "device_arch", lambda device: (10, 0))  # the arch is part of the signature
    assert gk.select_path(a, b).path != "sm90_fp8"


def test_only_a_settled_tile_choice_is_kept(monkeypatch):
    """In "tune" mode a call inside a trace gets the table's answer until an eager call has tuned the key:
    that answer is not kept; the tuned one is."""
    monkeypatch.setattr(gk, "device_arch", lambda device: (9, 0))
    chosen, final = [], {"now": False}
    monkeypatch.setattr(gk.autotune, "choose", lambda key, run: chosen.append(key) or "tile=128x128")
    monkeypatch.setattr(gk.autotune, "settled", lambda key, tuning: final["now"])
    a = quantize(torch.randn(64, 256), QuantSpec(E4M3, (1, 128)))
    ca = torch.zeros(64, 256, dtype=torch.float8_e4m3fn)
    args = (a, ca, 128, torch.bfloat16, False, 128, None)
    assert gk._tile_config(*args) == gk._tile_config(*args) == "tile=128x128" and len(chosen) == 2
    final["now"] = True
    assert gk._tile_config(*args) == "tile=128x128" and len(chosen) == 3
    assert gk._tile_config(*args) == "tile=128x128" and len(chosen) == 3  # kept
    previous = autotune.configure(autotune.TuningConfig(mode="off"))  # another setting: asked again
    try:
        gk._tile_config(*args)
        assert len(chosen) == 4
    finally:
        autotune.configure(previous)


def test_settled_follows_the_tuners_memory(tmp_path):
    kind = autotune.GemmKind("fp8_gemm_nt_blockwise", 128, "bfloat16", False)
    key = autotune.key_for("NVIDIA H200", kind, 8192, 4096, 4096)
    assert autotune.settled(key, autotune.TuningConfig(mode="off"))
    tune = autotune.TuningConfig(mode="tune", cache_path=tmp_path / "c.json", timer=lambda fn: (fn(), 1.0)[1])
    assert not autotune.settled(key, tune)
    autotune.choose(key, lambda config: torch.zeros(2), tune)
    assert autotune.settled(key, tune)


def test_equal_specs_hash_alike():
    a, b = QuantSpec(E4M3, (1, 128)), QuantSpec.parse("e4m3/1x128/fp32/rne")
    assert a == b and hash(a) == hash(b) and {a: 1}[b] == 1
    assert a != a.with_rounding("sr") and len({a, a.with_rounding("sr")}) == 2
