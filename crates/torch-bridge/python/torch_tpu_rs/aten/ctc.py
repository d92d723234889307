"""Connectionist temporal classification loss: the forward (alpha) and
backward (beta) recursions in log space, one step per time frame, every
batch element and label position at once."""

import torch

from .registry import kernel

_NEG_INF = float("-inf")


def _extended_labels(targets, target_lengths, blank, device):
    """``[N, 2 L + 1]`` labels with blanks around and between the targets
    (``L`` the longest target), from padded ``[N, L]`` targets or the
    concatenated 1-D form."""
    n = len(target_lengths)
    longest = max(target_lengths, default=0)
    if targets.dim() == 1:
        starts = [0]
        for length in target_lengths[:-1]:
            starts.append(starts[-1] + length)
        position = torch.tensor([[min(s + i, max(targets.numel() - 1, 0)) for i in range(longest)] for s in starts],
                                dtype=torch.int64, device=device).reshape(n, longest)
        padded = targets.reshape(-1)[position] if targets.numel() else torch.zeros((n, longest), dtype=torch.int64, device=device)
    else:
        padded = targets[:, :longest]
    padded = padded.to(torch.int64)
    extended = torch.full((n, 2 * longest + 1), blank, dtype=torch.int64, device=device)
    extended[:, 1::2] = padded
    return extended


def _can_skip(extended, blank):
    """Where a path may jump two positions: onto a label that is not blank
    and differs from the label two back."""
    skip = torch.zeros(extended.shape, dtype=torch.bool, device=extended.device)
    skip[:, 2:] = (extended[:, 2:] != blank) & (extended[:, 2:] != extended[:, :-2])
    return skip


def _shift(x, k, fill=_NEG_INF):
    """``x`` moved ``k`` positions along the last dim (right for positive ``k``)."""
    if k == 0:
        return x
    pad = torch.full(x.shape[:-1] + (abs(k),), fill, dtype=x.dtype, device=x.device)
    return torch.cat([pad, x[..., :-k]], -1) if k > 0 else torch.cat([x[..., -k:], pad], -1)


def _logaddexp3(a, b, c):
    m = torch.maximum(torch.maximum(a, b), c)
    safe = torch.where(m == _NEG_INF, 0, m)
    return safe + torch.log(torch.exp(a - safe) + torch.exp(b - safe) + torch.exp(c - safe))


def _setup(log_probs, targets, input_lengths, target_lengths, blank):
    input_lengths = [int(v) for v in (input_lengths.tolist() if torch.is_tensor(input_lengths) else input_lengths)]
    target_lengths = [int(v) for v in (target_lengths.tolist() if torch.is_tensor(target_lengths) else target_lengths)]
    extended = _extended_labels(targets, target_lengths, blank, log_probs.device)
    # [T, N, S]: each frame's log-probability of each extended label.
    emit = log_probs.gather(2, extended.unsqueeze(0).expand(log_probs.shape[0], -1, -1))
    lengths = torch.tensor(target_lengths, dtype=torch.int64, device=log_probs.device)
    valid = torch.arange(extended.shape[1], device=log_probs.device) < (2 * lengths + 1).unsqueeze(1)
    return input_lengths, target_lengths, extended, emit, lengths, valid


def _alphas(emit, skip, valid, input_lengths):
    """``[N, T, S]`` forward variables; frames past an input's length hold
    -inf."""
    t_max, n, s = emit.shape
    alpha = torch.full((n, s), _NEG_INF, dtype=emit.dtype, device=emit.device)
    alpha[:, :2] = emit[0, :, :2] if s > 1 else emit[0, :, :1]
    alpha = torch.where(valid, alpha, _NEG_INF)
    out = [alpha]
    for t in range(1, t_max):
        two_back = torch.where(skip, _shift(alpha, 2), _NEG_INF)
        alpha = _logaddexp3(alpha, _shift(alpha, 1), two_back) + emit[t]
        out.append(torch.where(valid, alpha, _NEG_INF))
        alpha = out[-1]
    alphas = torch.stack(out, 1) if out else torch.empty((n, 0, s), dtype=emit.dtype, device=emit.device)
    frames = torch.tensor(input_lengths, device=emit.device)
    live = torch.arange(t_max, device=emit.device) < frames.unsqueeze(1)
    return torch.where(live.unsqueeze(2), alphas, _NEG_INF)


def _final(values, lengths, input_lengths):
    """``log p(target)`` from the variables at each input's last frame: the
    paths ending on the last label or the blank after it."""
    n = values.shape[0]
    last = torch.tensor([max(t - 1, 0) for t in input_lengths], device=values.device)
    at_end = values[torch.arange(n, device=values.device), last]
    end = (2 * lengths).unsqueeze(1)
    blank_end = at_end.gather(1, end).squeeze(1)
    label_end = at_end.gather(1, (end - 1).clamp(min=0)).squeeze(1)
    label_end = torch.where(lengths > 0, label_end, _NEG_INF)
    return torch.logaddexp(blank_end, label_end)


@kernel("_ctc_loss", "_ctc_loss.Tensor")
def _ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    input_lengths, target_lengths, extended, emit, lengths, valid = _setup(
        log_probs, targets, input_lengths, target_lengths, blank)
    alphas = _alphas(emit, _can_skip(extended, blank), valid, input_lengths)
    # ctc_loss itself zeroes infinite losses for zero_infinity; the backward
    # needs to see them.
    return -_final(alphas, lengths, input_lengths), alphas


@kernel("_ctc_loss_backward", "_ctc_loss_backward.Tensor")
def _ctc_loss_backward(grad, log_probs, targets, input_lengths, target_lengths, neg_log_likelihood, log_alpha,
                       blank, zero_infinity=False):
    """PyTorch's gradient with respect to the logits behind ``log_probs``
    (which it assumes came from log_softmax):
    ``exp(lp) - exp(log Σ_{s: l'_s = c} α β + nll - lp)`` per frame, scaled
    by the incoming gradient, zero past each input's length."""
    input_lengths, target_lengths, extended, emit, lengths, valid = _setup(
        log_probs, targets, input_lengths, target_lengths, blank)
    t_max, n, s = emit.shape
    skip_ahead = _shift(_can_skip(extended, blank), -2, False)
    last = torch.tensor(input_lengths, device=emit.device) - 1
    start = valid & ((torch.arange(s, device=emit.device) >= (2 * lengths - 1).unsqueeze(1)))
    beta = torch.full((n, s), _NEG_INF, dtype=emit.dtype, device=emit.device)
    betas = [None] * t_max
    for t in range(t_max - 1, -1, -1):
        two_ahead = torch.where(skip_ahead, _shift(beta, -2), _NEG_INF)
        step = _logaddexp3(beta, _shift(beta, -1), two_ahead) + emit[t]
        begin = torch.where(start, emit[t], _NEG_INF)
        beta = torch.where((last == t).unsqueeze(1), begin, torch.where((last > t).unsqueeze(1), step, _NEG_INF))
        beta = torch.where(valid, beta, _NEG_INF)
        betas[t] = beta
    if t_max == 0:
        return torch.zeros_like(log_probs)
    both = log_alpha.transpose(0, 1)[: t_max] + torch.stack(betas, 0)  # [T, N, S]
    # log Σ over the positions holding each class, with a per-class shift.
    index = extended.unsqueeze(0).expand(t_max, -1, -1)
    top = torch.full(log_probs.shape, _NEG_INF, dtype=log_probs.dtype, device=log_probs.device)
    top = top.scatter_reduce(2, index, both, "amax", include_self=True)
    shift = top.gather(2, index)
    terms = torch.where(both == _NEG_INF, 0, torch.exp(both - torch.where(shift == _NEG_INF, 0, shift)))
    sums = torch.zeros_like(log_probs).scatter_add(2, index, terms)
    per_class = torch.log(sums) + torch.where(top == _NEG_INF, 0, top)
    nll = neg_log_likelihood.unsqueeze(0).unsqueeze(2)
    g = torch.exp(log_probs) - torch.exp(per_class + nll - log_probs)
    live = torch.arange(t_max, device=emit.device).unsqueeze(1) < (last + 1).unsqueeze(0)
    g = torch.where(live.unsqueeze(2), g, 0) * grad.reshape(1, n, 1)
    if zero_infinity:
        g = torch.where(nll == float("inf"), 0, g)
    return g
