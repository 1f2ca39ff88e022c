# ---
# jupyter:
#   kernelspec:
#     display_name: bsresearch (.venv)
#     language: python
#     name: bsresearch
# ---

# %% [markdown]
# # 07 · Measuring inside your own trainer
#
# A Hugging Face `Trainer` trains a small Llama (built from a config, random weights, nothing downloaded) on
# padded documents of varying length, with gradient accumulation, and `BatchSizeCallback` measures along the way:
# the gradient noise scale B_simple for free from the micro-batches the Trainer accumulates anyway, and every
# `sharpness_every` steps the sharpness against its stability limit. Swap in your own model, data and
# `TrainingArguments`: the callback is the one line that changes. The same callback exists for Lightning
# (`bsresearch.integrations.lightning`) and the core for a plain loop; the manual is docs/own-trainer.md.
# Needs the `hf` extra (`pip install 'bsresearch[hf]'`).

# %% tags=["parameters"]
# Parameters (papermill injects overrides after this cell). Paths are relative to the project.
width: int = 64                  # the Llama's hidden size
layers: int = 2                  # its decoder layers
batch_size: int = 8              # documents per micro-batch (per device)
accumulation: int = 4            # micro-batches per optimizer step
learning_rate: float = 3e-3      # AdamW
max_steps: int = 60              # optimizer steps
sharpness_every: int = 10        # steps between curvature measurements (0: none)
seed: int = 0
out_dir: str = "runs/own_trainer"   # the Trainer's output folder; the callback writes to its bsresearch/
run_dir = None                   # a bsresearch run directory to write as well (a sweep of this notebook sets it)

# %%
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import matplotlib.pyplot as plt
import torch
from IPython.display import Markdown, display
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

from bsresearch.integrations.hf import BatchSizeCallback
from bsresearch.paths import project_path

VOCAB, PAD = 64, 0


class Documents(torch.utils.data.Dataset):
    """Documents of 8 to 48 tokens, each counting up from a random start in a random stride: a rule to learn."""

    def __init__(self, n: int = 4096, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        lengths = torch.randint(8, 49, (n,), generator=g)
        starts, strides = torch.randint(1, VOCAB, (n,), generator=g), torch.randint(1, 4, (n,), generator=g)
        self.docs = [(s + d * torch.arange(int(n_))) % (VOCAB - 1) + 1 for n_, s, d in zip(lengths, starts, strides)]

    def __len__(self) -> int:
        return len(self.docs)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.docs[i]}


def collate(features: list) -> dict:
    """Right padding; the labels of the padding are -100, which the loss ignores (so B_simple is in real tokens)."""
    width_ = max(len(f["input_ids"]) for f in features)
    ids = torch.full((len(features), width_), PAD)
    labels = torch.full((len(features), width_), -100)
    for i, f in enumerate(features):
        ids[i, :len(f["input_ids"])] = labels[i, :len(f["input_ids"])] = f["input_ids"]
    return {"input_ids": ids, "attention_mask": (labels != -100).long(), "labels": labels}


torch.manual_seed(seed)
model = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=width, intermediate_size=4 * width,
                                     num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=4,
                                     max_position_embeddings=64, pad_token_id=PAD, bos_token_id=1, eos_token_id=2))

# %% [markdown]
# ## Train with the callback
#
# The callback reads each micro-batch's gradient from hooks during the Trainer's own backward pass, undoes the
# Trainer's loss scaling (the model's loss is summed over real tokens and divided by the tokens of the whole
# update, `num_items_in_batch`), and writes one row per optimizer step; it never writes `.grad`, the
# optimizer's state, the weights or the random streams, so the training is the one you would have had.

# %%
callback = BatchSizeCallback(sharpness_every=sharpness_every, run_dir=run_dir,
                             parameters={"batch_size": batch_size * accumulation, "learning_rate": learning_rate,
                                         "seed": seed})
args = TrainingArguments(output_dir=str(project_path(out_dir)), per_device_train_batch_size=batch_size,
                         gradient_accumulation_steps=accumulation, learning_rate=learning_rate, max_steps=max_steps,
                         seed=seed, use_cpu=not torch.cuda.is_available(), report_to="none", save_strategy="no",
                         logging_steps=10, disable_tqdm=True)
trainer = Trainer(model=model, args=args, train_dataset=Documents(seed=seed), data_collator=collate,
                  callbacks=[callback])
trainer.train()
history = callback.history
history[["step", "tokens", "train_loss", "b_simple", "b_simple_ema", "estimator", "sharpness", "sharpness_limit",
         "preconditioned_sharpness", "batch_sharpness"]].tail(8)

# %% [markdown]
# ## The history
#
# Left: B_simple of each step (noisy; its estimate of |G|² can fall below zero, then it is left out) and its
# moving average, against the tokens trained, with the batch the Trainer used. Right: the sharpness of the probe
# batch and, for AdamW, the preconditioned sharpness against its limit (2 + 2β₁)/((1 − β₁) lr).

# %%
fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
finite = history["b_simple"].where(history["b_simple"].between(0, 1e12))
left.plot(history["tokens"], finite, ".", color="0.7", label="B_simple, each step")
left.plot(history["tokens"], history["b_simple_ema"], label="moving average")
left.plot(history["tokens"], history["b_big"], "--", label="the Trainer's batch")
left.set(xlabel="tokens trained", ylabel="B_simple (tokens)", yscale="log", title="gradient noise scale")
left.legend()
measured = history.dropna(subset=["sharpness"])
right.plot(measured["step"], measured["preconditioned_sharpness"], "^-", label="preconditioned sharpness")
right.plot(measured["step"], measured["sharpness"], "o-", label="sharpness (probe batch)")
right.plot(history["step"], history["sharpness_limit"], "k--", label="limit, (2 + 2β₁)/((1 − β₁) lr)")
right.set(xlabel="optimizer step", ylabel="curvature", yscale="log", title="sharpness")
right.legend()
fig.tight_layout()

# %% [markdown]
# The callback's own summary (out_dir/bsresearch/summary.md: the last values and one line of advice, with its
# caveat) and every row in history.csv beside it:

# %%
display(Markdown((project_path(out_dir) / "bsresearch" / "summary.md").read_text().split("![")[0]))
