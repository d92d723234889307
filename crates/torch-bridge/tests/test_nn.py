"""nn layers forward and backward, and whole training runs, against the
same modules on the CPU."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import assert_close


def _compare_layer(layer, x, atol=1e-5):
    tpu_layer = copy.deepcopy(layer).to("tpu")
    x_cpu = x.clone().requires_grad_(x.is_floating_point())
    x_tpu = x.to("tpu").requires_grad_(x.is_floating_point())
    y_cpu, y_tpu = layer(x_cpu), tpu_layer(x_tpu)
    assert_close(y_tpu, y_cpu, atol=atol)
    weights = torch.randn(y_cpu.shape)
    (y_cpu * weights).sum().backward()
    (y_tpu * weights.to("tpu")).sum().backward()
    if x.is_floating_point():
        assert_close(x_tpu.grad, x_cpu.grad, atol=atol)
    for (name, p), q in zip(layer.named_parameters(), tpu_layer.parameters()):
        assert_close(q.grad, p.grad, atol=atol), name
    for b, c in zip(layer.buffers(), tpu_layer.buffers()):
        assert_close(c, b, atol=atol)


def test_linear(mode):
    _compare_layer(nn.Linear(7, 5), torch.randn(4, 3, 7))


def test_conv2d(mode):
    _compare_layer(nn.Conv2d(3, 4, 3, stride=2, padding=1), torch.randn(2, 3, 9, 9), atol=1e-4)
    _compare_layer(nn.Conv2d(4, 4, 3, groups=2, dilation=2, bias=False), torch.randn(1, 4, 8, 8), atol=1e-4)


@pytest.mark.parametrize("train", [True, False])
def test_batch_norm(mode, train):
    bn = nn.BatchNorm2d(3)
    bn.running_mean.uniform_(-1, 1)
    bn.running_var.uniform_(0.5, 2)
    bn.train(train)
    _compare_layer(bn, torch.randn(4, 3, 5, 5), atol=1e-4)


def test_layer_norm(mode):
    _compare_layer(nn.LayerNorm(6), torch.randn(3, 4, 6))
    _compare_layer(nn.LayerNorm([4, 6], elementwise_affine=False), torch.randn(3, 4, 6))


def test_embedding(mode):
    _compare_layer(nn.Embedding(10, 4, padding_idx=0), torch.tensor([[0, 3, 3], [9, 1, 0]]))


def test_pooling_activations_and_losses(mode):
    x = torch.randn(2, 3, 8, 8)
    _compare_layer(nn.MaxPool2d(2), x)
    _compare_layer(nn.MaxPool2d(3, stride=2, padding=1, dilation=1), x)
    values, indices = F.max_pool2d(x.to("tpu"), 3, 2, 1, return_indices=True)
    expected_values, expected_indices = F.max_pool2d(x, 3, 2, 1, return_indices=True)
    assert_close(values, expected_values)
    assert_close(indices, expected_indices)
    _compare_layer(nn.AvgPool2d(3, stride=2, padding=1), x)
    for act in (nn.ReLU(), nn.GELU(), nn.GELU("tanh"), nn.SiLU(), nn.Tanh(), nn.Sigmoid(), nn.Softmax(-1)):
        _compare_layer(act, torch.randn(3, 5))
    logits, target = torch.randn(6, 5, requires_grad=True), torch.tensor([0, 4, 2, 2, 1, -100])
    t_logits = logits.detach().to("tpu").requires_grad_()
    loss = F.cross_entropy(logits, target, ignore_index=-100)
    t_loss = F.cross_entropy(t_logits, target.to("tpu"), ignore_index=-100)
    assert_close(t_loss, loss)
    loss.backward()
    t_loss.backward()
    assert_close(t_logits.grad, logits.grad)
    a, b = torch.randn(4, 3), torch.randn(4, 3)
    assert_close(F.mse_loss(a.to("tpu"), b.to("tpu")), F.mse_loss(a, b))


def test_dropout_keeps_expected_fraction():
    x = torch.ones(20000, device="tpu")
    y = F.dropout(x, 0.25, training=True).cpu()
    kept = (y != 0).float().mean().item()
    assert abs(kept - 0.75) < 0.02
    assert torch.allclose(y[y != 0], torch.full_like(y[y != 0], 1 / 0.75))


def _mlp():
    return nn.Sequential(nn.Linear(10, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 3))


def _cnn():
    return nn.Sequential(
        # No bias before BatchNorm: its gradient is zero up to rounding, and
        # Adam would amplify that rounding into full-size steps.
        nn.Conv2d(1, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(4, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 2 * 2, 3),
    )


def _train(model, optimizer_cls, xs, ys, steps, device, **opt):
    model = model.to(device)
    optimizer = optimizer_cls(model.parameters(), **opt)
    losses = []
    for step in range(steps):
        x, y = xs[step % len(xs)].to(device), ys[step % len(ys)].to(device)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
    return losses, model


@pytest.mark.parametrize("optimizer", [(torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}), (torch.optim.AdamW, {"lr": 1e-2, "weight_decay": 0.1})], ids=["sgd", "adamw"])
@pytest.mark.parametrize("net", ["mlp", "cnn"])
def test_training_matches_cpu(mode, optimizer, net):
    make, shape = (_mlp, (16, 10)) if net == "mlp" else (_cnn, (8, 1, 8, 8))
    xs = [torch.randn(shape) for _ in range(3)]
    ys = [torch.randint(0, 3, (shape[0],)) for _ in range(3)]
    model = make()
    cls, opt = optimizer
    cpu_losses, cpu_model = _train(copy.deepcopy(model), cls, xs, ys, 8, "cpu", **opt)
    tpu_losses, tpu_model = _train(copy.deepcopy(model), cls, xs, ys, 8, "tpu", **opt)
    torch.testing.assert_close(torch.tensor(tpu_losses), torch.tensor(cpu_losses), atol=1e-4, rtol=1e-4)
    assert tpu_losses[-1] < tpu_losses[0]
    for p, q in zip(cpu_model.parameters(), tpu_model.parameters()):
        assert_close(q, p, atol=1e-4)


def test_strict_backward_rules_run_as_one_program_without_the_forward():
    # A convolution's backward rule recomputes nothing it does not read: under
    # Strict it runs as one fused program, and its gradients equal the CPU's.
    torch.manual_seed(0)
    x, w = torch.randn(2, 3, 9, 9), torch.randn(4, 3, 3, 3)
    g = torch.randn(2, 4, 5, 5)  # stride 2, padding 1 on 9x9
    args = ([0], [2, 2], [1, 1], [1, 1], False, [0, 0], 1, [True, True, False])
    expected = torch.ops.aten.convolution_backward(g, x, w, *args)
    with torch.tpu.set_eager_mode("strict"):
        tx, tw, tg = x.to("tpu"), w.to("tpu"), g.to("tpu")
        torch.ops.aten.convolution_backward(tg, tx, tw, *args)  # compiles
        torch.tpu.synchronize()
        before = torch.tpu.metrics()["executions"]
        got = torch.ops.aten.convolution_backward(tg, tx, tw, *args)
        torch.tpu.synchronize()
        assert torch.tpu.metrics()["executions"] - before == 1
    assert got[2] is None
    for a, b in zip(got[:2], expected[:2]):
        assert_close(a, b, atol=1e-4)


RECURRENT = {
    "lstm": (lambda: torch.nn.LSTM(4, 3, batch_first=True), (2, 5, 4)),
    "lstm 2 layers bidirectional": (lambda: torch.nn.LSTM(4, 3, num_layers=2, bidirectional=True), (5, 2, 4)),
    "lstm without bias": (lambda: torch.nn.LSTM(4, 3, bias=False), (5, 2, 4)),
    "lstm with projections": (lambda: torch.nn.LSTM(4, 6, proj_size=2), (5, 2, 4)),
    "gru 2 layers": (lambda: torch.nn.GRU(4, 3, num_layers=2), (5, 2, 4)),
    "gru bidirectional without bias": (lambda: torch.nn.GRU(4, 3, bidirectional=True, bias=False, batch_first=True), (2, 5, 4)),
    "lstm cell": (lambda: torch.nn.LSTMCell(4, 3), (2, 4)),
    "gru cell": (lambda: torch.nn.GRUCell(4, 3), (2, 4)),
}


@pytest.mark.parametrize("case", RECURRENT)
def test_recurrent_layers_match_cpu_with_gradients(mode, case):
    make, shape = RECURRENT[case]
    torch.manual_seed(0)
    cpu = make()
    tpu = copy.deepcopy(cpu).to("tpu")
    x = torch.randn(*shape, requires_grad=True)
    xt = x.detach().to("tpu").requires_grad_()
    out, out_t = cpu(x), tpu(xt)
    out, out_t = (out[0], out_t[0]) if isinstance(out, tuple) else (out, out_t)
    weights = torch.randn(out.shape)
    (out * weights).sum().backward()
    (out_t * weights.to("tpu")).sum().backward()
    assert_close(out_t, out.detach())
    assert_close(xt.grad, x.grad)
    for (name, p), q in zip(cpu.named_parameters(), tpu.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_smooth_l1_loss_gradient_matches_cpu(mode, beta):
    """Its backward reaches a decomposition of the out= form that writes the
    out= tensor itself."""
    x = torch.randn(3, 4, requires_grad=True)
    target = torch.randn(3, 4)
    xt = x.detach().to("tpu").requires_grad_()
    F.smooth_l1_loss(x, target, beta=beta).backward()
    F.smooth_l1_loss(xt, target.to("tpu"), beta=beta).backward()
    assert_close(xt.grad, x.grad)


@pytest.mark.parametrize("norm_type", [2.0, 1.0])
def test_embedding_max_norm_renormalizes_the_rows_it_reads(mode, norm_type):
    torch.manual_seed(0)
    cpu = nn.Embedding(10, 4, max_norm=1.0, norm_type=norm_type)
    tpu = copy.deepcopy(cpu).to("tpu")
    idx = torch.tensor([[1, 2, 1], [3, 9, 2]])
    out, out_t = cpu(idx), tpu(idx.to("tpu"))
    (out * 2).sum().backward()
    (out_t * 2).sum().backward()
    assert_close(out_t, out.detach())
    assert_close(tpu.weight.detach(), cpu.weight.detach())
    assert_close(tpu.weight.grad, cpu.weight.grad)


@pytest.mark.parametrize(
    "make, shape",
    [
        (lambda: torch.nn.utils.weight_norm(nn.Conv1d(4, 6, 3), dim=2), (2, 4, 9)),
        (lambda: torch.nn.utils.weight_norm(nn.Linear(4, 3)), (2, 4)),
        (lambda: torch.nn.utils.weight_norm(nn.Linear(4, 3), dim=None), (2, 4)),
        (lambda: torch.nn.utils.parametrizations.weight_norm(nn.Conv1d(4, 6, 3)), (2, 4, 9)),
    ],
)
def test_weight_norm_gradients_match_cpu(mode, make, shape):
    torch.manual_seed(0)
    cpu = make()
    torch.manual_seed(0)
    tpu = make().to("tpu")
    x = torch.randn(*shape)
    out, out_t = cpu(x), tpu(x.to("tpu"))
    weights = torch.randn(out.shape)
    (out * weights).sum().backward()
    (out_t * weights.to("tpu")).sum().backward()
    assert_close(out_t, out.detach())
    for (name, p), q in zip(cpu.named_parameters(), tpu.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize(
    "bag_mode, sample_weights, padding_idx, by_freq",
    [("sum", False, None, False), ("sum", True, 2, False), ("sum", False, 2, True), ("mean", False, None, True),
     ("mean", False, 2, False), ("max", False, None, False), ("max", False, 2, False)],
)
def test_embedding_bag_gradients_match_cpu(mode, bag_mode, sample_weights, padding_idx, by_freq):
    """Bags of several sizes (one empty), a padding index and repeated
    indices: the weight's and the sample weights' gradients."""
    bag = torch.nn.EmbeddingBag(10, 4, mode=bag_mode, padding_idx=padding_idx, scale_grad_by_freq=by_freq)
    tpu_bag = copy.deepcopy(bag).to("tpu")
    indices, offsets = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9, 2]), torch.tensor([0, 4, 4, 6])
    w = torch.rand(9, requires_grad=True) if sample_weights else None
    tw = w.detach().to("tpu").requires_grad_() if sample_weights else None
    out = bag(indices, offsets, per_sample_weights=w)
    tpu_out = tpu_bag(indices.to("tpu"), offsets.to("tpu"), per_sample_weights=tw)
    g = torch.randn(out.shape)
    (out * g).sum().backward()
    (tpu_out * g.to("tpu")).sum().backward()
    assert_close(tpu_out, out.detach())
    assert_close(tpu_bag.weight.grad, bag.weight.grad)
    if sample_weights:
        assert_close(tw.grad, w.grad)


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("shape, weighted", [((6, 5), False), ((6, 5), True), ((5,), False)])
def test_multi_margin_loss_and_its_gradient_match_cpu(mode, p, reduction, shape, weighted):
    x = torch.randn(shape, requires_grad=True)
    target = torch.randint(0, 5, shape[:-1])
    weight = torch.rand(5) if weighted else None
    tx = x.detach().to("tpu").requires_grad_()
    loss = F.multi_margin_loss(x, target, p=p, margin=0.7, weight=weight, reduction=reduction)
    tpu_loss = F.multi_margin_loss(
        tx, target.to("tpu"), p=p, margin=0.7, weight=None if weight is None else weight.to("tpu"), reduction=reduction
    )
    g = torch.randn(loss.shape)
    (loss * g).sum().backward()
    (tpu_loss * g.to("tpu")).sum().backward()
    assert_close(tpu_loss, loss.detach())
    assert_close(tx.grad, x.grad)
