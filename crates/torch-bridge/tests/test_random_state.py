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


def _gpt2():
    config = transformers.GPT2Config(
        n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=32,
        resid_pdrop=0.2, embd_pdrop=0.2, attn_pdrop=0.2,
    )
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config)


@pytest.mark.parametrize("mode", ALL_MODES)
def test_gradient_checkpointing_with_dropout_trains_as_without(mode):
    """Ten steps of a Hugging Face model with dropout: with gradient
    checkpointing the gradients equal those without, at every step."""
    base = _gpt2()
    g = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, 100, (2, 16), generator=g) for _ in range(10)]
    runs = []
    with torch.tpu.set_eager_mode(mode):
        for checkpointed in (False, True):
            model = copy.deepcopy(base).to("tpu").train()
            if checkpointed:
                model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            steps = []
            for step, ids in enumerate(batches):
                torch.manual_seed(100 + step)
                ids = ids.to("tpu")
                loss = model(ids, labels=ids).loss
                opt.zero_grad()
                loss.backward()
                steps.append((loss.item(), {n: p.grad.cpu() for n, p in model.named_parameters()}))
                opt.step()
            runs.append(steps)
    for step, ((loss, grads), (ck_loss, ck_grads)) in enumerate(zip(*runs)):
        assert ck_loss == pytest.approx(loss, rel=1e-6), f"loss at step {step}"
        for name, grad in grads.items():
            torch.testing.assert_close(ck_grads[name], grad, atol=1e-6, rtol=1e-5, msg=f"{name} at step {step}")
