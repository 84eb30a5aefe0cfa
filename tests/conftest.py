"""Shared pytest setup: the `gpu` marker, skipped cleanly on machines without CUDA, and the `threads`
marker on every test whose outcome may depend on the intra-op thread count (tests/thread_free.py)."""

import pytest
import torch

from snip_ops import _ext
from thread_free import thread_free


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped when none is available)")
    config.addinivalue_line("markers", "exhaustive: enumerates a whole input space (minutes; CI runs it once)")
    config.addinivalue_line("markers", "threads: its outcome may depend on the intra-op thread count (float "
                                       "reductions, GEMMs): CI runs it at two thread counts")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "gpu" not in item.keywords and "one_thread" not in item.fixturenames and not thread_free(item.nodeid):
            item.add_marker(pytest.mark.threads)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors: one intra-op thread is faster, and avoids oversubscribing a shared CPU.
    Test modules opt in with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def no_kept_kernel_decisions():
    """Tests patch what snip's kept kernel decisions follow from (the self-check's results, a device's arch,
    the compiled kernel set; snip_ops._ext.GateMemo): each test starts with none kept."""
    _ext.gate_changed()
