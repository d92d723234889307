"""CTC loss on tpu against PyTorch's CPU: padded and concatenated targets,
repeated labels, empty targets, impossible alignments, every reduction,
and PyTorch's gradient with respect to the log-probabilities."""

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_close

T, N, C = 12, 5, 6
INPUT_LENGTHS = [12, 10, 7, 3, 2]
TARGET_LENGTHS = [4, 0, 3, 3, 2]


def _case():
    log_probs = torch.randn(T, N, C, dtype=torch.float64).log_softmax(2)
    targets = torch.randint(1, C, (N, 5))
    targets[0, :4] = torch.tensor([2, 2, 3, 3])  # repeats need a blank between them
    targets[4, :2] = torch.tensor([1, 1])        # 2 frames cannot hold "1 _ 1": infinite loss
    return log_probs, targets


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("zero_infinity", [False, True])
@pytest.mark.parametrize("concatenated", [False, True])
def test_ctc_loss_and_grad(reduction, zero_infinity, concatenated):
    log_probs, targets = _case()
    if concatenated:
        targets = torch.cat([targets[i, :n] for i, n in enumerate(TARGET_LENGTHS)])

    def run(device):
        x = log_probs.detach().to(device).requires_grad_(True)
        loss = F.ctc_loss(x, targets.to(device), INPUT_LENGTHS, TARGET_LENGTHS, reduction=reduction,
                          zero_infinity=zero_infinity)
        cotangent = torch.linspace(0.5, 1.5, loss.numel(), dtype=loss.dtype).reshape(loss.shape).to(device)
        (grad,) = torch.autograd.grad(loss, x, cotangent)
        return loss, grad

    (loss, grad), (want_loss, want_grad) = run("tpu"), run("cpu")
    assert_close(loss, want_loss, atol=1e-10, rtol=1e-10)
    if zero_infinity or reduction == "none":
        assert_close(grad, want_grad, atol=1e-10, rtol=1e-10, equal_nan=True)


def test_ctc_loss_tensor_lengths_and_unbatched():
    log_probs, targets = _case()
    got = F.ctc_loss(log_probs[:, 0].to("tpu"), targets[0, :4].to("tpu"), torch.tensor(12), torch.tensor(4))
    assert_close(got, F.ctc_loss(log_probs[:, 0], targets[0, :4], torch.tensor(12), torch.tensor(4)), atol=1e-10, rtol=1e-10)
    lengths = torch.tensor(INPUT_LENGTHS), torch.tensor(TARGET_LENGTHS)
    got = F.ctc_loss(log_probs.to("tpu"), targets.to("tpu"), *lengths, reduction="none")
    assert_close(got, F.ctc_loss(log_probs, targets, *lengths, reduction="none"), atol=1e-10, rtol=1e-10)
