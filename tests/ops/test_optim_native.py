"""snip_C::adamw_ against snip_ops.optim.adamw_step_reference, bit for bit: every param/state dtype
pair, odd sizes, shard offsets that are not multiples of 8 (partial Philox blocks), unaligned views,
edge values, many tensors in one call, and the optimizer's dispatch; and the SR bits against
Philox4x32 itself (test_optim.check_sr_bits_pinned). On "cuda" this is the fused multi-tensor kernel
(marked gpu); on "cpu" the extension's host loop, which shares the kernel's arithmetic
(csrc/optim/adamw_math.cuh) and runs wherever the extension is built."""

import pytest
import torch
from torch import nn

from snip_ops import _ext
from snip_ops.optim import AdamW, adamw_scalars, adamw_step_reference
from test_optim import check_sr_bits_pinned



@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def dev(request):
    if request.param == "cpu" and not _ext.HAS_KERNELS:
        pytest.skip(f"snip_ops._C not built: {_ext.build_info()['extension_error']}")
    if request.param == "cuda" and not _ext.kernel_available("adamw", "cuda"):
        pytest.skip(f"adamw not compiled for this GPU: {_ext.build_info()}")
    return request.param


def _same_bits(a, b):
    """Bitwise equality, any NaN equal to any NaN (the kernel writes BF16 NaN as 0x7FFF)."""
    nan = torch.isnan(a)
    return torch.equal(nan, torch.isnan(b)) and torch.equal(a[~nan], b[~nan])


def _tensors(dev, sizes, param_dtype, state_dtype, seed=0, special=False):
    gen = torch.Generator(device=dev).manual_seed(seed)
    ps, gs, ms, vs = [], [], [], []
    for n in sizes:
        p = torch.randn(n, device=dev, generator=gen) * 0.05
        g = torch.randn(n, device=dev, generator=gen) * torch.rand(n, device=dev, generator=gen).pow(8) * 10
        m = torch.randn(n, device=dev, generator=gen) * 1e-3
        v = torch.rand(n, device=dev, generator=gen) * 1e-5
        if special and n >= 8:
            g[:8] = torch.tensor([0.0, -0.0, float("nan"), float("inf"), 1e-40, -1e30, 3e38, 1e-7], device=dev)
            p[:8] = torch.tensor([0.0, 3e38, 1e-39, -2.0, -3.3e38, 1.0, float("inf"), float("nan")], device=dev)
        ps.append(p.to(param_dtype))
        gs.append(g.to(param_dtype))
        ms.append(m.to(state_dtype))
        vs.append(v.to(state_dtype))
    return ps, gs, ms, vs


def _both(dev, sizes, param_dtype, state_dtype, bases=None, sr=True, special=False, step=3, seed=11):
    ps, gs, ms, vs = _tensors(dev, sizes, param_dtype, state_dtype, special=special)
    kp, km, kv = [p.clone() for p in ps], [m.clone() for m in ms], [v.clone() for v in vs]
    indices = list(range(5, 5 + len(sizes)))
    bases = bases or [0] * len(sizes)
    s = adamw_scalars(1e-3, 0.9, 0.95, 1e-8, 0.1, step)
    adamw_step_reference(ps, gs, ms, vs, indices, bases, s, step, seed, sr)
    torch.ops.snip_C.adamw_(kp, gs, km, kv, indices, bases, *s.as_tuple(), step, seed, sr)
    return (ps, ms, vs), (kp, km, kv)


@pytest.mark.parametrize("param_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("sr", [True, False])
def test_matches_reference_bit_for_bit(dev, param_dtype, state_dtype, sr):
    sizes = [1, 3, 4, 5, 127, 4096, 4097, 100_003, 1 << 20]
    ref, ker = _both(dev, sizes, param_dtype, state_dtype, sr=sr)
    for r_list, k_list in zip(ref, ker):
        for r, k in zip(r_list, k_list):
            assert _same_bits(r, k)


@pytest.mark.parametrize("param_dtype", [torch.bfloat16, torch.float32])
def test_edge_values(dev, param_dtype):
    ref, ker = _both(dev, [64, 9], param_dtype, torch.float32, special=True)
    for r_list, k_list in zip(ref, ker):
        for r, k in zip(r_list, k_list):
            assert _same_bits(r, k)


def test_shard_offsets_not_multiple_of_eight(dev):
    ref, ker = _both(dev, [10, 4101, 7, 4100], torch.bfloat16, torch.bfloat16, bases=[3, 1 << 33, 4098, 4])
    for r_list, k_list in zip(ref, ker):
        for r, k in zip(r_list, k_list):
            assert _same_bits(r, k)


def test_sr_bits_are_pinned_to_philox_blocks_of_eight(dev):
    def step(ps, gs, ms, vs, indices, bases, s, step, seed):
        moved = [[t.to(dev) for t in lst] for lst in (ps, gs, ms, vs)]
        torch.ops.snip_C.adamw_(*moved, indices, bases, *s.as_tuple(), step, seed, True)
        for lst, out in zip((ps, ms, vs), (moved[0], moved[2], moved[3])):
            for t, o in zip(lst, out):
                t.copy_(o)

    check_sr_bits_pinned(step)


@pytest.mark.parametrize("skip", [1, 4])  # 2 or 8 bytes off the 16-byte alignment of the vector path
def test_unaligned_views_use_the_scalar_path(dev, skip):
    ps, gs, ms, vs = _tensors(dev, [4099], torch.bfloat16, torch.float32)
    views = [[t[skip:] for t in lst] for lst in (ps, gs, ms, vs)]
    kp_base = torch.empty(4099, dtype=torch.bfloat16, device=dev)
    kp_base[skip:] = views[0][0]
    kview = [kp_base[skip:]]  # a contiguous view whose data pointer is off alignment
    km, kv = [views[2][0].clone()], [views[3][0].clone()]
    s = adamw_scalars(1e-2, 0.9, 0.999, 1e-8, 0.0, 1)
    adamw_step_reference(views[0], views[1], views[2], views[3], [0], [0], s, 1, 5, True)
    torch.ops.snip_C.adamw_(kview, views[1], km, kv, [0], [0], *s.as_tuple(), 1, 5, True)
    assert _same_bits(views[0][0], kview[0]) and _same_bits(views[2][0], km[0])


def test_many_tensors_one_call(dev):
    sizes = [int(x) for x in torch.randint(1, 3000, (300,), generator=torch.Generator().manual_seed(0))]
    ref, ker = _both(dev, sizes, torch.bfloat16, torch.float32)
    assert all(_same_bits(r, k) for r, k in zip(ref[0], ker[0]))


def test_bad_inputs(dev):
    p = torch.zeros(4, device=dev, dtype=torch.bfloat16)
    m = torch.zeros(4, device=dev)
    s = adamw_scalars(1e-3, 0.9, 0.999, 1e-8, 0.0, 1).as_tuple()
    with pytest.raises(RuntimeError, match="one entry each"):
        torch.ops.snip_C.adamw_([p], [p], [m], [], [0], [0], *s, 1, 0, True)
    with pytest.raises(RuntimeError, match="grads\\[0\\] is"):
        torch.ops.snip_C.adamw_([p], [m], [m], [m], [0], [0], *s, 1, 0, True)
    with pytest.raises(RuntimeError, match="contiguous"):
        q = torch.zeros(4, 4, device=dev, dtype=torch.bfloat16).t()
        torch.ops.snip_C.adamw_([q], [q], [m.view(4, 1).expand(4, 4).contiguous().t()], [m], [0], [0], *s, 1, 0, True)
    if dev == "cuda":
        with pytest.raises(RuntimeError, match="is on"):
            torch.ops.snip_C.adamw_([p], [p], [m.cpu()], [m], [0], [0], *s, 1, 0, True)
    with pytest.raises(RuntimeError, match="step"):
        torch.ops.snip_C.adamw_([p], [p], [m], [m], [0], [0], *s, 0, 0, True)


def test_optimizer_uses_the_kernel_and_matches_reference_training(dev):
    torch.manual_seed(0)
    models = [nn.Sequential(nn.Linear(64, 257), nn.GELU(), nn.Linear(257, 3)).to(dev, torch.bfloat16) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    opts = [AdamW(models[0].parameters(), lr=1e-3, implementation="kernel", seed=4),
            AdamW(models[1].parameters(), lr=1e-3, implementation="reference", seed=4)]
    x = torch.randn(512, 64, device=dev, dtype=torch.bfloat16)
    for _ in range(10):
        for model, opt in zip(models, opts):
            loss = model(x).float().pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        assert torch.equal(a, b)


def test_the_kernel_step_advances_version_counters(dev):
    # The op writes through raw pointers; autograd's saved-tensor checks and reuse_quantized_weights read
    # the version counters an in-place torch op would have advanced.
    p = nn.Parameter(torch.randn(300, device=dev, dtype=torch.bfloat16))
    opt = AdamW([p], lr=0.1, implementation="kernel")
    p.grad = torch.randn_like(p)
    opt.step()  # creates the moments
    state = opt.state[p]
    before = [t._version for t in (p, state["exp_avg"], state["exp_avg_sq"])]
    opt.step()
    assert all(t._version > v for t, v in zip((p, state["exp_avg"], state["exp_avg_sq"]), before))
