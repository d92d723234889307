"""Real model code: tiny-config Hugging Face models built from their configs
with random weights (nothing downloaded), forward logits and every
parameter's gradient against the same model on the CPU."""

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()


def _gpt2():
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=64)
    return transformers.GPT2LMHeadModel(config), {"input_ids": torch.randint(0, 100, (2, 8))}


def _bert():
    config = transformers.BertConfig(
        num_hidden_layers=2, num_attention_heads=2, hidden_size=32, intermediate_size=64,
        vocab_size=100, max_position_embeddings=64,
    )
    inputs = {"input_ids": torch.randint(0, 100, (2, 8)), "attention_mask": torch.tensor([[1] * 8, [1] * 5 + [0] * 3])}
    return transformers.BertForMaskedLM(config), inputs


def _llama():
    config = transformers.LlamaConfig(
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, hidden_size=32,
        intermediate_size=64, vocab_size=100, max_position_embeddings=64,
    )
    return transformers.LlamaForCausalLM(config), {"input_ids": torch.randint(0, 100, (2, 8))}


def _t5():
    config = transformers.T5Config(num_layers=2, num_heads=2, d_model=32, d_kv=16, d_ff=64, vocab_size=100)
    inputs = {"input_ids": torch.randint(0, 100, (2, 8)), "decoder_input_ids": torch.randint(0, 100, (2, 5))}
    return transformers.T5ForConditionalGeneration(config), inputs


def _vit():
    config = transformers.ViTConfig(
        num_hidden_layers=2, num_attention_heads=2, hidden_size=32, intermediate_size=64,
        image_size=16, patch_size=4, num_labels=3,
    )
    return transformers.ViTForImageClassification(config), {"pixel_values": torch.randn(2, 3, 16, 16)}


def _whisper():
    config = transformers.WhisperConfig(
        encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2, d_model=32,
        encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=8, max_source_positions=16, max_target_positions=16,
        vocab_size=100, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
    )
    inputs = {"input_features": torch.randn(2, 8, 32), "decoder_input_ids": torch.randint(0, 100, (2, 5))}
    return transformers.WhisperForConditionalGeneration(config), inputs


def _wav2vec2():
    # Its convolutional position embedding is weight-normed.
    config = transformers.Wav2Vec2Config(
        num_hidden_layers=1, num_attention_heads=2, hidden_size=32, intermediate_size=64, conv_dim=(8, 8),
        conv_stride=(4, 2), conv_kernel=(8, 4), num_conv_pos_embeddings=4, num_conv_pos_embedding_groups=2,
        vocab_size=100,
    )
    return transformers.Wav2Vec2ForCTC(config), {"input_values": torch.randn(2, 400)}


MODELS = {
    "gpt2": _gpt2, "bert": _bert, "llama": _llama, "t5": _t5, "vit": _vit,
    "whisper": _whisper, "wav2vec2": _wav2vec2,
}


@pytest.mark.parametrize("name", MODELS)
def test_logits_and_gradients_match_cpu(mode, name):
    model, inputs = MODELS[name]()
    model.eval()  # no dropout: both devices compute the same function
    tpu_model = copy.deepcopy(model).to("tpu")

    logits = model(**inputs).logits
    tpu_logits = tpu_model(**{k: v.to("tpu") for k, v in inputs.items()}).logits
    torch.testing.assert_close(tpu_logits.cpu(), logits, atol=1e-5, rtol=1e-4)

    weights = torch.randn(logits.shape)
    (logits * weights).sum().backward()
    (tpu_logits * weights.to("tpu")).sum().backward()
    for (param_name, p), q in zip(model.named_parameters(), tpu_model.parameters()):
        assert (p.grad is None) == (q.grad is None), param_name
        if p.grad is not None:
            torch.testing.assert_close(q.grad.cpu(), p.grad, atol=1e-4, rtol=1e-3, msg=param_name)


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_generate_gives_cpus_tokens(mode, name, cache):
    """Greedy `generate` on tpu equals the CPU's. With a static cache,
    Hugging Face compiles the decode step with the backend named after the
    device ("tpu"), so that path runs too."""
    torch.manual_seed(0)
    model, inputs = {"gpt2": _gpt2, "llama": _llama}[name]()
    model.eval()
    prompt = inputs["input_ids"][:1]
    kwargs = dict(max_new_tokens=12, do_sample=False, pad_token_id=0)
    if cache == "static":
        kwargs["cache_implementation"] = "static"
    with torch.no_grad():
        want = model.generate(prompt, **kwargs)
        torch._dynamo.reset()
        got = model.to("tpu").generate(prompt.to("tpu"), **kwargs)
    assert torch.equal(got.cpu(), want)
