"""The two examples a user would write, trained through bsresearch exactly as any reference: the GPT-style
language model on Debian's fortunes text and the small ResNet on Fashion-MNIST (each skips where `make data`
could not install its data)."""
import math

import pytest
import torch
from conftest import load_example

from bsresearch.config import RunConfig
from bsresearch.data import StreamedDataset, dataset_for
from bsresearch.rundir import RunDir
from bsresearch.train import run

lm, vision = load_example("lm"), load_example("vision")
needs_fortunes = pytest.mark.skipif(not (lm.FORTUNES / "cookie").exists(), reason="Debian's fortunes is not installed "
                                    "(`make data` installs it as root)")
needs_fashion = pytest.mark.skipif(not (vision.FOLDER / "train-images-idx3-ubyte.gz").exists(),
                                   reason="Debian's dataset-fashion-mnist is not installed (`make data`)")


@needs_fortunes
def test_the_text_is_pinned_and_split_by_position_within_every_file():
    texts = lm.read_corpus()
    assert len(texts) == 39 and sum(map(len, texts)) > 2_000_000
    train, validation = lm.make_data(context=64)
    expected_train = "".join(t[:round(len(t) * 0.9)] for t in texts)
    expected_validation = "".join(t[round(len(t) * 0.9):] for t in texts)
    for windows, text in ((train, expected_train), (validation, expected_validation)):
        x, y = windows.tensors
        assert x.shape[1] == 64 and torch.equal(x[:, 1:], y[:, :-1])   # targets: the next character
        assert torch.equal(x.reshape(-1)[64:], y.reshape(-1)[63:-1])      # consecutive windows, no overlap
        assert lm.decode(x.reshape(-1)) == text[:x.numel()]               # the text itself, in order
    assert windows.characters_per_token == 1.0


@needs_fortunes
def test_the_language_model_trains_through_bsresearch(tmp_path):
    cfg = RunConfig(model="examples/lm.py:make_model", model_kwargs={"context": 32, "width": 32, "depth": 1,
                                                                     "heads": 2},
                    dataset="examples/lm.py:make_data", dataset_kwargs={"context": 32}, optimizer="adamw", lr=3e-3,
                    batch_size=16, budget="tokens", budget_amount=16 * 32 * 20, eval_schedule="every", eval_every=10,
                    eval_train_size=64, eval_test_size=64, device="cpu", save_checkpoint=False)
    result = run(cfg, tmp_path / "lm", progress=False)
    first, last = result.history[0], result.history[-1]
    assert result.state == "ok" and last["tokens"] == 20 * 16 * 32
    assert first["train_loss"] == pytest.approx(math.log(lm.VOCAB_SIZE), rel=0.05)   # uniform at the start
    assert last["train_loss"] < first["train_loss"] - 0.5
    assert last["test_bits_per_character"] == pytest.approx(last["test_loss"] / math.log(2))
    derived = RunDir(tmp_path / "lm").config()["derived"]
    assert derived["loss_unit"] == "nats per token" and derived["bits_unit"] == "bits per character"


@needs_fashion
def test_the_vision_model_trains_on_the_streamed_path(tmp_path):
    cfg = RunConfig(model="examples/vision.py:make_model", model_kwargs={"width": 4},
                    dataset="examples/vision.py:make_data", train_size=256, batch_size=32, lr=0.05, budget_amount=2,
                    eval_schedule="every", eval_every=8, eval_test_size=256, device="cpu", save_checkpoint=False)
    assert isinstance(dataset_for(cfg), StreamedDataset)   # items built on demand: served by a DataLoader
    result = run(cfg, tmp_path / "v", progress=False)
    assert result.state == "ok" and result.metrics["steps"] == 16
    assert result.metrics["train_loss"] < result.history[0]["train_loss"] and 0 <= result.metrics["test_acc"] <= 1


# examples/lm.py is named by every language-model spec, and a referenced file's sha256 is part of each run's id
# (config.run_id): an edit gives every LM run a new id, so a sweep in progress starts again and a report made after
# the edit finds none of the runs made before it. Change this pin only on purpose, knowing that.
LM_SHA256 = "e9ce156f2175363920ad6cf51ab58833d1bcf1e8a3372e6b52c24eb052beb7b7"


def test_the_language_model_example_is_the_file_the_lm_runs_were_keyed_by():
    import hashlib
    digest = hashlib.sha256(open(lm.__file__, "rb").read()).hexdigest()
    assert digest == LM_SHA256, ("examples/lm.py changed: every language-model run gets a new id (its sha256 is "
                                 "part of the id); update LM_SHA256 only if that is intended")
