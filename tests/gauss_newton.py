"""The exact Gauss-Newton form of a causal LM's mean cross-entropy along a perturbation of one layer's output, the
truth that the planner's and the bench's sampled-label estimates of LD are tested against."""

import torch


def gauss_newton_along(model, layer, error: torch.Tensor, batch: torch.Tensor) -> float:
    """1/2 e^T G e of the mean cross-entropy on the window batch: (1/2N) sum_t dz_t^T (diag(p_t) - p_t p_t^T) dz_t,
    dz = J e the logits' change along e added to `layer`'s output (central difference in float64, step 1e-2 of e:
    its O(step^2) error is far below any test's tolerance)."""
    step = 1e-2

    def logits_with(sign: float) -> torch.Tensor:
        handle = layer.register_forward_hook(lambda mod, args, y: y + sign * step * error.to(y.dtype))
        try:
            with torch.no_grad():
                return model(batch[:, :-1]).double()
        finally:
            handle.remove()
    with torch.no_grad():
        logits = model(batch[:, :-1]).double()
    dz = ((logits_with(1.0) - logits_with(-1.0)) / (2 * step)).reshape(-1, logits.shape[-1])
    p = logits.reshape(-1, logits.shape[-1]).softmax(-1)
    quad = (p * dz.pow(2)).sum(-1) - (p * dz).sum(-1).pow(2)
    return float(quad.sum()) / (2 * dz.shape[0])
