"""Shape bucketing (on by default): a tensor grown by ``torch.cat`` is held
padded to a bucket. Every value read from it, written into it or computed
from it must equal the CPU's, and growing it step by step must build
programs per bucket, not per length."""

import copy
import os
import subprocess
import sys

import pytest
import torch

from conftest import assert_close

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()


@pytest.fixture
def buckets():
    with torch.tpu.set_shape_buckets([8, 16, 32, 64]):
        yield


def _tiny_causal_lm(name):
    """A 2-layer GPT-2 or Llama with a 256-token vocabulary."""
    torch.manual_seed(0)
    if name == "gpt2":
        config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=128)
        return transformers.GPT2LMHeadModel(config).eval()
    config = transformers.LlamaConfig(
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, hidden_size=64,
        intermediate_size=128, vocab_size=256, max_position_embeddings=128,
    )
    return transformers.LlamaForCausalLM(config).eval()


def _built():
    m = torch.tpu.metrics()
    return m["compiles"] + m["disk_cache_hits"]


POW2 = [16 << i for i in range(21)]


def test_buckets_are_powers_of_two_by_default():
    assert os.environ.get("TPU_RS_SHAPE_BUCKETS") is None
    assert torch.tpu.shape_buckets() == POW2


def test_set_shape_buckets_scopes_and_checks_its_argument():
    default = torch.tpu.shape_buckets()
    with torch.tpu.set_shape_buckets([128, 64, 64]):
        assert torch.tpu.shape_buckets() == [64, 128]
        with torch.tpu.set_shape_buckets("pow2"):
            assert torch.tpu.shape_buckets()[:3] == [16, 32, 64]
        assert torch.tpu.shape_buckets() == [64, 128]
        with torch.tpu.set_shape_buckets(None):
            assert torch.tpu.shape_buckets() == []
    assert torch.tpu.shape_buckets() == default
    for bad in ([0, 8], [-4], "often"):
        with pytest.raises(ValueError, match="shape buckets"):
            torch.tpu.set_shape_buckets(bad)
    for bad in ([3.5], [True], ["64"], 64):
        with pytest.raises(TypeError, match="set_shape_buckets"):
            torch.tpu.set_shape_buckets(bad)
    assert torch.tpu.shape_buckets() == default


def test_buckets_come_from_the_environment():
    code = "import torch, torch_tpu_rs; print(torch.tpu.shape_buckets())"
    env = dict(os.environ, TPU_RS_SHAPE_BUCKETS="256,64")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "[64, 256]", out.stderr
    env["TPU_RS_SHAPE_BUCKETS"] = "lots"
    code = "import torch, torch_tpu_rs; torch.cat([torch.ones(2, device='tpu')] * 2)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "TPU_RS_SHAPE_BUCKETS" in out.stderr and "ValueError" in out.stderr


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.bfloat16])
def test_a_grown_tensor_reads_as_on_the_cpu(mode, buckets, dim, dtype):
    """Grown a step at a time along ``dim``: the whole tensor, windows at
    the end and in the middle, strided and transposed views, and
    arithmetic on it equal the CPU's at every length."""
    shape = [3, 2, 4]
    shape[dim] = 1
    steps = [torch.randn(shape).mul(5).to(dtype) for _ in range(20)]
    cpu, tpu = steps[0], steps[0].to("tpu")
    for step in steps[1:]:
        cpu = torch.cat([cpu, step], dim)
        tpu = torch.cat([tpu, step.to("tpu")], dim)
        n = cpu.shape[dim]
        assert_close(tpu.narrow(dim, n - 1, 1), cpu.narrow(dim, n - 1, 1))
        assert_close(tpu.narrow(dim, n // 3, n // 2), cpu.narrow(dim, n // 3, n // 2))
        assert_close(tpu.select(dim, n // 2), cpu.select(dim, n // 2))
    assert_close(tpu, cpu)
    assert_close(tpu.transpose(0, 2), cpu.transpose(0, 2))
    assert_close(tpu[::2, :, 1::3], cpu[::2, :, 1::3])
    if dtype.is_floating_point:
        assert_close((tpu * 2 + 1).sum(dim), (cpu * 2 + 1).sum(dim), atol=1e-2, rtol=1e-2)


def test_joins_of_several_parts_promote_and_skip_empty_ones(mode, buckets):
    a, b, c = torch.randn(2, 10), torch.arange(6).reshape(2, 3), torch.zeros(2, 0)
    got = torch.cat([a.to("tpu"), c.to("tpu"), b.to("tpu"), b[:, :1].to("tpu")], 1)
    assert_close(got, torch.cat([a, c, b, b[:, :1]], 1))
    grown = torch.cat([got, b.to("tpu")], 1)
    assert_close(grown, torch.cat([a, c, b, b[:, :1], b], 1))
    # Joins of like parts, and past the largest bucket: as without buckets.
    assert_close(torch.cat([a.to("tpu"), a.to("tpu")], 1), torch.cat([a, a], 1))
    big = torch.randn(2, 70)
    assert_close(torch.cat([big.to("tpu"), a.to("tpu")], 1), torch.cat([big, a], 1))


def test_branches_and_writes_leave_other_tensors_alone(mode, buckets):
    """Two tensors grown from one, and in-place writes to a grown tensor
    and its views, change nothing else."""
    base_cpu = torch.cat([torch.randn(1, 5), torch.randn(1, 1)], 1)
    base = base_cpu.to("tpu")
    base = torch.cat([base[:, :5], base[:, 5:]], 1)
    x, y = torch.randn(1, 1), torch.randn(1, 2)
    left, right = torch.cat([base, x.to("tpu")], 1), torch.cat([base, y.to("tpu")], 1)
    left_cpu, right_cpu = torch.cat([base_cpu, x], 1), torch.cat([base_cpu, y], 1)
    left[:, -1:] += 10
    left_cpu[:, -1:] += 10
    right.mul_(2)
    right_cpu.mul_(2)
    assert_close(left, left_cpu)
    assert_close(right, right_cpu)
    assert_close(base, base_cpu)
    grown, grown_cpu = torch.cat([left, x.to("tpu")], 1), torch.cat([left_cpu, x], 1)
    assert_close(grown, grown_cpu)


def test_gradients_flow_through_grown_tensors(mode, buckets):
    parts = [torch.randn(2, 1, 3, requires_grad=True) for _ in range(6)]
    tpu_parts = [p.detach().to("tpu").requires_grad_() for p in parts]
    cpu, tpu = parts[0], tpu_parts[0]
    for p, q in zip(parts[1:], tpu_parts[1:]):
        cpu, tpu = torch.cat([cpu, p], 1), torch.cat([tpu, q], 1)
    w = torch.randn(cpu.shape)
    (cpu.tanh() * w).sum().backward()
    (tpu.tanh() * w.to("tpu")).sum().backward()
    for p, q in zip(parts, tpu_parts):
        assert_close(q.grad, p.grad)


@pytest.mark.parametrize("mask", [None, "bool", "float"])
@pytest.mark.parametrize("queries", [1, 3])
@pytest.mark.parametrize("kv_heads", [4, 2])
def test_attention_over_a_grown_cache_equals_the_cpus(mode, buckets, mask, queries, kv_heads):
    """Keys and values grown like a KV cache; queries attend over them
    (the padded path under no_grad, PyTorch's path with gradients), with
    as many key heads as query heads or grouped (``enable_gqa``)."""
    gqa = dict(enable_gqa=kv_heads != 4)
    k_cpu, v_cpu = torch.randn(2, kv_heads, 3, 8), torch.randn(2, kv_heads, 3, 8)
    k, v = k_cpu.to("tpu"), v_cpu.to("tpu")
    for step in range(12):
        nk, nv = torch.randn(2, kv_heads, 1, 8), torch.randn(2, kv_heads, 1, 8)
        k_cpu, v_cpu = torch.cat([k_cpu, nk], -2), torch.cat([v_cpu, nv], -2)
        k, v = torch.cat([k, nk.to("tpu")], -2), torch.cat([v, nv.to("tpu")], -2)
        q = torch.randn(2, 4, queries, 8)
        n = k_cpu.shape[-2]
        m = None
        if mask == "bool":
            m = torch.rand(queries, n) > 0.3
            m[:, 0] = True
        elif mask == "float":
            m = torch.randn(2, 1, queries, n)
        kwargs = dict(attn_mask=m, is_causal=mask is None and queries > 1 and step % 2 == 0, **gqa)
        with torch.no_grad():
            want = torch.nn.functional.scaled_dot_product_attention(q, k_cpu, v_cpu, **kwargs)
            m_tpu = None if m is None else m.to("tpu")
            got = torch.nn.functional.scaled_dot_product_attention(
                q.to("tpu"), k, v, **dict(kwargs, attn_mask=m_tpu)
            )
        assert_close(got, want, atol=1e-5, rtol=1e-4)
    q = torch.randn(2, 4, queries, 8, requires_grad=True)
    tq = q.detach().to("tpu").requires_grad_()
    torch.nn.functional.scaled_dot_product_attention(q, k_cpu, v_cpu, **gqa).sum().backward()
    torch.nn.functional.scaled_dot_product_attention(tq, k, v, **gqa).sum().backward()
    assert_close(tq.grad, q.grad)


def test_a_row_with_every_key_masked_is_zeros_as_in_pytorchs_math_path(mode, buckets):
    k = torch.cat([torch.randn(1, 2, 4, 8), torch.randn(1, 2, 1, 8)], -2)
    q = torch.randn(1, 2, 2, 8)
    m = torch.ones(2, 5, dtype=torch.bool)
    m[1] = False
    with torch.no_grad():
        got = torch.nn.functional.scaled_dot_product_attention(
            q.to("tpu"), torch.cat([k[:, :, :4].to("tpu"), k[:, :, 4:].to("tpu")], -2), k.to("tpu"), attn_mask=m.to("tpu")
        )
    want = torch.nn.functional.scaled_dot_product_attention(q, k, k, attn_mask=m)
    assert_close(got, torch.nan_to_num(want, nan=0.0))


def test_growing_builds_programs_per_bucket_not_per_length(buckets):
    """A cache grown from 9 to 64 entries, read at its end and attended
    over at every step: the programs built are bounded by the buckets
    crossed, whatever the number of steps."""

    def grow(steps):
        k = torch.randn(1, 2, 9, 8, device="tpu")
        ids = torch.zeros(1, 9, dtype=torch.int64, device="tpu")
        for _ in range(steps):
            k = torch.cat([k, torch.randn(1, 2, 1, 8, device="tpu")], -2)
            ids = torch.cat([ids, ids[:, -1:] + 1], -1)
            with torch.no_grad():
                torch.nn.functional.scaled_dot_product_attention(torch.randn(1, 2, 1, 8, device="tpu"), k, k)
        torch.tpu.synchronize()
        return ids

    grow(55)  # warm-up: every bucket
    before = _built()
    ids = grow(55)
    assert _built() - before == 0
    assert torch.equal(ids.cpu(), torch.cat([torch.zeros(1, 9, dtype=torch.int64), torch.arange(1, 56).unsqueeze(0)], 1))
    with torch.tpu.set_shape_buckets(None):
        grow(3)
        before = _built()
        grow(10)
        unbucketed = _built() - before
    assert unbucketed >= 10  # without buckets, every new length builds


@pytest.mark.parametrize("name", ["gpt2", "llama"])
@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_generate_with_default_settings_gives_cpus_tokens_and_few_programs(mode, name, cache):
    """Greedy ``generate`` with no settings (buckets on by default): the
    CPU's tokens, and after a warm-up of another prompt length, at most 16
    programs built for 48 new tokens. With a static cache the decode step is
    a compiled graph (replayed), and the buckets hold the generated ids
    Hugging Face grows around it. Strict with the dynamic cache builds one
    program per op of the prefill at a new prompt length (46-84 here), so
    there the warm-up has the same prompt length and the bound is on the
    decode."""
    model = _tiny_causal_lm(name)
    prompt = (torch.arange(16) * 7 + 3).remainder(256).unsqueeze(0)
    kwargs = dict(max_new_tokens=48, min_new_tokens=48, do_sample=False, pad_token_id=0)
    if cache == "static":
        kwargs["cache_implementation"] = "static"
    with torch.no_grad():
        want = model.generate(prompt, **kwargs)
        torch._dynamo.reset()
        tpu_model = copy.deepcopy(model).to("tpu")
        warm_up = prompt if (mode, cache) == ("strict", "dynamic") else prompt[:, :11]
        tpu_model.generate(warm_up.to("tpu"), **dict(kwargs, max_new_tokens=4, min_new_tokens=4))
        before = _built()
        got = tpu_model.generate(prompt.to("tpu"), **kwargs)
        built = _built() - before
    assert torch.equal(got.cpu(), want)
    assert built <= 16, built


@pytest.mark.parametrize("name", ["mistral", "bart"])
def test_generate_of_a_left_padded_batch_with_buckets_gives_cpus_tokens(mode, name):
    """A batch of two prompts, one left-padded, so Hugging Face passes an
    attention mask; a sliding window (Mistral) and an encoder-decoder
    (BART) with its cross-attention cache."""
    torch.manual_seed(0)
    if name == "mistral":
        config = transformers.MistralConfig(
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, hidden_size=32,
            intermediate_size=64, vocab_size=128, max_position_embeddings=128, sliding_window=8,
        )
        model = transformers.MistralForCausalLM(config).eval()
    else:
        config = transformers.BartConfig(
            encoder_layers=2, decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2, d_model=32,
            encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=128, max_position_embeddings=128,
        )
        model = transformers.BartForConditionalGeneration(config).eval()
    prompt = (torch.arange(12) * 7 + 3).remainder(128).unsqueeze(0).repeat(2, 1)
    mask = torch.ones_like(prompt)
    mask[1, :3] = 0
    kwargs = dict(max_new_tokens=20, min_new_tokens=20, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        want = model.generate(prompt, attention_mask=mask, **kwargs)
        with torch.tpu.set_shape_buckets("pow2"):
            got = copy.deepcopy(model).to("tpu").generate(prompt.to("tpu"), attention_mask=mask.to("tpu"), **kwargs)
    assert torch.equal(got.cpu(), want)


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.float32])
def test_copies_and_end_padding_of_a_grown_tensor_equal_the_cpus(mode, buckets, dtype):
    """A mask grown by ``cat`` and then cast, cloned or padded at its end to
    a fixed length (what Hugging Face does for a static cache) equals the
    CPU's at every length, within a bucket and across one; pads elsewhere
    still take the ordinary path."""
    cpu = torch.ones(2, 5).to(dtype)
    tpu = cpu.to("tpu")
    for n in range(6, 40):
        step = (torch.arange(2).unsqueeze(1) + n).remainder(3).to(dtype)
        cpu, tpu = torch.cat([cpu, step], 1), torch.cat([tpu, step.to("tpu")], 1)
        assert_close(tpu.to(torch.bool), cpu.to(torch.bool))
        assert_close(tpu.to(torch.float32) * 2, cpu.to(torch.float32) * 2)
        assert_close(tpu.clone(), cpu.clone())
        for target, value in ((40, 0), (64, 1), (70, 0)):
            pad = (0, target - n)
            assert_close(torch.nn.functional.pad(tpu, pad, value=value), torch.nn.functional.pad(cpu, pad, value=value))
    for pad in ((1, 2), (0, 2, 1, 0), (0, -3)):
        assert_close(torch.nn.functional.pad(tpu, pad), torch.nn.functional.pad(cpu, pad))


def test_a_mask_padded_to_a_fixed_length_builds_programs_per_bucket(buckets):
    def grow(steps):
        mask = torch.ones(2, 9, dtype=torch.int64, device="tpu")
        for _ in range(steps):
            mask = torch.cat([mask, mask[:, -1:]], -1)
            full = torch.nn.functional.pad(mask.to(torch.bool), (0, 64 - mask.shape[1]))
        torch.tpu.synchronize()
        return full

    grow(50)  # warm-up: every bucket
    before = _built()
    full = grow(50)
    assert _built() - before == 0
    assert torch.equal(full.cpu(), torch.arange(64).lt(59).expand(2, 64))


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_a_left_padded_batch_with_a_static_cache_and_buckets_builds_few_programs(mode, name):
    """Hugging Face pads the grown attention mask to the static cache's
    length every step; with buckets that reads the padded mask, so 48 new
    tokens build at most 16 programs after a warm-up, with the CPU's tokens."""
    model = _tiny_causal_lm(name)
    prompt = (torch.arange(32) * 7 + 3).remainder(256).view(2, 16)
    mask = torch.ones_like(prompt)
    mask[1, :5] = 0
    kwargs = dict(max_new_tokens=48, min_new_tokens=48, do_sample=False, pad_token_id=0, cache_implementation="static")
    with torch.no_grad():
        want = model.generate(prompt, attention_mask=mask, **kwargs)
        torch._dynamo.reset()
        tpu_model = copy.deepcopy(model).to("tpu")
        with torch.tpu.set_shape_buckets("pow2"):
            warm = dict(kwargs, max_new_tokens=4, min_new_tokens=4)
            tpu_model.generate(prompt.to("tpu"), attention_mask=mask.to("tpu"), **warm)
            before = _built()
            got = tpu_model.generate(prompt.to("tpu"), attention_mask=mask.to("tpu"), **kwargs)
            built = _built() - before
    assert torch.equal(got.cpu(), want)
    assert built <= 16, built
