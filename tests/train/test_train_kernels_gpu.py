"""The application on the GPU kernels: a training run and `snip doctor` (marked gpu: skipped without a
CUDA device)."""

import pytest

from snip_ops import _ext
from snip_train.train import TrainConfig, train

pytestmark = pytest.mark.gpu


def test_small_model_trains_in_fp8_on_the_kernels_like_bf16():
    """200 steps of the small Llama in all-fp8 (kernels) track bf16 within 0.1 nats of final loss."""
    if not _ext.kernel_available("quantize", "cuda"):
        pytest.skip(f"quantize not compiled for this GPU: {_ext.build_info()}")
    kw = dict(preset="small", steps=200, batch_size=16, seq_len=256, lr=1e-3, eval_interval=0, eval_batches=8,
              device="cuda", progress=False)
    bf16 = train(TrainConfig(precision="bf16", **kw))
    fp8 = train(TrainConfig(precision="fp8", **kw))
    assert not fp8["diverged"]
    assert fp8["final_val_loss"] < bf16["initial_val_loss"] - 1.0
    assert abs(fp8["final_val_loss"] - bf16["final_val_loss"]) < 0.1


def test_doctor_passes_and_writes_its_evidence(tmp_path):
    from snip_train.doctor import doctor

    assert doctor(tmp_path) == 0
    (written,) = tmp_path.glob("*-doctor.json")
    assert written.stat().st_size > 0
