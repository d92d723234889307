"""The GPT-2 training step the bridge's benchmarks time: 4 layers, d=256,
vocab 1024, batch 8 x 128, no dropout, one AdamW update per step."""

import copy

import torch
import transformers

LAYERS, WIDTH, VOCAB, BATCH, SEQ = 4, 256, 1024, 8, 128


def describe():
    return f"{LAYERS} layers, d={WIDTH}, vocab {VOCAB}, batch {BATCH} x {SEQ}, AdamW"


def runner(seed=0):
    """``on(device)``: a copy of one model and batch on ``device``, and a
    function running one step on it (returning the loss)."""
    transformers.logging.set_verbosity_error()
    config = transformers.GPT2Config(
        n_layer=LAYERS, n_head=4, n_embd=WIDTH, vocab_size=VOCAB, n_positions=SEQ,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )
    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(config).train()
    batch = torch.randint(0, VOCAB, (BATCH, SEQ))

    def on(device):
        m = copy.deepcopy(model).to(device)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        ids = batch.to(device)

        def step():
            opt.zero_grad()
            loss = m(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            return loss

        return step

    return on
