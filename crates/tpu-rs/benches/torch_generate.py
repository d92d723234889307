"""PyTorch CPU eager's greedy generation speed on the GPT-2 architecture
the `generate` bench runs: Hugging Face's GPT2LMHeadModel (randomly
initialised) and its `generate` with the default KV cache, printed as
``ms/token N``.

usage: python torch_generate.py VOCAB BLOCK LAYERS HEADS EMBD PROMPT NEW
"""
import sys
import time

import torch
import transformers


def main():
    vocab, block, layers, heads, embd, prompt_len, new = map(int, sys.argv[1:8])
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=vocab, n_positions=block, n_layer=layers, n_head=heads, n_embd=embd)
    model = transformers.GPT2LMHeadModel(config).eval()
    prompt = (torch.arange(prompt_len) * 7 + 3).remainder(vocab).unsqueeze(0)
    kwargs = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        model.generate(prompt, **kwargs)
        times = []
        for _ in range(3):
            start = time.perf_counter()
            model.generate(prompt, **kwargs)
            times.append(time.perf_counter() - start)
    print(f"ms/token {1e3 * sorted(times)[1] / new:.3f}")


if __name__ == "__main__":
    main()
