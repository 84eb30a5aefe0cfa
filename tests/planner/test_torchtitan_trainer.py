"""SnipTrainer end to end: torchtitan's own Trainer.train() on the debug Llama, on the CPU, in one process.

What torchtitan's debug job reads from its source tree (not in the package) is made here: a byte-level
BPE tokenizer (`tokenizer.json` + `tokenizer_config.json`, trained on the test's text in well under a
second) and a local json-lines text set that the registered "c4_test" dataset loads from
`--dataloader.dataset_path`. Three things are set up for the CPU that a GPU job has already:

* the device: torchtitan 0.3.0 takes "cuda" when no accelerator exists (tools/utils.get_device_info)
  and has no switch for the CPU, so `cpu_device` points its module-level device at the CPU (the gloo
  backend, a device module for the calls it makes); everything else is torchtitan's code;
* the attention: the debug Llama's FlexAttention has no backward on the CPU; the test swaps it for
  torchtitan's SDPA attention (causal over the whole window);
* a one-process "world" (gloo, from RANK/WORLD_SIZE/MASTER_ADDR), in which torchtitan applies FSDP2.
"""

import json
import math
import socket
import types

import pytest
import torch

pytest.importorskip("torchtitan")
datasets = pytest.importorskip("datasets")
tokenizers = pytest.importorskip("tokenizers")

import torch.distributed as dist  # noqa: E402
import torchtitan.components.metrics  # noqa: E402
import torchtitan.distributed.parallel_dims  # noqa: E402
import torchtitan.distributed.utils  # noqa: E402
import torchtitan.tools.profiler  # noqa: E402
import torchtitan.tools.utils  # noqa: E402
from torchtitan.config import ConfigManager  # noqa: E402
from torchtitan.models.common.attention import FlexAttention, ScaledDotProductAttention  # noqa: E402
from torchtitan.models.llama3.config_registry import llama3_debugmodel  # noqa: E402

from planner import Plan  # noqa: E402
from planner.integrations.torchtitan import SnipTrainer, TitanSnipLinear  # noqa: E402
from planner.fsdp import unsharded_for_planning  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

WORDS = ("the planner measures each linear layer and chooses fp8 or fp4 for its forward input gradient and "
         "weight gradient from loss and weight divergences under a budget of low precision flops").split()


class CpuDeviceModule:
    """The calls torchtitan makes on its device module (torch.cuda's names), answered for the CPU."""

    @staticmethod
    def set_device(device): pass

    @staticmethod
    def device_count(): return 1

    @staticmethod
    def current_device(): return 0

    @staticmethod
    def synchronize(device=None): pass

    @staticmethod
    def get_device_name(device=None): return "cpu"

    @staticmethod
    def get_device_properties(device=None): return types.SimpleNamespace(total_memory=2**30)

    @staticmethod
    def memory_stats(device=None): return {}  # the monitor reports -1 for what it cannot read

    @staticmethod
    def reset_peak_memory_stats(device=None): pass

    @staticmethod
    def empty_cache(): pass


@pytest.fixture
def cpu_device(monkeypatch):
    """torchtitan's device is the CPU: its modules read `device_type` / `device_module` imported by name."""
    for module in (torchtitan.tools.utils, torchtitan.components.metrics, torchtitan.distributed.utils,
                   torchtitan.distributed.parallel_dims):
        monkeypatch.setattr(module, "device_type", "cpu")
    for module in (torchtitan.tools.utils, torchtitan.components.metrics, torchtitan.distributed.utils,
                   torchtitan.tools.profiler):
        monkeypatch.setattr(module, "device_module", CpuDeviceModule)


@pytest.fixture
def one_process_world(monkeypatch):
    """The environment torchrun gives one process; torchtitan creates (and the test destroys) the group.
    torchtitan also sets NCCL variables and turns autograd's device threads off: both are put back."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for name, value in dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                            MASTER_PORT=str(port)).items():
        monkeypatch.setenv(name, value)
    for name in ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_DUMP_ON_TIMEOUT",
                 "TORCH_FR_DUMP_TEMP_FILE"):
        monkeypatch.delenv(name, raising=False)
    multithreading = torch.autograd.is_multithreading_enabled()
    yield
    if dist.is_initialized():
        dist.destroy_process_group()
    torch.autograd.set_multithreading_enabled(multithreading)


def documents(n: int = 64) -> list[str]:
    gen = torch.Generator().manual_seed(0)
    return [" ".join(WORDS[i] for i in torch.randint(0, len(WORDS), (int(length),), generator=gen))
            for length in torch.randint(20, 60, (n,), generator=gen)]


def write_tokenizer(folder, texts) -> None:
    """A byte-level BPE (GPT-2 style) of 300 tokens with BOS/EOS, as torchtitan's HuggingFaceTokenizer loads it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|bos|>", "<|eos|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    folder.mkdir()
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<|bos|>", "eos_token": "<|eos|>"}))


def write_dataset(folder, texts) -> None:
    """A local text set in c4's form ({"text": ...} per line), loaded by `datasets.load_dataset(folder)`."""
    folder.mkdir()
    (folder / "train.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))


def planner_job(tmp_path, *args: str) -> SnipTrainer.Config:
    config = ConfigManager().parse_args([
        "--module", "planner.integrations.torchtitan", "--config", "llama3_debugmodel_snip_planner",
        "--hf_assets_path", str(tmp_path / "tokenizer"), "--dataloader.dataset_path", str(tmp_path / "c4_test"),
        "--dump_folder", str(tmp_path / "out"), "--training.local_batch_size", "2", "--training.seq_len", "32",
        *args])
    for _, _, parent, attr in list(config.model_spec.model.traverse(FlexAttention.Config)):
        setattr(parent, attr, ScaledDotProductAttention.Config())
    return config


def precisions(model) -> dict[str, str]:
    return {n: str(m.precision) for n, m in model.named_modules() if isinstance(m, TitanSnipLinear)}


def test_snip_trainer_trains_and_replans_end_to_end(tmp_path, monkeypatch, cpu_device, one_process_world):
    texts = documents()
    write_tokenizer(tmp_path / "tokenizer", texts)
    write_dataset(tmp_path / "c4_test", texts)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "datasets_cache"))
    config = planner_job(tmp_path, "--training.steps", "4", "--snip.interval", "2")
    assert not config.checkpoint.enable and not config.compile.enable and not config.validator.enable

    trainer = config.build()
    assert isinstance(trainer, SnipTrainer)
    model = trainer.model_parts[0]
    assert set(precisions(model).values()) == {"bf16"}

    # Per step: the loss torchtitan computed, the precisions its forward/backward ran in, and how many
    # low-precision forwards each layer ran (its SR counter; the planner's passes run in high precision).
    steps = []
    forward_backward = trainer.forward_backward_step

    optimizer = trainer.snip_planner.optimizer
    lrs = []

    def recorded(**kwargs):
        lrs.append(optimizer.param_groups[0]["lr"] / optimizer.param_groups[0]["initial_lr"])
        counters = {n: m.sr_step.item() for n, m in model.named_modules() if isinstance(m, TitanSnipLinear)}
        ran_in = precisions(model)
        loss = forward_backward(**kwargs)
        ran = {n: m.sr_step.item() - counters[n] for n, m in model.named_modules() if isinstance(m, TitanSnipLinear)}
        steps.append({"step": trainer.step, "loss": loss.item(), "precisions": ran_in, "forwards": ran})
        return loss

    monkeypatch.setattr(trainer, "forward_backward_step", recorded)
    try:
        trainer.train()
    finally:
        trainer.close()

    assert [s["step"] for s in steps] == [1, 2, 3, 4]
    # WD's horizon looks ahead along the schedule each step's update runs at, and no further than the last step
    schedule = trainer.snip_planner.lr_schedule
    assert [schedule(s) for s in (1, 2, 3, 4)] == pytest.approx(lrs, rel=1e-12) and schedule(5) == 0.0
    assert all(math.isfinite(s["loss"]) for s in steps)
    history = trainer.snip_planner.history
    assert [h["step"] for h in history] == [1, 3]  # the first step, then every 2 steps
    assert all(h["fp4_fraction"] >= 0.75 for h in history)
    first, _, second, _ = (s["precisions"] for s in steps)
    gemm_precisions = {p for v in first.values() for p in v.split("/")}  # a per-GEMM plan's "fprop/dgrad/wgrad"
    assert "bf16" not in gemm_precisions and {"fp4", "fp8"} <= gemm_precisions
    assert steps[1]["precisions"] == first  # no re-plan at step 2
    assert second != first  # step 3's plan moved layers (Adam's moments now weigh the update)
    for s in steps:  # every step ran in the precisions installed before it, each layer's forward once
        assert all(count == 1 for count in s["forwards"].values())
    plan = Plan.load(tmp_path / "out" / "snip_plan.json")
    assert plan.step == 3 and {n: str(p) for n, p in plan.precisions.items()} == second
    assert "adam state" in plan.stats.preconditioner  # read through the unsharded view of AdamW


def test_planner_job_refuses_what_the_planner_cannot_measure():
    config = llama3_debugmodel()  # selective activation checkpointing and a chunked loss
    config.training.disable_cuda_graphs = True
    with pytest.raises(ValueError, match="activation checkpointing off"):
        SnipTrainer.Config.of(config)
    config.activation_checkpoint = None
    with pytest.raises(ValueError, match="not chunked"):
        SnipTrainer.Config.of(config)


def test_unsharded_for_planning_without_fsdp_is_the_optimizer_itself():
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters())
    with unsharded_for_planning(model, optimizer) as planning_optimizer:
        assert planning_optimizer is optimizer
