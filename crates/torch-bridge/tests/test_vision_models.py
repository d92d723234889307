"""Models no one in this project wrote: `timm` architectures across
families and `diffusers`' UNets and autoencoder, forward and backward in
train mode on tpu, every parameter's gradient judged against a float64 CPU
run of the same model.

The judge is relative to PyTorch's own float32 noise: a tensor passes when
tpu is no further from float64 than a few times the furthest of PyTorch's
float32 CPU runs, plus a small relative floor. Those runs are the
summation orders PyTorch itself may pick (contiguous and channels-last, the
batch in either order) and runs on values nudged by a few ulps, which show
where rounding alone flips a ReLU mask (an activation within rounding of 0
deep in a network: it then passes or blocks its gradient in any precision
by chance). Inputs keep batch norm well posed: every channel sees at least 16
values (a batch norm over the two values of a 1x1 map amplifies rounding
chaotically, and there PyTorch's own two memory formats disagree by
hundreds of times their distance from float64), and the normalisation
layers' affine parameters are drawn at random (with a zero bias, a channel
that is constant gives exactly 0 and ReLU's mask there is rounding noise in
every precision)."""

import copy
import functools

import pytest
import torch

timm = pytest.importorskip("timm")
diffusers = pytest.importorskip("diffusers")

# How far past PyTorch's own float32 noise a tpu gradient may be, and the
# relative floor for tensors PyTorch happens to round almost exactly.
NOISE_FACTOR = 10.0
RELATIVE_FLOOR = 1e-5
# PyTorch float32 runs on nudged values that measure the noise, and by how
# many float32 ulps each value is nudged (rounding-sized).
NUDGED_RUNS = 2
NUDGE_ULPS = 4
# A ReLU may decide otherwise than float64 only where float64's input is
# this close to 0, relative to the input's root mean square.
ROUNDING_OF_ZERO = 1e-4


def _timm(name, size=64, **kwargs):
    def make():
        model = timm.create_model(name, pretrained=False, num_classes=8, **kwargs)
        return model, (torch.randn(4, 3, size, size),)

    return make


def _densenet():
    # DenseNet's concatenating blocks at a small width and depth.
    model = timm.models.densenet.DenseNet(growth_rate=8, block_config=(2, 3, 4, 3), num_classes=8)
    return model, (torch.randn(4, 3, 64, 64),)


def _unet2d():
    model = diffusers.UNet2DModel(
        sample_size=16, in_channels=3, out_channels=3, block_out_channels=(16, 32), layers_per_block=1,
        down_block_types=("DownBlock2D", "AttnDownBlock2D"), up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        norm_num_groups=8, attention_head_dim=8,
    )
    return model, (torch.randn(2, 3, 16, 16), torch.tensor([10, 500]))


def _unet2d_conditional():
    model = diffusers.UNet2DConditionModel(
        sample_size=16, in_channels=4, out_channels=4, block_out_channels=(16, 32), layers_per_block=1,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=16, attention_head_dim=8, norm_num_groups=8,
    )
    return model, (torch.randn(2, 4, 16, 16), torch.tensor([10, 500]), torch.randn(2, 5, 16))


def _autoencoder_kl():
    model = diffusers.AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(16, 32), layers_per_block=1,
        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2, norm_num_groups=8,
        sample_size=16,
    )
    return model, (torch.randn(2, 3, 16, 16),)


MODELS = {
    "resnet10t": _timm("resnet10t"),
    "resnext26ts": _timm("resnext26ts"),
    "densenet": _densenet,
    "mobilenetv2_035": _timm("mobilenetv2_035"),
    "mobilenetv3_small_050": _timm("mobilenetv3_small_050"),
    "efficientnet_b0": _timm("efficientnet_b0"),
    "fbnetc_100": _timm("fbnetc_100"),
    "mnasnet_small": _timm("mnasnet_small"),
    "lcnet_050": _timm("lcnet_050"),
    "regnetx_002": _timm("regnetx_002"),
    "dla46_c": _timm("dla46_c"),
    "repvgg_a0": _timm("repvgg_a0"),
    "convnext_atto": _timm("convnext_atto"),
    "poolformer_s12": _timm("poolformer_s12"),
    "edgenext_xx_small": _timm("edgenext_xx_small"),
    "hrnet_w18_small": _timm("hrnet_w18_small"),
    "vit_tiny": _timm("vit_tiny_patch16_224", size=32, img_size=32, patch_size=8, depth=2),
    "deit_tiny": _timm("deit_tiny_patch16_224", size=32, img_size=32, patch_size=8, depth=2),
    "mobilevit_xxs": _timm("mobilevit_xxs"),
    "coat_lite_tiny": _timm("coat_lite_tiny", size=64, img_size=64),
    "unet2d": _unet2d,
    "unet2d_conditional": _unet2d_conditional,
    "autoencoder_kl": _autoencoder_kl,
}

NORMS = (torch.nn.BatchNorm2d, torch.nn.GroupNorm, torch.nn.LayerNorm)


def _randomise_norms(model, generator):
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, NORMS) and getattr(module, "weight", None) is not None:
                module.weight.copy_(torch.rand(module.weight.shape, generator=generator) + 0.5)
                if module.bias is not None:
                    module.bias.copy_(torch.rand(module.bias.shape, generator=generator) - 0.5)


def _output(result):
    if isinstance(result, torch.Tensor):
        return result
    if hasattr(result, "sample"):
        return result.sample
    return result[0]


# Activations whose gradient changes where their input crosses a kink, and
# the kinks' output values: which side a value within rounding of a kink
# lands on is chance in any precision.
KINKS = {torch.nn.ReLU: (0.0,), torch.nn.ReLU6: (0.0, 6.0)}


def _run(
    model, inputs, weights, device, dtype, memory_format=torch.contiguous_format, reverse=False,
    decisions=None, record=None,
):
    """Output and parameter gradients of ``(model(*inputs) * weights).sum()``;
    ``reverse`` runs the batch in reverse order (and puts the output back).
    ``record`` (a list) receives, per kinked activation call, which of its
    outputs sit at a kink; with ``decisions`` (such a list) each kinked
    activation takes those sides of its kinks instead of its own."""
    model = copy.deepcopy(model).to(device=device, dtype=dtype, memory_format=memory_format)
    if decisions is not None:
        _follow(model, decisions)
    if record is not None:
        for n, m, kinks in _kinked(model):
            m.register_forward_hook(lambda m, i, o, n=n, kinks=kinks: record.append((n, [o == k for k in kinks])))
    cast = lambda t: t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype)
    flip = (lambda t: t.flip(0)) if reverse else (lambda t: t)
    args = [flip(cast(t)).contiguous(memory_format=memory_format) if t.ndim == 4 else flip(cast(t)) for t in inputs]
    out = _output(model(*args))
    (out * flip(cast(weights))).sum().backward()
    grads = {n: p.grad.detach().cpu().double() for n, p in model.named_parameters() if p.grad is not None}
    return flip(out.detach()).cpu().double(), grads


def _kinked(model):
    return [(n, m, KINKS[type(m)]) for n, m in model.named_modules() if type(m) in KINKS]


def _follow(model, decisions):
    """Makes each kinked activation of the float64 ``model`` put at its
    kinks exactly the values ``decisions`` puts there, after checking that
    it differs only within rounding of a kink."""
    calls = iter(decisions)
    saved = {}

    def before(m, args, n):
        saved[n] = args[0].clone()  # before an in-place ReLU writes it

    def after(m, args, out, n, kinks):
        name, at = next(calls)
        assert name == n, f"activations ran in another order: {name}, then {n}"
        x = saved.pop(n)
        scale = x.detach().pow(2).mean().sqrt().item()
        for kink, here in zip(kinks, at):
            differs = here.cpu() != (out.detach() == kink)
            near = (x.detach() - kink).abs() <= ROUNDING_OF_ZERO * max(scale, 1.0)
            assert bool((near | ~differs).all()), (
                f"{n}: tpu's activation sits at {kink} where float64's input is "
                f"{(x - kink)[differs & ~near].abs().min().item():.3e} away from it"
            )
        result = out
        for kink, here in zip(kinks, at):
            here = here.cpu()
            result = torch.where(here, torch.full_like(out, kink), torch.where(result == kink, x, result))
        return result

    for n, m, kinks in _kinked(model):
        m.register_forward_pre_hook(lambda m, a, n=n: before(m, a, n))
        m.register_forward_hook(lambda m, a, o, n=n, kinks=kinks: after(m, a, o, n, kinks))


def _nudged(model, inputs, seed):
    """``model`` and ``inputs`` with every float value moved by
    ``NUDGE_ULPS`` float32 ulps at random: a run on them shows how far float32 rounding alone can
    move the result, ReLU masks flipping where an activation is that close
    to 0 included."""
    g = torch.Generator().manual_seed(seed)
    nudge = lambda t: t * (1 + NUDGE_ULPS * torch.finfo(torch.float32).eps * torch.randn(t.shape, generator=g, dtype=t.dtype))
    model = copy.deepcopy(model)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(nudge(p))
    return model, [nudge(t) if t.is_floating_point() else t for t in inputs]


@functools.cache
def _cpu_runs(name):
    """The model, its inputs and output weights, the float64 CPU run, and
    PyTorch's float32 CPU runs in the summation orders it may pick (memory
    format, batch order) and on nudged values (computed once for both
    modes)."""
    torch.manual_seed(0)
    model, inputs = MODELS[name]()
    model.train()
    _randomise_norms(model, torch.Generator().manual_seed(1))
    with torch.no_grad():
        shape = _output(copy.deepcopy(model)(*inputs)).shape
    weights = torch.randn(shape, generator=torch.Generator().manual_seed(2))
    reference = _run(model, inputs, weights, "cpu", torch.float64)
    f32 = torch.float32
    pytorch = [
        _run(model, inputs, weights, "cpu", f32),
        _run(model, inputs, weights, "cpu", f32, torch.channels_last),
        _run(model, inputs, weights, "cpu", f32, reverse=True),
    ]
    pytorch += [_run(*_nudged(model, inputs, seed), weights, "cpu", f32) for seed in range(NUDGED_RUNS)]
    return model, inputs, weights, reference, pytorch


def _judge(what, got, want, pytorch):
    noise = max((p - want).norm().item() for p in pytorch)
    error = (got - want).norm().item()
    allowed = NOISE_FACTOR * noise + RELATIVE_FLOOR * want.norm().item()
    if error > allowed:
        return f"{what}: {error:.3e} from float64, PyTorch float32 {noise:.3e}, |float64| {want.norm().item():.3e}"
    return None


@pytest.mark.parametrize("name", MODELS)
def test_gradients_match_float64_as_closely_as_pytorch(mode, name):
    model, inputs, weights, (out64, grads64), pytorch = _cpu_runs(name)
    decisions = []
    out, grads = _run(model, inputs, weights, "tpu", torch.float32, record=decisions)
    assert grads.keys() == grads64.keys()
    if decisions:
        # The float64 reference on the tpu run's sides of each ReLU kink.
        out64, grads64 = _run(model, inputs, weights, "cpu", torch.float64, decisions=decisions)
    failures = [_judge("output", out, out64, [p[0] for p in pytorch])]
    failures += [_judge(n, grads[n], grads64[n], [p[1][n] for p in pytorch]) for n in grads64]
    failures = [f for f in failures if f is not None]
    assert not failures, f"{len(failures)} of {len(grads64) + 1} off:\n" + "\n".join(failures[:10])
