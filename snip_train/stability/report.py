"""A sweep summary as a Markdown report: the run's context, then the tables of `analysis.summarize`."""

from __future__ import annotations

import os
import platform
from typing import Any

import torch

__all__ = ["machine_info", "markdown_report"]


def machine_info(device: str = "cpu") -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    info = {
        "cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
        "torch": torch.__version__, "platform": platform.platform(),
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def _fmt(v: float | None, digits: int = 2) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


def _lr(lr: float) -> str:
    return f"{lr:g}"


def _by_lr_table(title: str, summary: dict[str, Any], cell, extra_heads: tuple[str, ...] = (),
                 extra_cells=lambda row: ()) -> list[str]:
    """A Markdown table, a row per precision and a column per learning rate: `cell(by_lr entry)`, then
    the `extra_heads` columns filled by `extra_cells(precision row)`."""
    lrs = summary["learning_rates"]
    lines = ["", f"## {title}", "",
             "| precision | " + " | ".join([f"lr {_lr(lr)}" for lr in lrs] + list(extra_heads)) + " |",
             "|---|" + "---|" * (len(lrs) + len(extra_heads))]
    for p in summary["precisions"]:
        row = summary["table"][p]
        cells = [cell(row["by_lr"][repr(lr)]) for lr in lrs] + list(extra_cells(row))
        lines.append(f"| {p} | " + " | ".join(cells) + " |")
    return lines


def _sharpness_kind(kind: str, setup: dict[str, Any]) -> str:
    """What a sharpness kind's numbers are, for table titles."""
    if kind == "epsilon":
        eps = setup["epsilon_sharpness"]["eps"]
        return f"the paper's epsilon-sharpness (Keskar et al., last token; % of 1 + f, eps = {eps:g})"
    return f"ours, {kind} directions (KL/rho^2, rho = {setup['sharpness']['rho']:g})"


def markdown_report(summary: dict[str, Any], context: dict[str, Any]) -> str:
    """`context`: title, date, command, machine, spec (SweepSpec.to_json()), wall_s, cell_s, threads, ran, reused."""
    spec, setup = context["spec"], context["spec"]["setup"]
    lrs, table = summary["learning_rates"], summary["table"]
    model, rule = setup["model"], setup["divergence"]
    lines = [
        f"# {context['title']}",
        "",
        f"- date: {context['date']}",
        f"- command: `{context['command']}`",
        f"- machine: " + ", ".join(f"{k} {v}" for k, v in context["machine"].items()),
        f"- grid: {len(spec['precisions'])} precisions x {len(lrs)} peak learning rates x {len(spec['seeds'])} seeds "
        f"= {summary['cells']} cells ({context['ran']} trained now, {context['reused']} reused); wall time of "
        f"this invocation {context['wall_s'] / 60:.1f} min; training time summed over all cells "
        f"{context['cell_s'] / 60:.1f} min (torch threads per cell: {context['threads']})",
        f"- model: Llama dim {model['dim']}, {model['n_layers']} layers, ffn {model['ffn_hidden']}; "
        f"{setup['steps']} steps of {setup['batch_size']} x {setup['seq_len']} tokens, AdamW (wd "
        f"{setup['weight_decay']}, betas {tuple(setup['betas'])}), warmup {setup['warmup_steps']} + cosine to "
        f"{setup['min_lr_ratio']} x peak, grad clip {setup['grad_clip']}; held-out loss on {setup['eval_batches']} "
        f"fixed validation batches",
        "- eXmY: every operand of every GEMM of the converted linears (not the embedding / output head), cast "
        "unscaled with RNE and saturation unless the name says otherwise; `:trunc` unscaled is the stability "
        "paper's simulation, mantissa bits masked and the exponent range clipped (`planner/stability/exmy.py`)",
        f"- divergence: non-finite loss, or EMA training loss > untrained loss + {rule['blowup_nats']} nats for "
        f"{rule['blowup_patience']} consecutive steps (online: the run stops); or final held-out loss > mean final "
        f"loss of the {summary['baseline']} runs at the same LR + {summary['baseline_nats']} nats (offline). "
        f"Spike: a step's loss > {rule['spike_ratio']} x the EMA before it (counted, not stopping)",
    ]

    def divergence(c):
        text = f"{c['diverged']}/{c['n']}" if c["n"] else "–"
        return text + (" (" + ", ".join(c["reasons"]) + ")" if c["reasons"] else "")

    def final_loss(c):
        return _fmt(c["mean_final_loss"]) + (f" ± {c['std_final_loss']:.2f}" if c["std_final_loss"] is not None else "")

    if setup.get("epsilon_sharpness"):
        eps = setup["epsilon_sharpness"]
        lines.append(
            f"- sharpness, measured every {setup['sharpness_every']} steps in high precision: ours, KL/rho^2 of the "
            f"next-token distribution over all positions (`planner/stability/sharpness.py`); and the paper's, "
            f"max over |delta_i| <= eps (|theta_i| + 1) of 100 (f(theta + delta) - f(theta)) / (1 + f(theta)), f = "
            f"cross-entropy of the last token of each held-out window, maximised by {eps['steps']} projected "
            f"sign-gradient steps of {eps['step_size']:g} box half-widths (`planner/stability/epsilon_sharpness.py`)")
    lines += _by_lr_table("Divergence rate (diverged / runs)", summary, divergence, ("overall", "stable LRs"),
                          lambda row: (_fmt(row["divergence_rate"]),
                                       ", ".join(_lr(lr) for lr in row["stable_lrs"]) or "none"))
    lines += _by_lr_table("Mean final held-out loss of the runs that did not diverge (nats/token, ± std over seeds)",
                          summary, final_loss)
    lines += _by_lr_table("Mean loss spikes per run", summary, lambda c: _fmt(c["mean_spikes"], 1))
    corr = summary["sharpness_vs_divergence"]
    if corr:
        for direction in corr:
            lines += [
                "",
                f"## Median early sharpness at step {summary['early_sharpness_step']}: "
                f"{_sharpness_kind(direction, setup)}",
                "",
                "| precision | " + " | ".join(f"lr {_lr(lr)}" for lr in lrs) + " |",
                "|---|" + "---|" * len(lrs),
            ]
            for p in summary["precisions"]:
                values = [table[p]["by_lr"][repr(lr)]["median_early_sharpness"].get(direction) for lr in lrs]
                lines.append(f"| {p} | " + " | ".join("–" if v is None else f"{v:.3g}" for v in values) + " |")
        lines += [
            "",
            f"## Early sharpness (step {summary['early_sharpness_step']}) vs later divergence",
            "",
            "Kinds: " + "; ".join(f"{d} = {_sharpness_kind(d, setup)}" for d in corr) + ". "
            "AUC = P(a diverged run had higher early sharpness than a stable one), 0.5 = no information; "
            "r = point-biserial correlation of log sharpness with divergence; Spearman = rank correlation with "
            "the final loss of runs that did not diverge. Cells that diverged before the measurement "
            "are excluded.",
            "",
            "| kind | scope | n | diverged | AUC | r (p) | Spearman vs final loss (p) |",
            "|---|---|---|---|---|---|---|",
        ]
        for direction, c in corr.items():
            scopes = [("all", c["all"])] + [(f"lr {_lr(float(lr))}", v) for lr, v in c["within_lr"].items()]
            for scope, v in scopes:
                r = "–" if v["point_biserial_r"] is None else f"{v['point_biserial_r']:.2f} ({v['point_biserial_p']:.2g})"
                s = "–" if v["spearman_final_loss"] is None else f"{v['spearman_final_loss']:.2f} ({v['spearman_final_loss_p']:.2g})"
                lines.append(f"| {direction} | {scope} | {v['n']} | {v['n_diverged']} | {_fmt(v['auc'])} | {r} | {s} |")
    agreement = summary.get("metric_agreement")
    if agreement:
        lines += [
            "",
            f"## The paper's sharpness against ours (step {summary['early_sharpness_step']})",
            "",
            "Spearman rank correlation, over the cells measured with both, of the early epsilon-sharpness with "
            "our early sharpness: 1 = the two metrics order the runs identically.",
            "",
            "| ours | n | Spearman (p) |",
            "|---|---|---|",
        ]
        for ours, v in agreement.items():
            value = "–" if v["spearman"] is None else f"{v['spearman']:.2f}" + ("" if v["p"] is None else f" ({v['p']:.2g})")
            lines.append(f"| {ours} | {v['n']} | {value} |")
    lines.append("")
    return "\n".join(lines)
