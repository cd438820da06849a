"""The local losses of MAPL's PML step, written in log-space so no temperature overflows.

All three contrastive-style losses follow the MAPL paper's public code in what they compute:
- supervised contrastive: for each anchor, −log(Σ_positives e^{s/τ} / Σ_all-but-itself e^{s/τ})
  with s the cosine of normalised projections (two views of a batch; same label = positive);
- sample-to-prototype: cross-entropy over the cosines of a projection to every class prototype
  divided by τ. The reference computes e^{s}/τ, where τ cancels; its effective temperature is 1;
- prototype uniformity: mean over prototypes k of Σ_{k'≠k} e^{ξ_k·ξ_k'/τ} on unit prototypes,
  small when the prototypes spread over the hypersphere.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = [
    "supervised_contrastive",
    "prototype_alignment",
    "prototype_uniformity",
    "prototype_logits",
    "distillation",
    "ensemble_logits",
]


def supervised_contrastive(projections: torch.Tensor, labels: torch.Tensor, temperature: float) -> torch.Tensor:
    """Mean over anchors of −log(positive mass / all mass except the anchor itself)."""
    if projections.shape[0] != labels.shape[0]:
        raise ValueError(f"{projections.shape[0]} projections for {labels.shape[0]} labels")
    z = F.normalize(projections, dim=1)
    logits = z @ z.T / temperature
    self_mask = torch.eye(len(labels), dtype=torch.bool, device=z.device)
    positive = (labels[:, None] == labels[None, :]) & ~self_mask
    has_positive = positive.any(dim=1)
    minus_inf = torch.finfo(logits.dtype).min
    log_all = torch.logsumexp(logits.masked_fill(self_mask, minus_inf), dim=1)
    log_positive = torch.logsumexp(logits.masked_fill(~positive, minus_inf), dim=1)
    # An anchor whose label occurs once has no positive; it contributes nothing (not -inf).
    losses = (log_all - log_positive)[has_positive]
    return losses.mean() if losses.numel() else logits.sum() * 0.0


def prototype_logits(projections: torch.Tensor, prototypes: torch.Tensor) -> torch.Tensor:
    """Cosine of every projection to every class prototype (batch × classes)."""
    return F.normalize(projections, dim=1) @ F.normalize(prototypes, dim=1).T


def prototype_alignment(
    projections: torch.Tensor, labels: torch.Tensor, prototypes: torch.Tensor, temperature: float
) -> torch.Tensor:
    """Cross-entropy of the sample-to-prototype cosines: pulls a sample to its class prototype."""
    return F.cross_entropy(prototype_logits(projections, prototypes) / temperature, labels)


def prototype_uniformity(prototypes: torch.Tensor, temperature: float) -> torch.Tensor:
    """Mean over prototypes of Σ_{k'≠k} exp(cos(ξ_k, ξ_k') / τ)."""
    xi = F.normalize(prototypes, dim=1)
    similarity = torch.exp(xi @ xi.T / temperature)
    off_diagonal = ~torch.eye(len(xi), dtype=torch.bool, device=xi.device)
    return (similarity * off_diagonal).sum(dim=1).mean()


def distillation(
    student: torch.Tensor, teacher: torch.Tensor, temperature: float, where: torch.Tensor | None = None
) -> torch.Tensor:
    """Hinton's knowledge distillation: T² · KL(softmax(teacher / T) ‖ softmax(student / T)),
    averaged over the batch (over all of it, whichever samples `where` keeps: a teacher that
    is better on fewer samples teaches less). The T² keeps its gradient on the scale of a
    cross-entropy's as T grows. Gradients flow into `student` only if the caller detaches `teacher`."""
    if student.shape != teacher.shape:
        raise ValueError(f"student logits {tuple(student.shape)} and teacher logits {tuple(teacher.shape)} differ")
    log_student = F.log_softmax(student / temperature, dim=1)
    log_teacher = F.log_softmax(teacher / temperature, dim=1)
    if where is None:
        return F.kl_div(log_student, log_teacher, reduction="batchmean", log_target=True) * temperature**2
    per_sample = F.kl_div(log_student, log_teacher, reduction="none", log_target=True).sum(dim=1)
    return (per_sample * where).sum() / len(per_sample) * temperature**2


def better_on_label(teacher: torch.Tensor, student: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """1.0 on the samples where `teacher` gives the true label more probability than `student`
    does, 0.0 elsewhere (no gradient): where a teacher may teach."""
    with torch.no_grad():
        rows = torch.arange(len(labels), device=labels.device)
        return (F.log_softmax(teacher, dim=1)[rows, labels] > F.log_softmax(student, dim=1)[rows, labels]).float()


def ensemble_logits(*logits: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """log of the mean of the members' class probabilities: the ensemble's prediction, in a
    form that argmax and cross-entropy take like any logits. `weights` (one positive number a
    member, as a tensor so that it travels with a module's state): a weighted mean instead."""
    log_probabilities = torch.stack([F.log_softmax(each, dim=1) for each in logits])
    if weights is None:
        return torch.logsumexp(log_probabilities, dim=0) - math.log(len(logits))
    log_weights = torch.log(weights / weights.sum()).to(log_probabilities.dtype)
    return torch.logsumexp(log_probabilities + log_weights[:, None, None], dim=0)
