r"""``QNGTorch``: quantum natural gradient descent for torch parameters, with the metric
tensor computed by the device (:func:`pennylane_custatevec.metric_tensor`).

One step of each parameter tensor :math:`\theta` (flattened), with its gradient
:math:`\nabla f` and its block :math:`g` of the metric tensor, regularised as
``qml.QNGOptimizer`` does (``lam``):

.. math::

    \theta \leftarrow \theta - \eta\, (g + \lambda I)^{+} \nabla f

(:math:`^{+}`: the pseudo-inverse, as ``qml.QNGOptimizer``'s update).
"""

from __future__ import annotations

from collections.abc import Callable

import torch


class QNGTorch(torch.optim.Optimizer):
    """Quantum natural gradient descent over torch tensors.

    Args:
        params: the trainable tensors (an iterable, as every torch optimiser takes them),
            in the order of the QNode's arguments that ``metric_tensor_fn`` returns.
        metric_tensor_fn: a callable without arguments giving the metric tensor of the
            current parameters (one tensor, or a tuple with one per parameter tensor),
            for example ``lambda: pennylane_custatevec.metric_tensor(qnode)(weights)``.
        lr: the step size :math:`\\eta`.
        lam: the regularisation :math:`\\lambda` added to the metric's diagonal.

    ``step()`` reads each parameter's ``.grad`` (call ``loss.backward()`` first, or pass a
    ``closure`` that does and returns the loss).
    """

    def __init__(
        self,
        params,
        metric_tensor_fn: Callable[[], object],
        lr: float = 0.01,
        lam: float = 0.0,
    ):
        if lr <= 0:
            raise ValueError(f"lr must be positive, not {lr}")
        if lam < 0:
            raise ValueError(f"lam must be non-negative, not {lam}")
        super().__init__(params, {"lr": lr, "lam": lam})
        self.metric_tensor_fn = metric_tensor_fn

    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor] | None = None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        parameters = [p for group in self.param_groups for p in group["params"]]
        metrics = self.metric_tensor_fn()
        if not isinstance(metrics, tuple):
            metrics = (metrics,)
        if len(metrics) != len(parameters):
            raise ValueError(
                f"metric_tensor_fn gave {len(metrics)} metric tensors for {len(parameters)} "
                "parameter tensors: give it one per trainable argument, in the same order"
            )
        at = 0
        for group in self.param_groups:
            for parameter in group["params"]:
                metric = torch.as_tensor(metrics[at], dtype=torch.float64)
                at += 1
                if parameter.grad is None:
                    continue
                size = parameter.numel()
                metric = metric.reshape(size, size) + group["lam"] * torch.eye(
                    size, dtype=torch.float64
                )
                gradient = parameter.grad.reshape(-1).to(torch.float64)
                update = torch.linalg.pinv(metric) @ gradient
                parameter.sub_(group["lr"] * update.reshape(parameter.shape).to(parameter.dtype))
        return loss
