"""The ecosystem's models and data, offline: a Hugging Face causal LM (GPT-2 family) and image classifier (ViT),
built from configs with random weights, and data as Hugging Face datasets and collators give it. Nothing here is
special-cased by the library: the models are used through the adapters every model goes through (bsresearch.model_io).
"""
from __future__ import annotations

import json
import math
import os
import re
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
transformers = pytest.importorskip("transformers")

from conftest import requires_cuda  # noqa: E402

from bsresearch import step  # noqa: E402
from bsresearch.config import ConfigError, RunConfig  # noqa: E402
from bsresearch.losses import Task, loss_for  # noqa: E402
from bsresearch.model_io import Features, OutputError, logits_of, model_loss_of  # noqa: E402
from bsresearch.rundir import RunDir  # noqa: E402
from bsresearch.runsetup import run_setup  # noqa: E402
from bsresearch.train import run  # noqa: E402

HF_CODE = textwrap.dedent('''
    import torch
    from torch.utils.data import Dataset
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2Model, ViTConfig, ViTForImageClassification

    VOCAB = 24


    def gpt2(n_embd=16, n_layer=1, n_head=2, dropout=0.0, pad_token_id=0):
        return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=16, n_embd=n_embd, n_layer=n_layer,
                                          n_head=n_head, resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout,
                                          bos_token_id=0, eos_token_id=0, pad_token_id=pad_token_id))


    def windows(n=48):
        """Fixed-length windows of tokens, as tensors (input ids, and the same as labels: the model shifts)."""
        ids = torch.arange(n * 6).view(n, 6) % (VOCAB - 1) + 1
        return torch.utils.data.TensorDataset(ids, ids.clone())


    def gpt2_base():
        """The model without its head: a ModelOutput with no logits."""
        return GPT2Model(GPT2Config(vocab_size=VOCAB, n_positions=16, n_embd=16, n_layer=1, n_head=2))


    class Sentences(Dataset):
        """Token sequences of 3 to 8 tokens (each the previous plus one), as mappings; labels are the input ids
        (the model shifts them)."""

        def __init__(self, n, seed):
            g = torch.Generator().manual_seed(seed)
            self.rows = []
            for _ in range(n):
                length = int(torch.randint(3, 9, (), generator=g))
                start = int(torch.randint(1, VOCAB, (), generator=g))
                self.rows.append((start + torch.arange(length)) % (VOCAB - 1) + 1)

        def __len__(self):
            return len(self.rows)

        def __getitem__(self, i):
            return {"input_ids": self.rows[i], "labels": self.rows[i].clone()}


    def pad(items):
        """A collator as Hugging Face's pad: to the longest sequence of the batch, id 0, label -100."""
        longest = max(len(item["input_ids"]) for item in items)
        ids = torch.zeros(len(items), longest, dtype=torch.long)
        labels = torch.full((len(items), longest), -100)
        mask = torch.zeros(len(items), longest, dtype=torch.long)
        for i, item in enumerate(items):
            n = len(item["input_ids"])
            ids[i, :n], labels[i, :n], mask[i, :n] = item["input_ids"], item["labels"], 1
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}


    def sentences(n=160):
        data = Sentences(n, 0)
        data.collate_fn = pad
        return data


    def sentences_without_labels(n=40):
        data = sentences(n)
        data.collate_fn = lambda items: {k: v for k, v in pad(items).items() if k != "labels"}
        return data


    def sentences_with_odd_keys(n=40):
        data = sentences(n)
        data.collate_fn = lambda items: {("tokens" if k == "input_ids" else k): v for k, v in pad(items).items()}
        return data


    def broken_collator(items):
        raise ValueError("sequences of different lengths need padding")


    def sentences_broken_collator(n=40):
        data = Sentences(n, 0)
        data.collate_fn = broken_collator
        return data


    def vit(classes=4):
        return ViTForImageClassification(ViTConfig(image_size=8, patch_size=4, num_channels=3, hidden_size=16,
                                                   num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                                                   num_labels=classes, hidden_dropout_prob=0.0,
                                                   attention_probs_dropout_prob=0.0))


    def images(n=96):
        """A Hugging Face datasets.Dataset as it comes: rows of nested lists and an int label, a text column."""
        import datasets
        g = torch.Generator().manual_seed(0)
        x = torch.randn(n, 3, 8, 8, generator=g)
        label = (x[:, 0].mean((1, 2)) > 0).long() + 2 * (x[:, 1, :4].mean((1, 2)) > 0).long()
        return datasets.Dataset.from_dict({"pixel_values": x.tolist(), "label": label.tolist(),
                                           "caption": [f"image {i}" for i in range(n)]})


    class Plain(torch.nn.Module):
        """A model that returns a tensor: it computes no loss of its own."""
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(VOCAB, VOCAB)

        def forward(self, input_ids, attention_mask=None, labels=None):
            return self.embed(input_ids)
''')


@pytest.fixture(scope="module")
def hf_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("hf") / "hf_models.py"
    path.write_text(HF_CODE)
    return path


def lm_cfg(path: Path, **changes) -> RunConfig:
    base = dict(model=f"{path}:gpt2", dataset=f"{path}:sentences", loss="model", optimizer="adam", lr=3e-3,
                batch_size=8, budget="steps", budget_amount=6, eval_schedule="every", eval_every=3, device="cpu",
                save_checkpoint=False, test_size=16)
    return RunConfig(**{**base, **changes})


def vit_cfg(path: Path, **changes) -> RunConfig:
    base = dict(model=f"{path}:vit", dataset=f"{path}:images", optimizer="adam", lr=3e-3, batch_size=8,
                budget="steps", budget_amount=6, eval_schedule="every", eval_every=3, device="cpu",
                save_checkpoint=False, test_size=16)
    return RunConfig(**{**base, **changes})


# ----------------------------------------------------------------------------- outputs and batches
def test_a_models_output_is_read_in_one_place():
    from transformers.modeling_outputs import BaseModelOutput, CausalLMOutput
    t = torch.randn(2, 3)
    assert logits_of(t) is t and logits_of((t, "cache")) is t and logits_of([t]) is t
    assert logits_of({"logits": t}) is t and logits_of(CausalLMOutput(logits=t)) is t
    assert model_loss_of(CausalLMOutput(loss=t.sum(), logits=t)) is not None
    with pytest.raises(OutputError, match="BaseModelOutput without logits \\(it holds last_hidden_state\\)"):
        logits_of(BaseModelOutput(last_hidden_state=t))
    with pytest.raises(OutputError, match="returned a str"):
        logits_of("nothing")
    with pytest.raises(OutputError, match="with no loss"):
        model_loss_of(CausalLMOutput(logits=t))


def test_named_tensors_behave_as_a_tensor_along_the_batch():
    f = Features({"input_ids": torch.arange(12).view(4, 3), "attention_mask": torch.ones(4, 3)})
    assert len(f) == 4 and f.device.type == "cpu" and sorted(f) == ["attention_mask", "input_ids"]
    assert torch.equal(f[1:3]["input_ids"], torch.arange(3, 9).view(2, 3))
    assert [len(p) for p in f.split(3)] == [3, 1]
    assert torch.equal(f[torch.tensor([3, 0])]["input_ids"][:, 0], torch.tensor([9, 0]))
    assert f.unsqueeze(0)["input_ids"].shape == (1, 4, 3)
    # torch.func.vmap takes them as it takes a tensor (a pytree node)
    out = torch.func.vmap(lambda g: g["input_ids"].sum() + g["attention_mask"].sum())(f)
    assert out.tolist() == [6.0, 15.0, 24.0, 33.0]


def test_a_gpt2_trains_on_a_mapping_batch_with_its_own_loss_and_its_label_shift_is_found(hf_file):
    setup = run_setup(lm_cfg(hf_file))
    assert setup.task.kind == "sequence" and setup.task.token_level and setup.task.label_shift == 1
    assert not setup.task.accuracy and setup.task.loss_unit == "nats per token"
    result = run(lm_cfg(hf_file, budget_amount=30, eval_every=10), progress=False)
    assert result.state == "ok"
    losses = [row["train_loss"] for row in result.history]
    assert losses[-1] < losses[0] - 0.3   # it learns that each token is the previous plus one


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=requires_cuda)], ids=["cpu-bf16", "cuda-bf16"])
def test_a_gpt2_trains_in_bf16(hf_file, device):
    """precision bf16 (autocast) with the model's own loss: finite losses that fall as in fp32. The CUDA variant
    is the one that matters; its CPU twin (bf16 autocast on the CPU) checks the test itself on any machine."""
    result = run(lm_cfg(hf_file, precision="bf16", device=device, budget_amount=30, eval_every=10), progress=False)
    assert result.state == "ok", result.error
    losses = [row["train_loss"] for row in result.history]
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0] - 0.3, losses


def test_a_gpt2_under_the_built_in_cross_entropy_reads_its_logits(hf_file, tmp_path):
    """A user's loss or the built-in one reads a ModelOutput's logits; the data then gives the next tokens."""
    code = HF_CODE + textwrap.dedent('''
        class NextTokens(Dataset):
            def __init__(self, n):
                self.data = Sentences(n, 0)

            def __len__(self):
                return len(self.data)

            def __getitem__(self, i):
                ids = torch.nn.functional.pad(self.data.rows[i], (0, 8 - len(self.data.rows[i])))
                labels = torch.cat([ids[1:], ids[:1] * 0 - 100])
                labels[len(self.data.rows[i]) - 1:] = -100
                return {"input_ids": ids, "labels": labels}


        def next_tokens(n=64):
            return NextTokens(n)
    ''')
    path = tmp_path / "next.py"
    path.write_text(code)
    cfg = lm_cfg(path, dataset=f"{path}:next_tokens", loss="cross_entropy", budget_amount=4, eval_every=2)
    setup = run_setup(cfg)
    assert setup.task.accuracy and setup.task.token_level and setup.task.label_shift == 0
    assert run(cfg, progress=False).state == "ok"


@pytest.mark.parametrize("factory, dataset, loss, message", [
    ("gpt2", "sentences_without_labels", "model",
     "a mapping batch needs its targets under 'labels' (or 'label'); its keys are input_ids, attention_mask"),
    ("gpt2", "sentences_with_odd_keys", "model", "(a mapping batch of tokens (2, {n}) int64, attention_mask (2, {n}) "
                                                 "int64) failed: ValueError: You have to specify either input_ids"),
    ("Plain", "sentences", "model", "loss model: model {path}:Plain returned a Tensor with no loss"),
    ("gpt2_base", "sentences", "cross_entropy",
     "model {path}:gpt2_base returned a BaseModelOutputWithPastAndCrossAttentions without logits (it holds "
     "last_hidden_state"),
    ("gpt2", "sentences_broken_collator", "model",
     "its collate_fn broken_collator raised ValueError: sequences of different lengths need padding"),
])
def test_bad_input_is_one_line_before_any_work(hf_file, tmp_path, factory, dataset, loss, message):
    cfg = lm_cfg(hf_file, model=f"{hf_file}:{factory}", dataset=f"{hf_file}:{dataset}", loss=loss)
    with pytest.raises(ConfigError) as info:
        run(cfg, tmp_path / "run", progress=False)
    text = str(info.value)
    pattern = re.escape(message.replace("{n}", "N").format(path=hf_file)).replace("N", r"\d+")
    assert re.search(pattern, text) and "\n" not in text
    assert not (tmp_path / "run").exists()


def test_a_model_file_that_cannot_import_names_the_module_and_the_folder(tmp_path):
    (tmp_path / "helpers.py").write_text("import torch.nn as nn\nWIDTH = 4\n")
    (tmp_path / "sibling.py").write_text("import torch.nn as nn\nfrom helpers import WIDTH\n\n\n"
                                         "def make_model():\n    return nn.Linear(WIDTH, 2)\n")
    (tmp_path / "missing.py").write_text("import torch.nn as nn\nfrom helperz import WIDTH\n")
    from bsresearch.loading import load_factory
    assert load_factory(f"{tmp_path / 'sibling.py'}:make_model", "model")().in_features == 4  # a sibling imports
    with pytest.raises(ConfigError) as info:
        load_factory(f"{tmp_path / 'missing.py'}:make_model", "model")
    assert f"cannot import 'helperz' (missing.py, line 2): it is neither in the file's folder {tmp_path}" \
        in str(info.value)


# ----------------------------------------------------------------------------- token-level accumulation
def _padded_tokens(n=12, t=7, vocab=11, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(vocab, (n, t), generator=g)
    y = torch.randint(vocab, (n, t), generator=g)
    lengths = torch.randint(1, t + 1, (n,), generator=g)
    y[torch.arange(t)[None, :] >= lengths[:, None]] = -100   # padding: each sequence its own length
    return x, y


def _grad_after_step(model, batches, loss_fn, count=None):
    model = __import__("copy").deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    value = step.optimizer_update(model, opt, batches, loss_fn=loss_fn, count=count)
    return value, torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def test_token_level_accumulation_over_padded_sequences_is_the_true_batch():
    """The bug class of transformers issue 34191: micro-batch means weighted by examples are not the batch's
    mean over its real tokens. Oracle: the mean over every real token of the batch, summed example by example."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(11, 8), nn.Tanh(), nn.Linear(8, 11))
    x, y = _padded_tokens()
    loss, task = loss_for("cross_entropy"), Task("sequence", True, 7, "nats per token", token_level=True)
    # the oracle: every example's summed token losses over the batch's real tokens
    ref = copy_of(model)
    total = sum(F.cross_entropy(ref(x[i]), y[i], reduction="sum") for i in range(len(x))) / (y != -100).sum()
    total.backward()
    oracle = torch.cat([p.grad.reshape(-1) for p in ref.parameters()])
    whole_value, whole = _grad_after_step(model, [(x, y)], loss, task.count)
    micro = list(zip(x.split(5), y.split(5)))
    micro_value, accumulated = _grad_after_step(model, micro, loss, task.count)
    assert torch.allclose(whole, oracle, atol=1e-6) and torch.allclose(accumulated, oracle, atol=1e-6)
    assert float(micro_value) == pytest.approx(float(total.detach()), rel=1e-6) == pytest.approx(float(whole_value))
    _, by_examples = _grad_after_step(model, micro, loss)   # the old rule, which this data breaks
    assert not torch.allclose(by_examples, oracle, atol=1e-4)


def copy_of(model):
    return __import__("copy").deepcopy(model)


def test_without_padding_token_shares_are_the_example_shares_bit_for_bit():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(11, 8), nn.Tanh(), nn.Linear(8, 11))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randint(11, (12, 7), generator=g), torch.randint(11, (12, 7), generator=g)
    task = Task("sequence", True, 7, "nats per token", token_level=True)
    micro = list(zip(x.split(5), y.split(5)))
    a = _grad_after_step(model, micro, loss_for("cross_entropy"), task.count)
    b = _grad_after_step(model, micro, loss_for("cross_entropy"))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_a_causal_lms_own_loss_accumulates_to_the_true_batch(hf_file):
    """loss: model with a GPT-2 whose labels it shifts itself: micro-batches weighted by the tokens its loss
    counts (the dry run found the shift) give the gradient of the whole padded batch."""
    from bsresearch.loading import load_factory
    torch.manual_seed(0)
    model = load_factory(f"{hf_file}:gpt2", "model")()
    data = load_factory(f"{hf_file}:sentences", "dataset")(24)
    batch = data.collate_fn([data[i] for i in range(12)])
    x, y = Features({k: v for k, v in batch.items() if k != "labels"}), batch["labels"]
    task = Task("sequence", False, y.shape[1], "nats per token", token_level=True, label_shift=1)
    loss = loss_for("model")
    _, whole = _grad_after_step(model, [(x, y)], loss, task.count)
    micro = list(zip(x.split(5), y.split(5)))
    _, accumulated = _grad_after_step(model, micro, loss, task.count)
    assert torch.allclose(accumulated, whole, atol=1e-6, rtol=1e-4)
    _, by_examples = _grad_after_step(model, micro, loss)
    assert not torch.allclose(by_examples, whole, atol=1e-5, rtol=1e-3)


def test_a_padded_runs_evaluation_is_the_mean_over_real_tokens(hf_file):
    from bsresearch.engine import evaluate_batches
    from bsresearch.loading import load_factory
    torch.manual_seed(0)
    model = load_factory(f"{hf_file}:gpt2", "model")().eval()
    data = load_factory(f"{hf_file}:sentences", "dataset")(12)
    batch = data.collate_fn([data[i] for i in range(12)])
    x, y = Features({k: v for k, v in batch.items() if k != "labels"}), batch["labels"]
    task = Task("sequence", False, y.shape[1], "nats per token", token_level=True, label_shift=1)
    value, _ = evaluate_batches(model, [(x[:5], y[:5]), (x[5:], y[5:])], loss_for("model"), accuracy=False, task=task)
    with torch.no_grad():
        logits = model(**x.tensors).logits[:, :-1]
        oracle = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y[:, 1:].reshape(-1))   # real tokens only
    assert value == pytest.approx(float(oracle), rel=1e-5)


@pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
                    reason="needs torch.distributed with gloo")
# [None] is exhaustive: [4] runs the same two-device padded run, with micro-batches on top
@pytest.mark.parametrize("micro", [pytest.param(None, marks=pytest.mark.exhaustive), 4])
def test_a_padded_run_on_two_devices_is_the_run_of_one_device(hf_file, tmp_path, micro):
    """Each device's share holds its own number of real tokens: weighted by the global batch's tokens (one
    all-reduce of the count), DDP's mean over devices is the global batch's mean over its real tokens.
    Oracle: the run on one device at the same global batch (weights, losses), with and without accumulation."""
    from bsresearch.state import load_checkpoint
    cfg = lm_cfg(hf_file, budget_amount=4, eval_every=2, save_checkpoint=True, micro_batch_size=micro)
    one = run(cfg, tmp_path / "one", progress=False)
    two = run(cfg.replace(devices=2), tmp_path / "two", progress=False)
    assert one.state == two.state == "ok"
    for ra, rb in zip(one.history, two.history, strict=True):
        assert rb["train_loss"] == pytest.approx(ra["train_loss"], rel=1e-5), ra["step"]
        assert rb["test_loss"] == pytest.approx(ra["test_loss"], rel=1e-5, nan_ok=True), ra["step"]
    wa, wb = (load_checkpoint(tmp_path / d / "checkpoint.pt")["state"]["model"] for d in ("one", "two"))
    # atol: Adam scales the attention bias's gradients of ~0 (their rounding differs) to steps of ~lr
    assert wa.keys() == wb.keys()
    assert all(torch.allclose(wa[k].float(), wb[k].float(), rtol=1e-4, atol=2e-5) for k in wa)


# ----------------------------------------------------------------------------- curvature through attention
class TinyAttention(nn.Module):
    """One head of self-attention and a readout: 2 x 4 x 4 + 4 x 3 parameters, torch's fused attention."""

    def __init__(self):
        super().__init__()
        self.qk = nn.Linear(4, 8, bias=False)
        self.out = nn.Linear(4, 3, bias=False)

    def forward(self, x):
        q, k = self.qk(x).unsqueeze(1).chunk(2, -1)   # (batch, 1 head, sequence, 4)
        return self.out(F.scaled_dot_product_attention(q, k, x.unsqueeze(1), is_causal=True)[:, 0]).mean(1)


def test_the_hessian_through_attention_is_the_dense_hessian():
    from bsresearch.measure import curvature
    torch.manual_seed(0)
    model = TinyAttention().eval()
    x, y = torch.randn(6, 5, 4), torch.randint(3, (6,))
    names = [n for n, _ in model.named_parameters()]
    point = torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    def loss_at(flat):
        params, start = {}, 0
        for name, p in model.named_parameters():
            params[name] = flat[start:start + p.numel()].view_as(p)
            start += p.numel()
        out = torch.func.functional_call(model, params, (x,))
        return F.cross_entropy(out, y)
    with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.MATH]):
        dense = torch.autograd.functional.hessian(loss_at, point)
    assert len(names) == 2 and dense.shape == (44, 44)
    # the fused kernel torch picks by itself has no double backward
    with pytest.raises(RuntimeError, match="derivative for .*scaled_dot_product"):
        g = torch.autograd.grad(F.cross_entropy(model(x), y), list(model.parameters()), create_graph=True)
        torch.autograd.grad(sum((a * a).sum() for a in g), list(model.parameters()))
    v = torch.randn(44)
    assert torch.allclose(curvature.hvp(model, [(x[:4], y[:4]), (x[4:], y[4:])], v), dense @ v, atol=1e-5)
    top = curvature.top_eigenvalues(model, [(x, y)], k=1, tol=1e-6, generator=torch.Generator().manual_seed(0))
    assert top.eigenvalues[0] == pytest.approx(float(torch.linalg.eigvalsh(dense)[-1]), rel=1e-4)
    assert top.attention == "math"
    trace = curvature.hessian_trace(model, [(x, y)], n_probes=400, generator=torch.Generator().manual_seed(0))
    assert trace.attention == "math"
    assert trace.trace == pytest.approx(float(dense.trace()), abs=4 * trace.std_error)


# ----------------------------------------------------------------------------- every part, with a GPT-2
def test_gpt2_accumulates_resumes_and_is_measured(hf_file, tmp_path):
    measure = ("noise_scale", "hessian", "sharpness", "keskar_sharpness", "m_sharpness")
    cfg = lm_cfg(hf_file, micro_batch_size=4, budget_amount=6, checkpoint_every=2, measure=measure,
                 measure_train_size=128)
    straight = run(cfg, tmp_path / "straight", progress=False)
    assert straight.state == "ok"
    metrics = json.loads((tmp_path / "straight" / "metrics.json").read_text())
    assert "measurement_errors" not in metrics, metrics.get("measurement_errors")
    assert metrics["hessian_attention_kernel"] == "math" and metrics["hessian_top_eigenvalue"] > 0
    assert metrics["noise_method"] == "two_batch" and "noise_fallback" in metrics   # the mask's .item() in vmap
    for key in ("sharpness_worst_rho0.05", "keskar_phi_eps1e-3", "m_sharpness_m128_rho0.05"):
        assert metrics[key] == metrics[key] and metrics[key] >= 0, key
    # killed after step 4 (its checkpoint), then the same command: the same history
    rd = tmp_path / "resumed"
    partial = run(cfg.replace(budget_amount=4, measure=()), rd, progress=False)
    assert partial.state == "ok"
    RunDir(rd).write_status("running")
    (rd / "metrics.json").unlink()
    resumed = run(cfg.replace(measure=()), rd, progress=False)
    assert resumed.state == "ok" and [r["train_loss"] for r in resumed.history] == \
        [r["train_loss"] for r in straight.history]


def test_gpt2_exact_noise_scale_where_vmap_takes_it(hf_file, tmp_path):
    """Without padding (no mask, no pad token to check for) GPT-2 goes through torch.func.vmap: per-example
    gradients and B_noise (its
    Hessian-vector products through the math attention kernel)."""
    cfg = lm_cfg(hf_file, dataset=f"{hf_file}:windows", model_kwargs={"pad_token_id": None}, measure=("noise_scale",),
                 measure_train_size=16)
    assert run(cfg, tmp_path / "r", progress=False).state == "ok"
    metrics = json.loads((tmp_path / "r" / "metrics.json").read_text())
    assert metrics["noise_method"] == "exact_per_example" and "measurement_errors" not in metrics
    assert "noise_b_noise_error" in metrics or metrics["noise_b_noise_attention_kernel"] == "math"


def test_gpt2_in_a_fused_group_gives_each_member_its_separate_run(hf_file, tmp_path, monkeypatch):
    import bsresearch.fused.generic as generic
    from bsresearch.fused import train_group
    monkeypatch.setattr(generic, "PAYS", 0.0)
    # padded batches: the mask GPT-2 builds from the data reads its values, which vmap refuses (one line)
    padded = [lm_cfg(hf_file, seed=s, data_loading="resident") for s in range(2)]
    results = train_group(padded, [tmp_path / f"p{i}" for i in range(2)], progress=False)
    reason = RunDir(tmp_path / "p0").status()["fusion"]
    assert [r.state for r in results] == ["ok", "ok"] and "\n" not in reason and "vmap cannot batch" in reason
    # fixed-length windows: one vmapped program for the members, each ending as its run alone does
    cfgs = [lm_cfg(hf_file, dataset=f"{hf_file}:windows", model_kwargs={"pad_token_id": None}, seed=s, lr=lr,
                   micro_batch_size=4) for s, lr in [(0, 3e-3), (1, 1e-3)]]
    fused = train_group(cfgs, [tmp_path / str(i) for i in range(2)], progress=False, group_id="g")
    assert "fusion" not in RunDir(tmp_path / "0").status()
    for f, cfg in zip(fused, cfgs, strict=True):
        alone = run(cfg, progress=False)
        assert f.state == alone.state == "ok"
        for a, b in zip(f.history, alone.history, strict=True):
            assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-4)
            assert a["test_loss"] == pytest.approx(b["test_loss"], rel=1e-4)


def test_gpt2_throughput_memory_and_advice(hf_file, tmp_path):
    from bsresearch.cli import main
    assert main(["bench", "--model", f"{hf_file}:gpt2", "--dataset", f"{hf_file}:sentences", "--loss", "model",
                 "--optimizer", "adam", "--precisions", "fp32", "--batch-sizes", "1,2,4", "--memory-budget", "64MiB",
                 "--repeats", "1", "--min-seconds", "0", "--warmup", "0", "--device", "cpu", "--out", str(tmp_path),
                 "--no-figure", "--quiet"]) == 0
    import pandas as pd
    table = pd.read_csv(next(tmp_path.glob("systems_cpu-*.csv")))
    assert table["status"].tolist() == ["ok"] * 3
    quick = ["--device", "cpu", "--batch-sizes", "4,8", "--noise-examples", "32", "--repeats", "1"]
    assert main(["advise", "--model", f"{hf_file}:gpt2", "--dataset", f"{hf_file}:sentences", "--loss", "model",
                 "--optimizer", "adam", "--lr", "3e-3", "--out", str(tmp_path / "advice"), *quick]) == 0
    record = json.loads((tmp_path / "advice" / "advice.json").read_text())
    assert record["recommendation"]["batch_size"] in (4, 8) and record["noise_scale"]["method"] == "two_batch"


# ----------------------------------------------------------------------------- every part, with a ViT
def test_vit_on_a_hugging_face_dataset_trains_is_measured_and_fuses(hf_file, tmp_path, monkeypatch):
    setup = run_setup(vit_cfg(hf_file))
    assert setup.task.kind == "classification" and setup.task.accuracy
    cfg = vit_cfg(hf_file, micro_batch_size=4, measure=("noise_scale", "hessian"), measure_train_size=16)
    result = run(cfg, tmp_path / "r", progress=False)
    assert result.state == "ok" and result.history[-1]["test_acc"] == result.history[-1]["test_acc"]
    metrics = json.loads((tmp_path / "r" / "metrics.json").read_text())
    assert "measurement_errors" not in metrics, metrics.get("measurement_errors")
    assert metrics["hessian_attention_kernel"] == "math" and metrics["noise_method"] == "exact_per_example"
    assert metrics["noise_b_noise_attention_kernel"] == "math"
    # its own loss too (labels from the dataset's `label` column)
    assert run(vit_cfg(hf_file, loss="model"), progress=False).state == "ok"
    import bsresearch.fused.generic as generic
    from bsresearch.fused import train_group
    monkeypatch.setattr(generic, "PAYS", 0.0)
    cfgs = [vit_cfg(hf_file, seed=s, data_loading="resident") for s in range(2)]
    fused = train_group(cfgs, [tmp_path / f"g{i}" for i in range(2)], progress=False, group_id="v")
    assert "fusion" not in RunDir(tmp_path / "g0").status()
    alone = run(cfgs[1], progress=False)
    for a, b in zip(fused[1].history, alone.history, strict=True):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-4)
        assert a["test_acc"] == pytest.approx(b["test_acc"], abs=1e-9)


def test_gpt2_sweep_report_and_landscape(hf_file, tmp_path):
    """A sweep of the GPT-2 over batch sizes, its generic report in the model's units, and the loss along the
    line between two of its trained runs."""
    from bsresearch.findings.runs import load_trained_model
    from bsresearch.measure import landscape
    from bsresearch.report import run_report
    from bsresearch.sweep import parse_spec, run_sweep
    spec = parse_spec({"name": "hf_report", "analysis": str(Path(__file__).resolve().parents[1] / "notebooks" /
                                                            "10_sweep_report.ipynb"),
                       "base": {"model": f"{hf_file}:gpt2", "dataset": f"{hf_file}:sentences", "loss": "model",
                                "optimizer": "adam", "lr": 3e-3, "budget": "steps", "budget_amount": 4,
                                "eval_schedule": "every", "eval_every": 2, "device": "cpu", "test_size": 16,
                                "save_checkpoint": True, "data_loading": "resident"},
                       "grid": {"batch_size": [4, 8]}, "seeds": 1})
    assert run_sweep(spec, tmp_path / "runs", executor="inline", engine="library", progress=False).all_finished
    folder = run_report(spec, tmp_path / "runs", tmp_path / "reports", allow_dirty=True)
    assert "nats per token" in (folder / "metrics_vs_batch.txt").read_text()
    a, b = (load_trained_model(d)[0] for d in sorted((tmp_path / "runs" / "hf_report").glob("*/")) if
            (d / "checkpoint.pt").exists())
    data = run_setup(lm_cfg(hf_file, data_loading="resident")).data
    table = landscape.interpolate(a, b, data, alphas=(0.0, 0.5, 1.0), splits=("test",), loss_fn=loss_for("model"))
    assert len(table) == 3 and table["loss"].notna().all()
