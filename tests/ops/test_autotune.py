"""snip_ops.autotune: the FP8 GEMM config choice -- tuning under a stand-in timer and kernel runner (the
fastest candidate that runs and gives the heuristic's bits), its on-disk cache (per device and snip
version, a corrupt file survived), the committed table and its lookup, qgemm's hook; and on a Hopper GPU
one real shape tuned."""

import json
from pathlib import Path

import pytest
import torch

from snip_ops import _ext, autotune, gemm_kernels as gk, reference
from snip_ops.autotune import GemmKind, TuningConfig

ROOT = Path(__file__).resolve().parents[2]
FPROP = GemmKind("fp8_gemm_nt_blockwise", 128, "bfloat16", False)  # E4M3, 128x128 B blocks, BF16 out
WGRAD = GemmKind("fp8_gemm_nt_blockwise", 1, "float32", False)
DEVICE = "NVIDIA H200"


class StandInKernel:
    """run(config): one fixed output per call, a changed element for the configs in `wrong`, a raise for those
    in `failing`; remembers the calls."""

    def __init__(self, wrong=(), failing=()):
        self.wrong, self.failing, self.calls, self.last = set(wrong), set(failing), [], None

    def __call__(self, config: str) -> torch.Tensor:
        self.calls.append(config)
        if config in self.failing:
            raise RuntimeError(f"config '{config}': can_implement failed")
        self.last = config
        y = torch.arange(12, dtype=torch.float32).reshape(3, 4)
        if config in self.wrong:
            y[1, 2] += 1
        return y


class StandInTimer:
    """timer(fn): runs fn once and returns the time `times` gives the config it ran (default 1 ms)."""

    def __init__(self, kernel: StandInKernel, times: dict[str, float]):
        self.kernel, self.times, self.timed = kernel, times, []

    def __call__(self, fn) -> float:
        fn()
        self.timed.append(self.kernel.last)
        return self.times.get(self.kernel.last, 1.0)


def tuning(tmp_path, kernel, times, name="cache.json"):
    return TuningConfig(mode="tune", cache_path=tmp_path / name, timer=StandInTimer(kernel, times))


def test_candidates_are_few_and_start_with_the_heuristic():
    both = autotune.candidates(FPROP)
    assert both[0] == "" and len(both) <= 14 and len(set(both)) == len(both)
    assert {c.split(",")[0] for c in both[1:]} == {"tile=128x128", "tile=64x128", "tile=128x192"}
    assert {c for c in both if "128x192" in c} == {"tile=128x192", "tile=128x192,raster=m", "tile=128x192,raster=n"}
    overlapped = {"tile=128x128,promotion=overlapped", "tile=128x128,promotion=overlapped,raster=m",
                  "tile=128x128,promotion=overlapped,raster=n"}
    b_multicast = {"tile=128x128,promotion=overlapped,cluster=2x1", "tile=128x128,promotion=overlapped,cluster=2x1,raster=m"}
    assert {c for c in both if "promotion=overlapped" in c} == overlapped | b_multicast
    e5m2_dgrad, e5m2_wgrad = (GemmKind("fp8_gemm_nt_blockwise_e5m2", b, d, False) for b, d in ((128, "bfloat16"), (1, "float32")))
    for kind in (WGRAD, e5m2_dgrad, e5m2_wgrad, GemmKind("fp8_gemm_nt_blockwise_e5m2", 128, "bfloat16", True)):
        cands = autotune.candidates(kind)
        assert all("64x128" not in c and "cluster" not in c for c in cands)  # compiled for E4M3 fprop/dgrad only
        assert {c for c in cands if "overlapped" in c} == overlapped  # a linear layer's GEMM kinds
    for kind in (GemmKind("fp8_gemm_nt_blockwise", 128, "float32", False),
                 GemmKind("fp8_gemm_nt_blockwise", 1, "bfloat16", False)):
        assert all("overlapped" not in c for c in autotune.candidates(kind))
    wide = {"tile=128x192", "tile=128x192,raster=m", "tile=128x192,raster=n"}
    for kind, has_wide in ((FPROP, True), (WGRAD, True), (GemmKind("fp8_gemm_nt_blockwise", 1, "bfloat16", False), True),
                           (GemmKind("fp8_gemm_nt_blockwise", 128, "float32", False), False), (e5m2_dgrad, False)):
        assert ({c for c in autotune.candidates(kind) if "128x192" in c} == wide) == has_wide, kind
    # Blackwell: one tile per kind; the scheduler's order and swizzle (runtime arguments) are tuned
    assert autotune.candidates(GemmKind("fp8_gemm_nt_blockwise_sm100", 128, "bfloat16", False)) == (
        "", "raster=m", "raster=n", "swizzle=2")


def test_key_buckets_m_to_a_power_of_two():
    assert [autotune.key_for(DEVICE, FPROP, m, 4096, 4096).m_bucket for m in (1, 3, 4096, 4097, 6000)] == \
        [1, 4, 4096, 8192, 8192]
    a, b = autotune.key_for(DEVICE, FPROP, 5000, 64, 128), autotune.key_for(DEVICE, FPROP, 8000, 64, 128)
    assert a == b and a.text() == b.text()
    assert autotune.key_for(DEVICE, WGRAD, 5000, 64, 128).text() != a.text()


def test_tuning_picks_the_fastest_and_writes_the_cache(tmp_path):
    kernel = StandInKernel()
    times = {c: 2.0 + i for i, c in enumerate(autotune.candidates(FPROP))} | {"tile=128x128,promotion=overlapped,raster=n": 0.5}
    key = autotune.key_for(DEVICE, FPROP, 4096, 4096, 4096)
    cfg = tuning(tmp_path, kernel, times)
    assert autotune.choose(key, kernel, cfg) == "tile=128x128,promotion=overlapped,raster=n"
    assert set(cfg.timer.timed) == set(autotune.candidates(FPROP))
    entry = json.loads(cfg.cache_path.read_text())["entries"][key.text()]
    assert entry["config"] == "tile=128x128,promotion=overlapped,raster=n" and entry["device"] == DEVICE
    assert entry["snip_version"] == autotune.SNIP_VERSION and entry["ms"]["tile=128x128,promotion=overlapped,raster=n"] == 0.5


def test_a_tie_keeps_the_heuristic(tmp_path):
    kernel = StandInKernel()
    key = autotune.key_for(DEVICE, WGRAD, 64, 64, 128)
    assert autotune.choose(key, kernel, tuning(tmp_path, kernel, {})) == ""


def test_a_second_call_hits_the_cache(tmp_path):
    kernel = StandInKernel()
    key = autotune.key_for(DEVICE, FPROP, 1000, 2048, 512)
    cfg = tuning(tmp_path, kernel, {"tile=128x128,raster=m": 0.1})
    assert autotune.choose(key, kernel, cfg) == "tile=128x128,raster=m"
    calls = len(kernel.calls)
    assert autotune.choose(autotune.key_for(DEVICE, FPROP, 900, 2048, 512), kernel, cfg) == "tile=128x128,raster=m"
    assert len(kernel.calls) == calls  # the same bucket, from memory
    # another process: a fresh setting on the same file reads it, times nothing, runs nothing
    fresh = tuning(tmp_path, kernel, {"": 0.01})
    assert autotune.choose(key, kernel, fresh) == "tile=128x128,raster=m"
    assert fresh.timer.timed == [] and len(kernel.calls) == calls


def test_another_device_or_version_never_reads_an_entry(tmp_path):
    kernel = StandInKernel()
    old = autotune.key_for(DEVICE, FPROP, 4096, 4096, 4096, version="0.0.1")
    assert autotune.choose(old, kernel, tuning(tmp_path, kernel, {"tile=64x128": 0.1})) == "tile=64x128"
    h100 = autotune.key_for("NVIDIA H100 80GB HBM3", FPROP, 4096, 4096, 4096)
    assert autotune.choose(h100, kernel, tuning(tmp_path, kernel, {"tile=128x128": 0.1})) == "tile=128x128"
    now = autotune.key_for(DEVICE, FPROP, 4096, 4096, 4096)
    cfg = tuning(tmp_path, kernel, {"tile=128x128,raster=n": 0.1})
    assert autotune.choose(now, kernel, cfg) == "tile=128x128,raster=n" and cfg.timer.timed
    entries = json.loads(cfg.cache_path.read_text())["entries"]
    assert len(entries) == 3  # the other entries are kept, not read
    # an entry under this key whose recorded device or version is another one is not believed either
    mine = entries[now.text()]
    for field, value in (("device", "NVIDIA H100"), ("snip_version", "0.0.1")):
        entries[now.text()] = dict(mine, **{field: value}, config="tile=64x128")
        cfg.cache_path.write_text(json.dumps(dict(format=1, entries=entries)))
        again = tuning(tmp_path, kernel, {"tile=128x128,swizzle=2": 0.1})
        assert autotune.choose(now, kernel, again) == "tile=128x128,swizzle=2" and again.timer.timed


def test_a_failing_candidate_is_skipped(tmp_path):
    kernel = StandInKernel(failing={"tile=128x128,promotion=overlapped,cluster=2x1,raster=m"})
    key = autotune.key_for(DEVICE, FPROP, 256, 4096, 4096)
    cfg = tuning(tmp_path, kernel, {"tile=128x128,promotion=overlapped,cluster=2x1,raster=m": 0.1, "tile=128x128,swizzle=2": 0.2})
    assert autotune.choose(key, kernel, cfg) == "tile=128x128,swizzle=2"
    entry = json.loads(cfg.cache_path.read_text())["entries"][key.text()]
    assert "can_implement" in entry["skipped"]["tile=128x128,promotion=overlapped,cluster=2x1,raster=m"]
    assert "tile=128x128,promotion=overlapped,cluster=2x1,raster=m" not in entry["ms"]


def test_a_candidate_with_another_output_is_skipped(tmp_path):
    kernel = StandInKernel(wrong={"tile=128x128,raster=n"})
    key = autotune.key_for(DEVICE, FPROP, 256, 4096, 4096)
    cfg = tuning(tmp_path, kernel, {"tile=128x128,raster=n": 0.1, "tile=64x128": 0.2})
    with pytest.warns(RuntimeWarning, match="another result than its heuristic"):
        assert autotune.choose(key, kernel, cfg) == "tile=64x128"
    assert "tile=128x128,raster=n" not in cfg.timer.timed


def test_a_tuned_choice_gives_the_heuristics_bits_whichever_wins(tmp_path):
    key = autotune.key_for(DEVICE, FPROP, 512, 1024, 2048)
    for i, winner in enumerate(autotune.candidates(FPROP)):
        kernel = StandInKernel()
        chosen = autotune.choose(key, kernel, tuning(tmp_path, kernel, {winner: 0.1}, f"cache{i}.json"))
        assert chosen == winner and torch.equal(kernel(chosen), kernel(""))


def test_a_corrupt_cache_warns_and_is_tuned_again(tmp_path):
    path = tmp_path / "cache.json"
    kernel = StandInKernel()
    key = autotune.key_for(DEVICE, FPROP, 4096, 4096, 4096)
    for corrupt in ("{not json", json.dumps([1, 2]), json.dumps(dict(format=99, entries={}))):
        path.write_text(corrupt)
        cfg = tuning(tmp_path, kernel, {"tile=64x128": 0.1})
        with pytest.warns(RuntimeWarning, match="unreadable tuning cache"):
            assert autotune.choose(key, kernel, cfg) == "tile=64x128"
        assert cfg.timer.timed
        assert json.loads(path.read_text())["entries"][key.text()]["config"] == "tile=64x128"


def test_an_unwritable_cache_keeps_the_choice_in_memory(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    kernel = StandInKernel()
    cfg = TuningConfig(mode="tune", cache_path=blocker / "cache.json", timer=StandInTimer(kernel, {"tile=64x128": 0.1}))
    key = autotune.key_for(DEVICE, FPROP, 4096, 4096, 4096)
    with pytest.warns(RuntimeWarning, match="cannot write the tuning cache"):
        assert autotune.choose(key, kernel, cfg) == "tile=64x128"
    assert autotune.choose(key, kernel, cfg) == "tile=64x128"


def test_off_and_table_modes_run_nothing():
    kernel = StandInKernel()
    key = autotune.key_for(DEVICE, FPROP, 8192, 4096, 4096)
    assert autotune.choose(key, kernel, TuningConfig(mode="off")) == ""
    assert autotune.choose(key, kernel, TuningConfig(mode="table")) == "tile=128x128"
    assert kernel.calls == []
    with pytest.raises(ValueError, match="mode"):
        TuningConfig(mode="fast")


def test_no_tuning_inside_a_trace(tmp_path):
    from torch._subclasses.fake_tensor import FakeTensorMode

    kernel = StandInKernel()
    cfg = tuning(tmp_path, kernel, {"tile=64x128": 0.1})
    key = autotune.key_for(DEVICE, FPROP, 8192, 4096, 4096)
    with FakeTensorMode():
        assert autotune.choose(key, kernel, cfg) == "tile=128x128"  # the table's
    assert kernel.calls == [] and not cfg.cache_path.exists()
    assert autotune.choose(key, kernel, cfg) == "tile=64x128"  # tuned once eager


def _entry(kind: GemmKind, m: int, n: int, k: int, config: str) -> dict:
    return dict(kernel=kind.kernel, b_block=kind.b_block, out_dtype=kind.out_dtype, m=m, n=n, k=k, config=config,
                ms=1.0)


@pytest.fixture
def small_table(monkeypatch):
    """A stand-in for the committed table of DEVICE (the lookup rules, whatever a GPU run last measured)."""
    entries = (_entry(FPROP, 8192, 4096, 4096, "tile=128x128"),
               _entry(FPROP, 8192, 28672, 8192, "tile=128x192,raster=m"),
               _entry(FPROP, 8192, 8192, 28672, "tile=128x128,raster=m"),
               _entry(WGRAD, 8192, 8192, 8192, "tile=128x128,raster=n"),
               _entry(WGRAD, 8192, 28672, 8192, "tile=128x128,swizzle=2"),
               _entry(WGRAD, 4096, 4096, 8192, "tile=128x128,raster=m"))
    monkeypatch.setattr(autotune, "_table", lambda device: entries if device == DEVICE else ())


def test_table_lookup_takes_the_nearest_entry_within_a_factor_of_two(small_table):
    def look(kind, m, n, k, device=DEVICE):
        return autotune.table_lookup(autotune.key_for(device, kind, m, n, k))

    assert look(FPROP, 8192, 4096, 4096) == "tile=128x128"  # the table's entries
    assert look(FPROP, 8192, 28672, 8192) == "tile=128x192,raster=m"
    assert look(WGRAD, 8192, 8192, 8192) == "tile=128x128,raster=n"
    assert look(WGRAD, 6000, 8192, 8192) == "tile=128x128,raster=n"  # m bucket 8192
    assert look(WGRAD, 8192, 9000, 8000) == "tile=128x128,raster=n"  # nearest
    assert look(FPROP, 256, 4096, 4096) == ""  # no entry within a factor of two in m: the heuristic
    assert look(FPROP, 8192, 512, 4096) == ""
    assert look(GemmKind("fp8_gemm_nt_blockwise_e5m2", 128, "bfloat16", False), 8192, 4096, 4096) == ""
    assert look(FPROP, 8192, 4096, 4096, device="NVIDIA H100 80GB HBM3") == ""  # no table for it


def test_a_kind_without_entries_takes_those_of_its_other_output_dtype(small_table):
    # A table may time wgrad with FP32 output only; a BF16-weight layer's wgrad writes BF16 (same mainloop
    # and tiles), and takes those entries. A kind with entries of its own never looks at the other dtype's.
    wgrad_bf16 = GemmKind("fp8_gemm_nt_blockwise", 1, "bfloat16", False)
    fprop_f32 = GemmKind("fp8_gemm_nt_blockwise", 128, "float32", False)
    for m, n, k in ((8192, 8192, 8192), (8192, 28672, 8192), (4096, 4096, 8192), (300, 4096, 4096)):
        want = autotune.table_lookup(autotune.key_for(DEVICE, WGRAD, m, n, k))
        assert autotune.table_lookup(autotune.key_for(DEVICE, wgrad_bf16, m, n, k)) == want
    assert autotune.table_lookup(autotune.key_for(DEVICE, wgrad_bf16, 8192, 28672, 8192)) == "tile=128x128,swizzle=2"
    # and an FP32-output fprop (no entries) takes fprop's BF16 ones
    assert autotune.table_lookup(autotune.key_for(DEVICE, fprop_f32, 8192, 8192, 28672)) == "tile=128x128,raster=m"


def test_table_from_bench_keeps_wgrad_with_bf16_output_apart():
    # bench_gemm --configs times wgrad's configs with FP32 and with BF16 output (the layer's for BF16 weights);
    # each output dtype is a kind of its own, its heuristic time the "fp8" entry or the "fp8_wgrad_bf16" baseline.
    row = dict(shape="s", gemm="wgrad", m=4096, n=4096, k=8192)
    results = dict(device=DEVICE, entries=[dict(row, format="fp8", ms=1.0)],
                   baselines=[dict(row, format="fp8_wgrad_bf16", ms=0.9), dict(row, format="fp8_qgemm", ms=0.1)],
                   configs=[dict(row, format="fp8[tile=128x128,raster=n]", impl="tile=128x128,raster=n", ms=0.8),
                            dict(row, format="fp8[tile=128x192]", impl="tile=128x192", ms=0.7, out_dtype="bfloat16"),
                            dict(row, format="fp8[tile=128x128]", impl="tile=128x128", ms=0.95, out_dtype="bfloat16")])
    entries = {(e["out_dtype"], e["config"]) for e in autotune.table_from_bench(results)["entries"]}
    assert entries == {("float32", "tile=128x128,raster=n"), ("bfloat16", "tile=128x192")}
    results["configs"][1]["ms"] = 0.91
    entries = {(e["out_dtype"], e["config"]) for e in autotune.table_from_bench(results)["entries"]}
    assert entries == {("float32", "tile=128x128,raster=n"), ("bfloat16", "")}  # the heuristic's 0.9 ms


def test_committed_table_is_the_bench_results():
    results = json.loads((ROOT / "bench/results/nvidia-h200-gemm-configs.json").read_text())
    committed = json.loads((autotune.TABLE_DIR / "nvidia-h200.json").read_text())
    assert autotune.table_from_bench(results, source="nvidia-h200-gemm-configs.json") == committed
    assert committed["device"] == results["device"] == DEVICE
    assert all(e["config"] in autotune.candidates(GemmKind(e["kernel"], e["b_block"], e["out_dtype"], False))
               for e in committed["entries"])


def test_a_named_config_runs_once_it_gave_the_heuristics_bits(monkeypatch):
    # qgemm(config=...) names a config, perhaps of a mainloop no GPU has run: its first output per call signature
    # is compared with the heuristic's, bit for bit; one that differs is replaced by "" (the heuristic) with a
    # warning, for good. Inside a trace nothing can be compared: the config runs as named, unremembered.
    from torch._subclasses.fake_tensor import FakeTensorMode

    monkeypatch.setattr(gk, "_config_agrees", {})
    calls = []

    def run(config, wrong=("tile=128x192",)):
        calls.append(config)
        return torch.tensor([1.0, -0.0 if config in wrong else 0.0])  # -0.0 and 0.0: equal, not the same bits

    sig = ("cuda:0", "e4m3", 128, torch.bfloat16, False, 256, 4096, 4096)
    assert gk.checked_config(sig, "tile=128x128,raster=n", run) == "tile=128x128,raster=n"
    assert calls == ["tile=128x128,raster=n", ""]
    assert gk.checked_config(sig, "tile=128x128,raster=n", run) == "tile=128x128,raster=n" and len(calls) == 2
    with pytest.warns(RuntimeWarning, match=r"config 'tile=128x192' gives another result .*\(256, 4096, 4096\)"):
        assert gk.checked_config(sig, "tile=128x192", run) == ""
    assert gk.checked_config(sig, "tile=128x192", run) == "" and len(calls) == 4
    other = sig[:-3] + (512, 4096, 4096)  # another signature is compared anew
    with FakeTensorMode():
        assert gk.checked_config(other, "tile=128x192", run) == "tile=128x192" and len(calls) == 4
    with pytest.warns(RuntimeWarning):
        assert gk.checked_config(other, "tile=128x192", run) == ""


def test_configure_is_process_wide_and_returns_the_previous_setting():
    previous = autotune.configure(TuningConfig(mode="off"))
    try:
        assert autotune.current() == TuningConfig(mode="off")
    finally:
        assert autotune.configure(previous) == TuningConfig(mode="off")
    assert previous == TuningConfig()  # "table" by default
    with pytest.raises(TypeError):
        autotune.configure("tune")


@pytest.mark.skipif(not (_ext.HAS_KERNELS and "fp8_gemm_nt_blockwise" in _ext.kernels()),
                    reason="extension built without the sm_90a GEMMs")
@pytest.mark.parametrize("accumulate", [False, True])
def test_qgemm_asks_the_tuner_when_no_config_is_given(monkeypatch, accumulate):
    # The hook on a traced Hopper call: the key (kernel, padded N and K, bucketed M) and the chosen config
    # reaching the op; an explicit config is passed as given.
    from torch.fx.experimental.proxy_tensor import make_fx

    monkeypatch.setattr(gk, "device_arch", lambda device: (9, 0))
    monkeypatch.setattr(gk._ext, "kernel_available", lambda name, device: True)
    keys = []
    monkeypatch.setattr(gk.autotune, "choose", lambda key, run: keys.append(key) or "tile=64x128,raster=m")
    g = torch.Generator().manual_seed(0)
    r = gk.recipe("fp8")
    a = reference.quantize(torch.randn(300, 200, generator=g), r.act)
    b = reference.quantize(torch.randn(40, 200, generator=g), r.weight)

    def f(ca, sa, cb, sb, out, config):
        qa, qb = reference.QTensor(ca, sa, a.spec, a.shape), reference.QTensor(cb, sb, b.spec, b.shape)
        return gk.qgemm(qa, qb, out=out if accumulate else None, config=config)

    named = []
    monkeypatch.setattr(gk, "checked_config", lambda sig, config, run: named.append((sig, config)) or config)
    for config, want in (("", "tile=64x128,raster=m"), ("tile=128x128", "tile=128x128")):
        out = torch.zeros(300, 40, dtype=torch.bfloat16)
        gm = make_fx(lambda *t: f(*t, config), tracing_mode="fake")(a.codes, a.scales, b.codes, b.scales, out)
        (node,) = [n for n in gm.graph.nodes if n.op == "call_function" and "snip_C" in str(n.target)]
        assert node.args[-1] == want
    (key,) = keys
    assert key.device == "cpu" and (key.m_bucket, key.n, key.k) == (512, 40, 208)
    assert key.kind == GemmKind("fp8_gemm_nt_blockwise", 128, "bfloat16", accumulate)
    (sig, config), = named  # the named config goes through checked_config with its call signature
    assert config == "tile=128x128" and sig[-3:] == (300, 40, 208) and sig[4] == accumulate


def _sm90():
    return (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
            and _ext.kernel_available("fp8_gemm_nt_blockwise", "cuda"))


@pytest.mark.gpu
@pytest.mark.skipif(not _sm90(), reason="needs an sm_90 GPU and the sm_90a GEMM in snip_ops._C")
@pytest.mark.parametrize("gemm_kind", ["fprop", "wgrad"])
def test_tuning_a_real_shape_keeps_the_heuristics_bits(tmp_path, gemm_kind):
    from snip_ops.quantize import quantize

    r = gk.recipe("fp8")
    g = torch.Generator(device="cuda").manual_seed(0)
    m, n, k = 1000, 2048, 1024
    if gemm_kind == "fprop":
        a = quantize(torch.randn(m, k, device="cuda", generator=g), r.act)
        b = quantize(torch.randn(n, k, device="cuda", generator=g), r.weight)
        out_dtype = torch.bfloat16
    else:
        a = quantize(torch.randn(k, m, device="cuda", generator=g), r.grad, transpose=True)
        b = quantize(torch.randn(k, n, device="cuda", generator=g), r.act, transpose=True)
        out_dtype = torch.float32
    cache = tmp_path / "tune.json"
    previous = autotune.configure(TuningConfig(mode="off"))
    try:
        heuristic = gk.qgemm(a, b, out_dtype=out_dtype)
        acc_heuristic = gk.qgemm(a, b, out=torch.ones(m, n, device="cuda"))
        autotune.configure(TuningConfig(mode="tune", cache_path=cache))
        tuned = gk.qgemm(a, b, out_dtype=out_dtype)
        acc_tuned = gk.qgemm(a, b, out=torch.ones(m, n, device="cuda"))
    finally:
        autotune.configure(previous)
    assert torch.equal(tuned.view(torch.uint8), heuristic.view(torch.uint8))
    assert torch.equal(acc_tuned, acc_heuristic)  # `out` gets one GEMM added, tuning or not
    entries = json.loads(cache.read_text())["entries"]
    assert len(entries) >= 2  # a new result and an accumulation: two kinds
    for entry in entries.values():
        assert entry["config"] in entry["ms"] and len(entry["ms"]) >= 2, entry
        assert not any("differs" in why for why in entry["skipped"].values()), entry
