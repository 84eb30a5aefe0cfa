"""The host shim itself (tests/native/cuda_host_shim.h, tests/cuda_host.py): that it runs CUDA's
block and warp cooperation as the kernels rely on it, and that what would fault or hang on a GPU,
or corrupt memory unseen, fails a test instead -- shown on the tiny kernels of
tests/native/cuda_host_shim_selftest.cu and on the real quantize kernel given wrong extents."""

import pytest
import torch

import cuda_host

THREADS = 64  # per block in the self-test kernels


@pytest.fixture(scope="module")
def lib():
    return cuda_host.load()


def launch(lib, name, blocks=1):
    out = torch.zeros(blocks * THREADS + 16, dtype=torch.int32)
    cuda_host.check_launch(lib, lib.snip_cuda_host_selftest(name.encode(), blocks, out.data_ptr()))
    return out.long() & 0xFFFFFFFF  # the kernels write uint32


def test_shared_memory_and_barrier(lib):
    out = launch(lib, "neighbour_through_shared_memory", blocks=3)
    t = torch.arange(THREADS)
    want = (1000 + (t + 1) % THREADS).repeat(3)
    assert torch.equal(out[: 3 * THREADS], want)


def test_dynamic_shared_memory_and_barrier(lib):
    out = launch(lib, "neighbour_through_dynamic_shared_memory", blocks=3)
    t = torch.arange(THREADS)
    assert torch.equal(out[: 3 * THREADS], (2000 + (t + 1) % THREADS).repeat(3))


def test_dynamic_shared_memory_is_filled_again_for_every_block(lib):
    # as CUDA gives no block another's shared memory: what a block left is never read as data
    out = launch(lib, "dynamic_shared_memory_per_block", blocks=3)
    assert out[: 3 * THREADS].eq(0xFFFFFFFF).all()


def test_more_dynamic_shared_memory_than_a_block_may_have(lib):
    with pytest.raises(cuda_host.LaunchError, match="cudaError 1: dynamic shared memory of 233472 bytes"):
        launch(lib, "too_much_dynamic_shared_memory")
    launch(lib, "xor_shuffle")  # the next launch runs normally


def test_xor_shuffle(lib):
    out = launch(lib, "xor_shuffle")
    assert torch.equal(out[:THREADS], torch.arange(THREADS) ^ 5)


def test_exited_threads_do_not_count_at_a_barrier(lib):
    out = launch(lib, "barrier_after_early_exit")
    assert out[: THREADS // 2].eq(1).all() and out[THREADS // 2: THREADS].eq(0).all()


def test_unwritten_shared_memory_reads_the_fill_pattern(lib):
    out = launch(lib, "unwritten_shared_memory")
    assert torch.equal(out[: THREADS // 2], torch.arange(THREADS // 2))
    assert out[THREADS // 2: THREADS].eq(0xFFFFFFFF).all()


@pytest.mark.parametrize("name, message", [
    ("divergent_barrier", "divergent __syncthreads: .*selftest.cu:\\d+, .*selftest.cu:\\d+"),
    ("shuffle_deadlock", "deadlock: .* waits at __shfl_xor_sync .*; lane 16 waits at __syncthreads"),
    ("shuffle_with_exited_lane", "lane 0 of mask 0xffffffff has exited"),
    ("misaligned_vector_load", "misaligned access to .*uint4.* needs 16-byte alignment"),
    ("local_array_overrun", "index 4 out of bounds of .*\\[4\\]"),
])
def test_what_fails_on_a_gpu_fails_the_launch(lib, name, message):
    with pytest.raises(cuda_host.LaunchError, match=message):
        launch(lib, name)
    launch(lib, "xor_shuffle")  # the next launch runs normally


def test_invalid_launch_configuration(lib):
    with pytest.raises(cuda_host.LaunchError, match="cudaError 9: invalid launch configuration"):
        launch(lib, "xor_shuffle", blocks=0)


def test_a_skipped_barrier_reads_unwritten_shared_memory(lib):
    lib.snip_cuda_host_skip_barriers(1)
    try:
        out = launch(lib, "neighbour_through_shared_memory")
    finally:
        lib.snip_cuda_host_skip_barriers(0)
    assert out[0] == 0xFFFFFFFF  # thread 0 ran to its end before thread 1 stored its slot


def _quantize_rows(lib, x, cols, codes, inner_store):
    """The row-wise kernel (e4m3/1x128/fp32/rne) on x told it has `cols` columns, writing
    `inner_store` codes per row."""
    scales = cuda_host.Guarded.output((x.shape[0], 1), torch.float32)
    cuda_host.check_launch(lib, lib.snip_quantize(
        0, x.data_ptr(), cuda_host.DTYPE[x.dtype], x.shape[0], cols, x.stride(0), cuda_host.ELEM["e4m3"], 1, 128, 0, 0,
        0, codes.tensor.data_ptr(), codes.tensor.stride(0), inner_store, scales.tensor.data_ptr(), 1, 0, 0,
        None, 0, 0, None, 0, 0, 0, 0, None, None, -1))
    return scales


def test_a_write_past_an_output_is_caught(lib):
    x = cuda_host.Guarded.copy_of(torch.randn(4, 64, dtype=torch.bfloat16)).tensor
    codes = cuda_host.Guarded.output((4, 48), torch.float8_e4m3fn)  # 64 codes per row do not fit
    _quantize_rows(lib, x, 64, codes, 64)
    with pytest.raises(AssertionError, match="wrote outside the tensor"):
        codes.check("codes")


def test_a_read_past_a_row_sees_poison(lib):
    x = cuda_host.Guarded.copy_of(torch.randn(4, 64, dtype=torch.bfloat16)[:, :60]).tensor  # 4 poison elements a row
    codes = cuda_host.Guarded.output((4, 64), torch.float8_e4m3fn)
    scales = _quantize_rows(lib, x, 60, codes, 64)
    assert not scales.tensor.isnan().any()
    scales = _quantize_rows(lib, x, 64, codes, 64)  # told the rows are 64 long: reads the gaps
    assert scales.tensor.isnan().all()
