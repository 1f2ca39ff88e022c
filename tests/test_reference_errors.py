"""Every mistake in a reference to a user's model, data or loss is one line naming it, exit status 2, before
any work and with nothing created: `bsresearch train` and a sweep spec alike."""
import textwrap
from pathlib import Path

import pytest

from bsresearch.cli import main

BAD = textwrap.dedent('''
    import torch
    import torch.nn as nn
    from torch.utils.data import Dataset, TensorDataset


    def make_model(width=8):
        return nn.Linear(4, width)


    def explode():
        raise RuntimeError("no GPU budget left")


    def not_a_module():
        return 3


    def make_data(n=64):
        return TensorDataset(torch.randn(n, 4, generator=torch.Generator().manual_seed(0)), 7 - torch.arange(n) % 8)


    def tiny_data():
        return TensorDataset(torch.randn(10, 4), torch.randint(8, (10,)))


    class Triples(Dataset):
        def __len__(self):
            return 20

        def __getitem__(self, i):
            return torch.zeros(4), 0, "extra"


    def triples():
        return Triples()


    def wrong_width():
        return TensorDataset(torch.randn(64, 5), torch.randint(8, (64,)))


    def per_example(output, target):
        return torch.nn.functional.cross_entropy(output, target, reduction="none")
''')

CASES = {
    "missing file": (["--model", "nowhere/model.py:make_model"], "model: file 'nowhere/model.py' does not exist"),
    "missing name": (["--model", "{f}:make_modle"], "has no 'make_modle' (did you mean 'make_model'?)"),
    "syntax error": (["--model", "{s}:make_model"], "syntax.py' has a syntax error at line 3: "),
    "import raises": (["--model", "{r}:make_model"], "raised ValueError: set BSR_TEST first while it was imported "
                                                   "(raises.py, line 3)"),
    "factory raises": (["--model", "{f}:explode"], "raised RuntimeError: no GPU budget left (bad.py, line 12)"),
    "not a module": (["--model", "{f}:not_a_module"], "must return a torch.nn.Module; it returned a int"),
    "model_kwargs": (["--model-kwargs", "widht=4"], "model_kwargs: {f}:make_model does not accept 'widht' (did you "
                                                   "mean 'width'?); it accepts width"),
    "dataset_kwargs": (["--dataset-kwargs", "size=4"], "dataset_kwargs: {f}:make_data does not accept 'size'"),
    "items": (["--dataset", "{f}:triples"], "items must be (input, target) pairs; item 0 is a tuple of 3"),
    "smaller than a batch": (["--dataset", "{f}:tiny_data"], "batch_size 16 exceeds the training set size 8"),
    "fewer classes than the targets": (["--model-kwargs", "width=3"], "gives 3 class scores, but the targets of "
                                                                     "dataset {f}:make_data run from 0 to 7"),
    "output the loss cannot take": (["--loss", "bce_with_logits"], "loss bce_with_logits on the output of model"),
    "inputs the model cannot take": (["--dataset", "{f}:wrong_width"], "on a batch of dataset"),
    "loss not a scalar": (["--loss", "{f}:per_example"], "must return a scalar (the mean over the batch); it "
                                                        "returned (2,) float32"),
    "no name": (["--model", "{f}"], "model must be one of mlp, cnn1d, convnet, resnet, or FILE.py:NAME"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_reference_is_one_line_and_nothing_is_created(tmp_path, capsys, case):
    files = {"f": tmp_path / "bad.py", "s": tmp_path / "syntax.py", "r": tmp_path / "raises.py"}
    files["f"].write_text(BAD)
    files["s"].write_text("import torch\n\ndef make_model(:\n    pass\n")
    files["r"].write_text("import os\nif 'BSR_TEST' not in os.environ:\n    raise ValueError('set BSR_TEST first')\n")
    options, expected = CASES[case]
    options = [o.format(**files) for o in options]
    base = ["--model", f"{files['f']}:make_model", "--dataset", f"{files['f']}:make_data", "--batch-size", "16",
            "--budget", "steps", "--budget-amount", "3", "--device", "cpu", "--quiet"]
    runs = tmp_path / "runs"
    code = main(["train", *base, *options, "--runs", str(runs)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("bsresearch: error: ") and "Traceback" not in err, err
    assert expected.format(**files) in err, err
    assert not runs.exists()


def test_a_sweep_with_a_bad_reference_stops_before_any_run(tmp_path, capsys):
    user = tmp_path / "bad.py"
    user.write_text(BAD)
    spec = tmp_path / "bad.yaml"
    spec.write_text(textwrap.dedent(f"""
        name: badref
        base: {{model: "{user}:make_model", dataset: "{user}:make_data", budget: steps, budget_amount: 3,
               device: cpu}}
        grid: {{batch_size: [8, 16], dataset: ["{user}:make_data", "{user}:wrong_width"]}}
    """))
    code = main(["sweep", str(spec), "--runs", str(tmp_path / "runs"), "--executor", "inline", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "mat1 and mat2 shapes cannot be multiplied" in err, err
    assert "grid point" in err and not (tmp_path / "runs" / "badref").exists()


def test_relative_paths_in_messages_are_as_the_user_wrote_them(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("mine.py").write_text(BAD)
    code = main(["train", "--model", "mine.py:make_modle", "--dataset", "mine.py:make_data", "--runs",
                 str(tmp_path / "runs"), "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 2 and "has no 'make_modle'" in err and "mine.py" in err
