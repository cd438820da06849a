"""BatchNorm's running statistics, recomputed for the weights a node serves.

In training mode a BatchNorm layer normalises with the batch's own statistics and moves its
running averages 10 % toward them (momentum 0.1); in evaluation mode it normalises with those
averages. A node with 50 training images takes two batches a round, so the averages trail the
weights by many rounds, and a mix of peers' models averages statistics each measured under
other weights than the mix's. Evaluated with them, a node's models were far under what their
weights give: after 40 rounds (mnist5k, 10 nodes, four backbones, seed 90) a ResNet pair's own
model, mixed, scored 58.8 and 65.0 % with its running statistics and 93.5 and 94.2 % with
statistics recomputed on its 50 training images; a Local MobileNet 80.5 % against 88.5. So
before every evaluation the statistics the predictors run on are recomputed, from the
node's training images under the current weights (as `torch.optim.swa_utils.update_bn` does
after averaging weights): what is evaluated, served and exported is what the weights give.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

__all__ = ["STATISTICS_IMAGES", "refresh_statistics"]

# At most this many of the node's training images are run to recompute the statistics (a
# forward pass in batches of `batch_size`): the estimate of a mean and a variance per channel
# needs no more, and a node with many images pays one bounded pass an evaluation.
STATISTICS_IMAGES = 1024


@torch.no_grad()
def refresh_statistics(
    run: Callable[[torch.Tensor], Any],
    model: nn.Module,
    images: torch.Tensor,
    batch_size: int = 512,
    limit: int | None = STATISTICS_IMAGES,
) -> None:
    """Recompute, as the plain average over `images[:limit]` (one pass of `run` in training
    mode), the running statistics of every BatchNorm layer of `model` that `run` goes through;
    layers it does not run (a projector only training uses) keep theirs. `model` is put in
    training mode meanwhile. The same weights and images give the same statistics: calling it
    again changes nothing. Fewer than two images (a batch of one has no variance) leave them as
    they are; a last batch of one joins the one before."""
    images = images if limit is None else images[:limit]
    layers = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]
    if len(images) < 2 or not layers:
        return
    batches = list(images.split(batch_size))
    if len(batches[-1]) < 2:
        batches[-2:] = [torch.cat(batches[-2:])]
    momenta = {layer: layer.momentum for layer in layers}
    restarted: set[nn.Module] = set()

    def restart(layer: nn.Module, _inputs: Any) -> None:
        if layer not in restarted:  # its first batch: a cumulative average from here
            restarted.add(layer)
            layer.reset_running_stats()
            layer.momentum = None

    hooks = [layer.register_forward_pre_hook(restart) for layer in layers]
    was_training = model.training
    model.train()
    try:
        for batch in batches:
            run(batch)
    finally:
        for hook in hooks:
            hook.remove()
        for layer, momentum in momenta.items():
            layer.momentum = momentum
        model.train(was_training)
