"""One training run of a tiny ``transformers`` model, printed as JSON: the
loss at every step and a digest of the final parameters' bytes.

Run as ``python train_run.py MODEL OPTIMIZER DEVICE MODE STEPS``; the
long-run tests start it in fresh processes and compare runs with each
other and with the CPU.
"""

import hashlib
import json
import sys

import torch
import transformers

transformers.logging.set_verbosity_error()


def gpt2():
    cfg = transformers.GPT2Config(
        n_layer=2, n_embd=128, n_head=4, vocab_size=1024, n_positions=64,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )
    cfg._attn_implementation = "eager"
    return transformers.GPT2LMHeadModel(cfg), (4, 64)


def llama():
    cfg = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=512, max_position_embeddings=64,
    )
    cfg._attn_implementation = "eager"
    return transformers.LlamaForCausalLM(cfg), (4, 32)


MODELS = {"gpt2": gpt2, "llama": llama}


def main(model_name, optimizer, device, mode, steps):
    if device == "tpu":
        torch.tpu.set_eager_mode(mode)
    torch.manual_seed(0)
    model, (batch, seq) = MODELS[model_name]()
    vocab = model.config.vocab_size
    model = model.to(device)
    if optimizer == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ids = torch.randint(0, vocab, (batch, seq)).to(device)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        losses.append(loss.item())
    digest = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    print(json.dumps({"losses": losses, "params": digest.hexdigest()}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
