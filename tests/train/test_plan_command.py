"""`snip plan`: an offline plan for a Hugging Face Llama (built from a config, saved with save_pretrained)
and for a snip preset with the weights of `snip train --save`; the plan meets its budget, names the
model's layers, converts the model and drives `snip train --precision`."""

import dataclasses
import json
from fractions import Fraction

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from planner import Plan, PlannerConfig  # noqa: E402
from snip_ops import convert  # noqa: E402
from snip_ops.formats import GEMMS, recipe  # noqa: E402
from snip_train import cli  # noqa: E402
from snip_train.model import LlamaConfig  # noqa: E402
from snip_train.plan_command import (LLAMA_FAMILY, calibration_batches, causal_lm_logits,  # noqa: E402
                                     causal_lm_loss, load_hf_model, load_preset_model, plan_offline, read_tokens,
                                     run_plan_command)

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 64
TINY = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, max_position_embeddings=32, head_dim=16,
            pad_token_id=None, bos_token_id=None, eos_token_id=None)  # the defaults' ids lie outside VOCAB
CALIBRATION = ["--batches", "2", "--batch-size", "4", "--seq-len", "16", "--threads", "1"]
WORDS = "the planner measures every layer and solves an integer program at the budget".split()


def _save_hf(directory, model_type="llama"):
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(model_type, **TINY)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(directory)
    return directory


def _text(n_words: int, seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    return " ".join(WORDS[i] for i in rng.integers(0, len(WORDS), n_words)) + "\n"


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return _save_hf(tmp_path_factory.mktemp("hf"))


@pytest.fixture(scope="module")
def token_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "tokens.npy"
    np.save(path, np.random.default_rng(0).integers(0, VOCAB, 4000).astype(np.int32))
    return path


def _plan_args(*argv):
    return cli.build_parser().parse_args(["plan", *map(str, argv)])


def _linear_names(model):
    return {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and n != "lm_head"}


def _fp4_fraction(plan: Plan, model) -> Fraction:
    """FP4 GEMMs' share of the linear FLOPs: every GEMM of a layer has 2 M N K FLOPs, M the same for all."""
    mods = dict(model.named_modules())
    size = {n: mods[n].in_features * mods[n].out_features for n in plan.precisions}
    fp4 = sum(size[n] for n, p in plan.precisions.items() for g in GEMMS if p.gemm(g).name == "fp4")
    return Fraction(fp4, 3 * sum(size.values()))


def _relative_cost(plan: Plan, model) -> Fraction:
    """The theoretical cost (FLOPs / the recipe's speed-up over bf16) relative to all-bf16, exactly."""
    mods = dict(model.named_modules())
    size = {n: mods[n].in_features * mods[n].out_features for n in plan.precisions}
    cost = sum(Fraction(size[n]) / Fraction(recipe(p.gemm(g).name).speedup)
               for n, p in plan.precisions.items() for g in GEMMS)
    return cost / (3 * sum(size.values()))


# ---------------------------------------------------------------------------------------
# a Hugging Face Llama
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("budget,granularity", [("fp4=0.75", "layer"), ("cost=0.3", "layer"), ("fp4=0.75", "gemm")])
def test_hf_plan_meets_the_budget_and_converts_the_model(hf_dir, token_file, tmp_path, capsys, budget, granularity):
    out = tmp_path / "plan"
    rc = cli.main(["plan", "--hf", str(hf_dir), "--data", str(token_file), "--budget", budget,
                   "--granularity", granularity, "--out", str(out), *CALIBRATION])
    assert rc == 0
    text = capsys.readouterr().out
    plan = Plan.load(out / "plan.json")
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, local_files_only=True)
    assert set(plan.precisions) == _linear_names(model)  # the HF model's FQNs, the output head excepted
    assert plan.granularity == granularity and plan.stats is not None
    for name in plan.precisions:
        assert name in text  # the table
    assert "fprop" in text and "no optimizer state" in text
    assert (out / "plan.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if budget.startswith("fp4"):
        assert _fp4_fraction(plan, model) >= Fraction(3, 4)
    else:
        assert _relative_cost(plan, model) <= Fraction(3, 10)
    assert any(p.fprop.name == "fp4" for p in plan.precisions.values())

    convert(model, Plan.load(out / "plan.json").precisions)
    for name, precision in plan.precisions.items():
        assert model.get_submodule(name).precision == precision
    window = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(0))
    loss = causal_lm_loss(model, window)
    loss.backward()
    assert torch.isfinite(loss) and model.model.layers[0].mlp.down_proj.weight.grad is not None


def test_hf_plan_on_text_with_the_directorys_tokenizer(tmp_path, capsys):
    tokenizers = pytest.importorskip("tokenizers")
    hf = _save_hf(tmp_path / "hf")
    vocab = {w: i for i, w in enumerate(["[UNK]", *WORDS])}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")
    tokenizer.save_pretrained(hf)
    data = tmp_path / "calib.txt"
    data.write_text(_text(600))

    assert cli.main(["plan", "--hf", str(hf), "--data", str(data), "--out", str(tmp_path / "out"), *CALIBRATION]) == 0
    assert "model.layers.1.mlp.up_proj" in capsys.readouterr().out
    ids = read_tokens(data, VOCAB, lambda s: tokenizer(s, add_special_tokens=False)["input_ids"])
    assert ids.tolist() == [vocab[w] for w in data.read_text().split()]  # words, not bytes


def test_text_needs_a_tokenizer(hf_dir, tmp_path):
    data = tmp_path / "calib.txt"
    data.write_text(_text(600))
    with pytest.raises(ValueError, match="has no tokenizer.*npy"):
        run_plan_command(_plan_args("--hf", hf_dir, "--data", data, "--out", tmp_path / "out", *CALIBRATION))


@pytest.mark.parametrize("model_type", LLAMA_FAMILY)
def test_every_llama_family_type_plans(tmp_path, model_type):
    model = load_hf_model(_save_hf(tmp_path, model_type)).train()
    batches = calibration_batches(np.arange(400) % VOCAB, 1, 2, 8)
    plan, _ = plan_offline(model, batches, PlannerConfig(), loss_fn=causal_lm_loss, logits_fn=causal_lm_logits)
    assert set(plan.precisions) == _linear_names(model) and plan.metrics["fp4_fraction"] >= 0.75
    assert causal_lm_logits(model, batches[0]).shape == (2, 8, VOCAB)


def test_pinned_layers_keep_their_precision(hf_dir, token_file, tmp_path):
    out = tmp_path / "plan"
    assert cli.main(["plan", "--hf", str(hf_dir), "--data", str(token_file), "--pin", "model.layers.0.*=fp8",
                     "--pin", "model.layers.1.mlp.down_proj=bf16", "--budget", "fp4=0.3", "--out", str(out),
                     *CALIBRATION]) == 0
    plan = Plan.load(out / "plan.json")
    assert {str(p) for n, p in plan.precisions.items() if n.startswith("model.layers.0.")} == {"fp8"}
    assert str(plan.precisions["model.layers.1.mlp.down_proj"]) == "bf16"


def test_hf_directory_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such directory"):
        load_hf_model(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_hf_model(tmp_path)
    transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2).save_pretrained(tmp_path / "gpt2")
    with pytest.raises(ValueError, match="'gpt2' is not a Llama-family.*accepts llama"):
        load_hf_model(tmp_path / "gpt2")


def test_bad_arguments_fail_before_measuring(hf_dir, token_file, tmp_path, monkeypatch):
    """Each is a UsageError (a ValueError: `snip: error: ...`, exit status 2) raised before any measurement."""
    monkeypatch.setattr("snip_train.plan_command.plan_offline", None)  # a case that got there: TypeError
    common = ("--data", token_file, "--out", tmp_path / "out")
    cases = [
        (("--hf", tmp_path / "missing", *common, "--budget", "fp4:0.75"),
         "cannot parse budget 'fp4:0.75'; write 'fp4=0.75'"),
        (("--hf", hf_dir, *common, "--budget", "fp4=1.5"), "fraction must be in"),
        (("--hf", hf_dir, *common, "--candidates", "fp8,fp5"), "fp5"),
        (("--hf", hf_dir, *common, "--pin", "model.layers.0.*"), "--pin expects PATTERN=PRECISION"),
        (("--hf", hf_dir, *common, "--pin", "layers.0.*=fp8"),
         "'layers.0.\\*' matches no planned layer; .*'model.layers.0"),
        (("--hf", hf_dir, *common, "--pin", "model.layers.0.*=mxfp4"),
         "must be a candidate or bf16 \\(bf16, fp4, fp8\\)"),
        (("--preset", "tiny", *common), "--preset needs --weights"),
        (("--hf", hf_dir, "--weights", token_file, *common), "--weights goes with --preset"),
        (("--hf", hf_dir, "--data", tmp_path / "none.npy", "--out", tmp_path / "out"), "--data .*: no such file"),
        (("--hf", hf_dir, *common, "--seq-len", "64"), "--seq-len 64 exceeds the model's context length 32"),
        (("--hf", hf_dir, *common, "--batches", "0"), "must be >= 1"),
        (("--hf", hf_dir, *common, "--wd-horizon", "0"), "wd_horizon must be"),
        (("--hf", hf_dir, "--preset", "tiny", *common), "not allowed with argument --hf"),
    ]
    for argv, message in cases:
        with pytest.raises(ValueError, match=message):
            run_plan_command(_plan_args(*argv))
    assert not (tmp_path / "out").exists()


def test_an_infeasible_budget_is_a_usage_error(hf_dir, token_file, tmp_path, capsys):
    argv = ["plan", "--hf", str(hf_dir), "--data", str(token_file), "--out", str(tmp_path / "out"),
            "--candidates", "fp8", *CALIBRATION]
    assert cli.main(argv) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "snip: error: --budget fp4=0.75: budget 'at least 75% of linear FLOPs in FP4' needs a 4-bit candidate; "
        "got ['fp8']")


def test_an_unknown_wd_horizon_is_refused(hf_dir, token_file, tmp_path, capsys):
    """Before anything is loaded; "run_end" (WD priced at the run's end) is no longer a horizon."""
    argv = ["plan", "--hf", str(hf_dir), "--data", str(token_file), "--out", str(tmp_path / "out"),
            "--wd-horizon", "run_end", *CALIBRATION]
    assert cli.main(argv) == 2
    assert "expected 'interval', 'settled' or a number of steps, got 'run_end'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_unreadable_data(tmp_path):
    np.save(tmp_path / "matrix.npy", np.zeros((4, 4), np.int32))
    with pytest.raises(ValueError, match="1-D integer token array"):
        read_tokens(tmp_path / "matrix.npy", VOCAB)
    np.save(tmp_path / "big.npy", np.array([0, 5, VOCAB], np.int64))
    with pytest.raises(ValueError, match=r"token ids span \[0, 64\], the model's vocabulary is \[0, 64\)"):
        read_tokens(tmp_path / "big.npy", VOCAB)
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(ValueError, match="not UTF-8 text"):
        read_tokens(tmp_path / "latin1.txt", VOCAB, tokenize=lambda s: [0])
    assert read_tokens(tmp_path / "latin1.txt", 256).tolist() == list(b"caf\xe9")  # bytes, without a tokenizer
    with pytest.raises(FileNotFoundError, match="no such file"):
        read_tokens(tmp_path / "missing.bin", VOCAB)
    np.array([3, 1, 4, 1, 5], np.uint16).tofile(tmp_path / "tokens.bin")
    assert read_tokens(tmp_path / "tokens.bin", VOCAB).tolist() == [3, 1, 4, 1, 5]
    assert read_tokens(tmp_path / "tokens.bin", VOCAB, token_dtype="uint8").tolist() == [3, 0, 1, 0, 4, 0, 1, 0, 5, 0]


def test_calibration_batches_are_seeded_windows_of_the_stream():
    tokens = np.arange(1000)
    batches = calibration_batches(tokens, 3, 4, 16, seed=5)
    assert len(batches) == 3 and all(b.shape == (4, 17) and b.dtype == torch.int64 for b in batches)
    for b in batches:
        assert torch.equal(b - b[:, :1], torch.arange(17).expand(4, 17))  # contiguous windows
    again = calibration_batches(tokens, 3, 4, 16, seed=5)
    assert all(torch.equal(a, b) for a, b in zip(batches, again))
    assert not torch.equal(calibration_batches(tokens, 1, 4, 16, seed=6)[0], batches[0])
    assert calibration_batches(np.arange(17), 1, 2, 16)[0].tolist() == [list(range(17))] * 2  # one window fits
    with pytest.raises(ValueError, match="holds 16 tokens; a calibration window needs 17"):
        calibration_batches(np.arange(16), 1, 1, 16)
    with pytest.raises(ValueError, match=">= 1"):
        calibration_batches(tokens, 0, 4, 16)


# ---------------------------------------------------------------------------------------
# a snip preset with the weights of `snip train --save`
# ---------------------------------------------------------------------------------------
def test_preset_plan_drives_snip_train(tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(_text(4000))
    run = ["--preset", "tiny", "--steps", "2", "--batch-size", "2", "--seq-len", "32", "--corpus", str(corpus),
           "--eval-interval", "0", "--eval-batches", "1", "--no-progress", "--threads", "1"]
    assert cli.main(["train", *run, "--save", "--out", str(tmp_path / "trained")]) == 0
    weights = tmp_path / "trained" / "model.pt"

    assert cli.main(["plan", "--preset", "tiny", "--weights", str(weights), "--data", str(corpus),
                     "--budget", "fp4=0.75", "--out", str(tmp_path / "plan"), "--batches", "2", "--batch-size", "2",
                     "--seq-len", "32", "--threads", "1"]) == 0
    plan = Plan.load(tmp_path / "plan" / "plan.json")
    model = load_preset_model("tiny", weights)
    assert set(plan.precisions) == _linear_names(model) and _fp4_fraction(plan, model) >= Fraction(3, 4)

    capsys.readouterr()
    assert cli.main(["train", *run, "--precision", str(tmp_path / "plan" / "plan.json"),
                     "--out", str(tmp_path / "planned")]) == 0
    summary = json.loads((tmp_path / "planned" / "summary.json").read_text())
    assert summary["steps"] == 2 and not summary["diverged"]
    planned = {n: p for n, p in summary["linear_precisions"].items() if n != "lm_head"}
    assert planned == {n: p.to_json() for n, p in plan.precisions.items()}

    torch.save({"model_config": dataclasses.asdict(LlamaConfig.preset("mini")), "model": {}}, tmp_path / "mini.pt")
    with pytest.raises(ValueError, match="another shape than preset 'tiny'"):
        load_preset_model("tiny", tmp_path / "mini.pt")
    torch.save({"weights": {}}, tmp_path / "bare.pt")
    with pytest.raises(ValueError, match="not a `snip train --save` checkpoint"):
        load_preset_model("tiny", tmp_path / "bare.pt")
    with pytest.raises(ValueError, match="not readable by torch.load"):
        load_preset_model("tiny", corpus)
    with pytest.raises(FileNotFoundError, match="--weights .*: no such file"):
        load_preset_model("tiny", tmp_path / "missing.pt")
    with pytest.raises(ValueError, match="unknown model preset 'huge'"):
        load_preset_model("huge", weights)

