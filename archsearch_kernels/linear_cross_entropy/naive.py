"""Linear head + next-token cross-entropy, reference form.

    logits = x @ weight^T;   loss = mean over scored rows of (logsumexp(logits_r) - logits_r[target_r])

Rows whose target is `ignore_index` are not scored. Dimensions: N tokens (leading axes
flattened), D model width, V vocabulary.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def linear_cross_entropy_naive(x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, *,
                               ignore_index: int = -100) -> torch.Tensor:
    """Mean cross-entropy of the logits ``x @ weight.T``, computed in fp32.

    Args:
        x: [..., D] hidden states.
        weight: [V, D] output embedding.
        targets: [...] int64 class ids, `ignore_index` for unscored rows.
        ignore_index: target value that is left out of the mean.

    Returns:
        The scalar fp32 mean loss (NaN when no row is scored, as F.cross_entropy gives).
    """
    logits_NV = (x @ weight.T).flatten(0, -2)
    return F.cross_entropy(logits_NV.float(), targets.flatten(), ignore_index=ignore_index)
