"""The device module's random state, as ``torch.utils.checkpoint``,
``torch.random.fork_rng`` and CUDA-style scripts use it: one generator per
device, saved and restored per device, so a checkpointed forward recomputed
in backward draws the same dropout masks as the original."""

import copy

import pytest
import torch
import torch.nn.functional as F
import torch.utils.checkpoint

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

ALL_MODES = ["strict", "debug", "defer_and_fuse"]


def test_each_device_has_its_own_generator():
    torch.manual_seed(5)  # seeds every device, as manual_seed_all
    first = torch.rand(4, device="tpu:0")
    with torch.tpu.device(1):
        torch.tpu.manual_seed(9)  # the current device only
        assert torch.tpu.initial_seed() == 9
    assert torch.tpu.initial_seed() == 5
    torch.manual_seed(5)
    assert torch.equal(torch.rand(4, device="tpu:0").cpu(), first.cpu())
    state = torch.tpu.get_rng_state("tpu:1")
    torch.rand(4, device="tpu:1")
    assert not torch.equal(torch.tpu.get_rng_state("tpu:1"), state)
    # Drawing on tpu:1 left tpu:0's stream where it was.
    zero = torch.tpu.get_rng_state(0)
    torch.rand(4, device="tpu:1")
    assert torch.equal(torch.tpu.get_rng_state(0), zero)


def test_states_restore_per_device():
    states = torch.tpu.get_rng_state_all()
    assert len(states) == torch.tpu.device_count()
    draws = [torch.rand(8, device=f"tpu:{i}").cpu() for i in range(len(states))]
    torch.tpu.set_rng_state_all(states)
    again = [torch.rand(8, device=f"tpu:{i}").cpu() for i in range(len(states))]
    for a, b in zip(draws, again):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="2 values"):
        torch.tpu.set_rng_state(torch.zeros(3, dtype=torch.int64))


def test_fork_rng_restores_every_device():
    torch.manual_seed(0)
    before = torch.tpu.get_rng_state_all()
    with torch.random.fork_rng(device_type="tpu", devices=range(torch.tpu.device_count())):
        for i in range(torch.tpu.device_count()):
            torch.rand(3, device=f"tpu:{i}")
    after = torch.tpu.get_rng_state_all()
    assert all(torch.equal(a, b) for a, b in zip(before, after))


def test_checkpoint_replays_dropout_masks():
    """A checkpointed dropout gives the gradients of the plain one."""
    assert getattr(torch.tpu, "_initialized", False)

    def block(x):
        return F.dropout(torch.tanh(x), p=0.5, training=True) * 3

    x = torch.randn(64, 32)
    grads = []
    for checkpointed in (False, True):
        torch.manual_seed(11)
        xt = x.to("tpu").requires_grad_()
        y = torch.utils.checkpoint.checkpoint(block, xt, use_reentrant=False) if checkpointed else block(xt)
        y.sum().backward()
        grads.append(xt.grad.cpu())
    assert (grads[0] == 0).any()  # dropout dropped something
    assert torch.equal(grads[0], grads[1])


def _gpt2(dropout=0.2):
    config = transformers.GPT2Config(
        n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=32,
        resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout,
    )
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config)


def _batches():
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, 100, (2, 16), generator=g) for _ in range(10)]


def _train(base, device, checkpointed, batches):
    """Ten SGD steps: each step's loss and gradients."""
    model = copy.deepcopy(base).to(device).train()
    if checkpointed:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = []
    for step, ids in enumerate(batches):
        torch.manual_seed(100 + step)
        ids = ids.to(device)
        loss = model(ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        steps.append((loss.item(), {n: p.grad.cpu() for n, p in model.named_parameters()}))
        opt.step()
    return steps


def _assert_same_steps(got, want, atol, rtol):
    for step, ((loss, grads), (want_loss, want_grads)) in enumerate(zip(got, want, strict=True)):
        assert loss == pytest.approx(want_loss, rel=rtol, abs=atol), f"loss at step {step}"
        for name, grad in want_grads.items():
            torch.testing.assert_close(grads[name], grad, atol=atol, rtol=rtol, msg=f"{name} at step {step}")


@pytest.mark.parametrize("mode", ALL_MODES)
def test_gradient_checkpointing_with_dropout_trains_as_without(mode):
    """Ten steps of a Hugging Face model with dropout: with gradient
    checkpointing the gradients equal those without, at every step (the
    recomputed forward draws the same masks)."""
    base, batches = _gpt2(), _batches()
    with torch.tpu.set_eager_mode(mode):
        plain = _train(base, "tpu", False, batches)
        checkpointed = _train(base, "tpu", True, batches)
    _assert_same_steps(checkpointed, plain, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("mode", ALL_MODES)
def test_gradient_checkpointing_trains_as_on_the_cpu(mode):
    """The same ten checkpointed steps equal the CPU's. (Dropout is off
    here: tpu's generator draws other masks than the CPU's from the same
    seed; the test above checks that masks are replayed.)"""
    base, batches = _gpt2(dropout=0.0), _batches()
    want = _train(base, "cpu", True, batches)
    with torch.tpu.set_eager_mode(mode):
        got = _train(base, "tpu", True, batches)
    _assert_same_steps(got, want, atol=1e-5, rtol=1e-4)
