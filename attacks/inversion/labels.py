"""Label inference from a single-example gradient (iDLG, Zhao et al. 2020).

For cross-entropy on softmax outputs ``p`` with one-hot target ``y``, the
gradient of the loss w.r.t. the last layer's logits is ``p - y``: negative only
at the true class. Hence

* the last layer's **bias** gradient equals ``p - y`` and its only negative
  entry is the true class (exact for any network), and
* row ``k`` of the last layer's **weight** gradient is ``(p_k - y_k) h`` with
  ``h`` the layer input; when ``h >= 0`` (after ReLU / sigmoid) only the true
  class row is negative, so its row sum is the smallest (the iDLG rule,
  ``argmin_k sum_j dW_kj``).

We use the bias when the last layer has one and the weight rows otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def last_layer_gradients(gradient: Sequence[Tensor], num_classes: int) -> tuple[Tensor, Tensor | None]:
    """Locate the last fully connected layer's weight and (optional) bias gradients.

    The weight is the last 2-D tensor with ``num_classes`` rows; its bias is the
    tensor right after it if that has shape ``(num_classes,)``.

    Raises
    ------
    ValueError
        If no 2-D tensor with ``num_classes`` rows exists in ``gradient``.
    """
    if num_classes < 2:
        raise ValueError(f"num_classes must be >= 2, got {num_classes}")
    grads = list(gradient)
    for i in range(len(grads) - 1, -1, -1):
        g = grads[i]
        if g.ndim == 2 and g.shape[0] == num_classes:
            nxt = grads[i + 1] if i + 1 < len(grads) else None
            bias = nxt if nxt is not None and tuple(nxt.shape) == (num_classes,) else None
            return g, bias
    raise ValueError(
        f"gradient must contain a last-layer weight gradient of shape ({num_classes}, d); "
        f"got shapes {[tuple(g.shape) for g in grads]}"
    )


def infer_label_from_gradient(gradient: Sequence[Tensor], num_classes: int) -> int:
    """The true label of a single-example cross-entropy gradient (iDLG rule).

    Parameters
    ----------
    gradient : sequence of Tensor
        Gradient per trainable parameter, last layer last (``named_parameters`` order).
    num_classes : int
        Number of classes.

    Returns
    -------
    int
        ``argmin`` of the last-layer bias gradient if present, else ``argmin``
        of the weight-gradient row sums.
    """
    weight, bias = last_layer_gradients(gradient, num_classes)
    scores = bias if bias is not None else weight.sum(dim=1)
    return int(torch.argmin(scores.detach()).item())
