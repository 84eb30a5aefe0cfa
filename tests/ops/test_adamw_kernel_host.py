"""The fused multi-tensor AdamW kernel (csrc/optim/adamw.cu) run on the CPU from its own source
through the host shim (tests/cuda_host.py), against snip_ops.optim.adamw_step_reference bit for bit:
the cases of tests/ops/test_optim_native.py (whose tensor helpers it uses), i.e. every param/state
dtype pair, odd sizes, shard offsets that are not multiples of 8 (partial Philox blocks), unaligned
views (the scalar path), edge values and many tensors in one launch (the block -> tensor search); and
the SR bits against Philox4x32 itself (test_optim.check_sr_bits_pinned). The op's CPU device runs
the separate host loop (adamw_cpu.cpp); this is the kernel itself."""

import pytest
import torch

import cuda_host
from snip_ops.optim import adamw_scalars, adamw_step_reference
from test_optim import check_sr_bits_pinned
from test_optim_native import _same_bits, _tensors

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module", autouse=True)
def _shim():
    cuda_host.load()


def _both(sizes, param_dtype, state_dtype, bases=None, sr=True, special=False, step=3, seed=11):
    ps, gs, ms, vs = _tensors("cpu", sizes, param_dtype, state_dtype, special=special)
    kp, km, kv = [p.clone() for p in ps], [m.clone() for m in ms], [v.clone() for v in vs]
    indices = list(range(5, 5 + len(sizes)))
    bases = bases or [0] * len(sizes)
    s = adamw_scalars(1e-3, 0.9, 0.95, 1e-8, 0.1, step)
    adamw_step_reference(ps, gs, ms, vs, indices, bases, s, step, seed, sr)
    cuda_host.adamw_(kp, gs, km, kv, indices, bases, *s.as_tuple(), step, seed, sr)
    return (ps, ms, vs), (kp, km, kv)


def _assert_same(ref, ker):
    for what, r_list, k_list in zip(("param", "exp_avg", "exp_avg_sq"), ref, ker):
        for i, (r, k) in enumerate(zip(r_list, k_list)):
            assert _same_bits(r, k), f"{what}[{i}] ({r.numel()} elements) differs"


@pytest.mark.parametrize("param_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("sr", [True, False])
def test_matches_reference_bit_for_bit(param_dtype, state_dtype, sr):
    _assert_same(*_both([1, 3, 4, 5, 127, 4096, 4097, 100_003, 1 << 20], param_dtype, state_dtype, sr=sr))


@pytest.mark.parametrize("param_dtype", [torch.bfloat16, torch.float32])
def test_edge_values(param_dtype):
    _assert_same(*_both([64, 9], param_dtype, torch.float32, special=True))


def test_shard_offsets_not_multiple_of_eight():
    _assert_same(*_both([10, 4101, 7, 4100], torch.bfloat16, torch.bfloat16, bases=[3, 1 << 33, 4098, 4]))


def test_sr_bits_are_pinned_to_philox_blocks_of_eight():
    check_sr_bits_pinned(lambda *a: cuda_host.adamw_(*a[:6], *a[6].as_tuple(), *a[7:], True))


@pytest.mark.parametrize("skip", [1, 4])  # 2 or 8 bytes off the 16-byte alignment of the vector path
def test_unaligned_views_use_the_scalar_path(skip):
    ps, gs, ms, vs = _tensors("cpu", [4099], torch.bfloat16, torch.float32)
    views = [[t[skip:] for t in lst] for lst in (ps, gs, ms, vs)]
    km, kv = [views[2][0].clone()], [views[3][0].clone()]
    kp_base = torch.empty(4099, dtype=torch.bfloat16)
    kp_base[skip:] = views[0][0]
    kview = [kp_base[skip:]]
    s = adamw_scalars(1e-2, 0.9, 0.999, 1e-8, 0.0, 1)
    adamw_step_reference(views[0], views[1], views[2], views[3], [0], [0], s, 1, 5, True)
    cuda_host.adamw_(kview, views[1], km, kv, [0], [0], *s.as_tuple(), 1, 5, True)
    _assert_same(([views[0][0]], [views[2][0]], [views[3][0]]), (kview, km, kv))


def test_many_tensors_one_call():
    sizes = [int(x) for x in torch.randint(1, 3000, (300,), generator=torch.Generator().manual_seed(0))]
    _assert_same(*_both(sizes, torch.bfloat16, torch.float32))
