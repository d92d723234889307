"""Hugging Face ``Trainer`` with its default arguments (fused AdamW, a
pinned-memory DataLoader, its ``empty_cache`` calls) trains a tiny BERT
classifier on tpu, which it picks by itself, equal to the same run on the
CPU."""

import torch
import transformers


class _Pairs(torch.utils.data.Dataset):
    def __init__(self, n=64, length=12, vocab=50):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(1, vocab, (n, length), generator=g)
        self.labels = (self.ids[:, 0] > vocab // 2).long()

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


def _losses(tmp_path, use_cpu):
    transformers.set_seed(0)
    config = transformers.BertConfig(
        vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=16, num_labels=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )
    model = transformers.BertForSequenceClassification(config)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / ("cpu" if use_cpu else "tpu")), max_steps=20, per_device_train_batch_size=8,
        logging_steps=1, report_to=[], save_strategy="no", use_cpu=use_cpu, seed=0,
    )
    trainer = transformers.Trainer(model=model, args=args, train_dataset=_Pairs())
    trainer.train()
    device = next(model.parameters()).device
    return [h["loss"] for h in trainer.state.log_history if "loss" in h], device, args.optim


def test_trainer_with_default_arguments_equals_the_cpu(tmp_path):
    tpu_losses, device, optim = _losses(tmp_path, use_cpu=False)
    cpu_losses, _, _ = _losses(tmp_path, use_cpu=True)
    assert device.type == "tpu", device
    assert optim == "adamw_torch_fused", optim
    assert len(tpu_losses) == len(cpu_losses) == 20
    torch.testing.assert_close(torch.tensor(tpu_losses), torch.tensor(cpu_losses), atol=1e-4, rtol=1e-4)
