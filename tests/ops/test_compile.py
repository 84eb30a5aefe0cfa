"""torch.compile(fullgraph=True) traces converted models: custom ops with fake implementations,
no graph breaks, and the compiled model computes what the eager one does."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from bounds import assert_within, gemm_error_bound
from snip_ops import LinearPrecision, _ext, convert, linear


def _pair(precision):
    torch.manual_seed(0)
    eager = convert(nn.Sequential(nn.Linear(48, 64), nn.ReLU(), nn.Linear(64, 40)), precision)
    torch.manual_seed(0)
    compiled = convert(nn.Sequential(nn.Linear(48, 64), nn.ReLU(), nn.Linear(64, 40)), precision)
    return eager, compiled


def test_fullgraph_forward_backward_matches_eager():
    torch._dynamo.reset()
    precision = LinearPrecision(fprop="fp8", dgrad="fp4", wgrad="mxfp8")
    eager, model = _pair(precision)
    compiled = torch.compile(model, fullgraph=True)
    x = torch.randn(5, 7, 48)
    outputs = []  # each eager layer's output, for its gradient dy
    for layer in (eager[0], eager[2]):
        layer.register_forward_hook(lambda module, args, out: outputs.append(out))
    for _ in range(2):  # the SR offset changes every step: no recompilation, same numbers as eager
        outputs.clear()
        ye, yc = eager(x), compiled(x)
        assert torch.equal(ye, yc)
        *ge, dy0, dy2 = torch.autograd.grad(ye.square().sum(), [*eager.parameters(), *outputs])
        gc = torch.autograd.grad(yc.square().sum(), list(model.parameters()))
        # The weight gradients come from the same custom ops on the same bits (dy = 2y, the ReLU mask).
        assert torch.equal(ge[0], gc[0]) and torch.equal(ge[2], gc[2])
        # The bias gradient sum(dy) is a reduction that the compiler may order differently: each side
        # is within gamma_M sum|dy| of the exact sum (a column sum is the GEMM 1^T dy).
        for db_eager, db_compiled, dy in ((ge[1], gc[1], dy0), (ge[3], gc[3], dy2)):
            rows = dy.reshape(-1, dy.shape[-1])
            bound = gemm_error_bound(torch.ones(1, rows.shape[0]), rows.t()).reshape(-1)
            assert_within(db_compiled, db_eager, 2 * bound, "bias gradient")
    assert int(model[0].sr_step) == int(eager[0].sr_step) == 2


def test_blocks_with_their_own_seeds_share_one_compiled_graph():
    """`block.compile()` on identical blocks (as torchtitan and bench_step compile a model) compiles once:
    the layers' SR seeds, which differ from block to block, are tensors, not ints that dynamo would take
    for constants and compile again for, up to its recompile limit and then run eagerly. The compiled
    blocks give the eager blocks' bits, and each seed stays its own: two blocks differ."""
    torch._dynamo.reset()
    precision = LinearPrecision(fprop="fp4", dgrad="fp4", wgrad="fp4")  # SR gradients: the seeds matter

    def blocks():
        torch.manual_seed(0)
        seq = nn.Sequential(*(nn.Sequential(nn.Linear(32, 32), nn.ReLU()) for _ in range(10)))
        with torch.no_grad():  # the same weights in every block, so that only the seeds tell them apart
            for block in seq[1:]:
                block[0].load_state_dict(seq[0][0].state_dict())
        return convert(seq, precision)

    eager, compiled = blocks(), blocks()
    assert len({m[0].seed for m in compiled}) == 10
    for block in compiled:
        block.compile(backend="aot_eager")
    x = torch.randn(8, 32, requires_grad=True)  # as every later block's input: one guard set for all ten
    with torch._dynamo.config.patch(error_on_recompile=True):
        for _ in range(2):
            ye, yc = eager(x), compiled(x)
            assert torch.equal(ye, yc)
            ge = torch.autograd.grad(ye.square().sum(), [b[0].weight for b in eager])
            gc = torch.autograd.grad(yc.square().sum(), [b[0].weight for b in compiled])
            assert all(torch.equal(a, b) for a, b in zip(ge, gc, strict=True))
    one, two = (b[0] for b in eager[:2])
    y = torch.randn(8, 32)
    dy = torch.randn(8, 32)  # the same input and gradient through both blocks: their seeds alone differ
    g1, g2 = (torch.autograd.grad(m(y), m.weight, dy)[0] for m in (one, two))
    assert not torch.equal(g1, g2)


def test_functional_linear_compiles_without_graph_breaks():
    torch._dynamo.reset()
    w = torch.randn(16, 32, requires_grad=True)

    def f(x, offset):
        return linear(x, w, None, "fp4", seed=3, offset=offset)

    explanation = torch._dynamo.explain(f)(torch.randn(4, 32), torch.tensor(1))
    assert explanation.graph_break_count == 0
    compiled = torch.compile(f, fullgraph=True)
    x = torch.randn(4, 32)
    assert torch.equal(compiled(x, torch.tensor(2)), f(x, torch.tensor(2)))


@pytest.mark.skipif(not _ext.kernel_compiled("quantize", "cpu"),
                    reason="no compiled CPU quantizer (a pure-Python install): no kernel, so no self-check to run")
def test_compiling_before_any_eager_call_runs_the_self_check_eagerly():
    """The kernels' first-use self-check, first asked from inside the trace, runs once, eagerly: not
    traced (which took minutes and broke the graph). A fresh process, so that no check has run yet."""
    code = ("import torch\n"
            "from torch import nn\n"
            "from snip_ops import convert\n"
            "model = convert(nn.Sequential(nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 256)), 'fp8')\n"
            "y = torch.compile(model, fullgraph=True, backend='aot_eager')(torch.randn(64, 256))\n"
            "y.sum().backward()\n"
            "from snip_ops import self_check\n"
            "assert self_check._results and all(self_check._results.values()), self_check._results\n")
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]


def test_constant_mark_is_torchs_and_importing_snip_leaves_dynamo_and_fsdp_out():
    """_ext marks its per-process constants as torch.compiler.assume_constant_result does, without importing
    torch._dynamo (seconds per process): the mark must stay the one dynamo reads; and a layer's ops import it
    only where it is loaded already (linear._outside_dynamo). snip_ops.fsdp and snip_ops.tensor_parallel,
    which import torch's FSDP and DTensor, load at their first use; the planner never imports them itself."""
    def ours():
        return 1

    def torchs():
        return 1

    assert vars(_ext._constant(ours)) == vars(torch._dynamo.assume_constant_result(torchs)) != {}
    code = ("import sys, snip_ops, snip_train\n"
            "assert 'torch._dynamo' not in sys.modules and 'torch.distributed.fsdp' not in sys.modules\n"
            "assert 'torch.distributed.tensor' not in sys.modules\n"
            "snip_ops.SnipLinear(16, 8, precision='fp8')(__import__('torch').randn(4, 16)).sum().backward()\n"
            "assert 'torch.distributed.tensor' not in sys.modules  # a layer of plain weights needs no DTensor\n"
            "assert 'torch._dynamo' not in sys.modules  # nor, without compiled code, dynamo\n"
            "import planner.controller, planner.fsdp\n"
            "with planner.fsdp.unsharded_for_planning(__import__('torch').nn.Linear(2, 2), None):\n    pass\n"
            "assert 'torch.distributed.tensor' not in sys.modules  # nor the planner, without sharded models\n"
            "assert snip_ops.fsdp.enable_low_precision_all_gather and 'torch.distributed.fsdp' in sys.modules\n"
            "from snip_ops import fsdp\n"
            "assert fsdp is snip_ops.fsdp\n"
            "try:\n    snip_ops.no_such_name\nexcept AttributeError as e:\n    assert 'no_such_name' in str(e)\n"
            "else:\n    sys.exit('no AttributeError')\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
