"""`bsresearch advise`: the shipped transformer end to end, and every user mistake as one line, exit 2,
before any work (no output folder)."""
import json
from pathlib import Path

import pandas as pd
import pytest

from bsresearch.cli import main

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
LM = EXAMPLES / "tiny_transformer.py"
QUICK = ["--device", "cpu", "--batch-sizes", "4,8", "--noise-examples", "16", "--repeats", "1"]


def test_transformer_end_to_end(tmp_path, capsys):
    out = tmp_path / "advice"
    rc = main(["advise", "--model", f"{LM}:make_model", "--data", f"{LM}:make_data", "--loss", f"{LM}:loss_fn",
               "--optimizer", "adam", "--lr", "0.001", "--base-batch-size", "4", "--out", str(out), *QUICK])
    assert rc == 0
    assert {p.name for p in out.iterdir()} == {"advice.json", "advice.csv", "advice.png", "advice.pdf"}
    record = json.loads((out / "advice.json").read_text())
    table = pd.read_csv(out / "advice.csv")
    rec = record["recommendation"]
    assert table["batch_size"].tolist() == [4, 8]
    assert rec["batch_size"] == table.loc[table["effective_examples_per_second"].idxmax(), "batch_size"]
    assert rec["lr_rule"] == "sqrt" and rec["lr"] == pytest.approx(0.001 * (rec["batch_size"] / 4) ** 0.5)
    assert record["noise_scale"]["method"] == "exact_per_example" and record["noise_scale"]["b_simple"] > 0
    assert record["memory"]["sizes_tried"] == [4, 8] and record["memory"]["search_reached_limit"]
    assert record["arguments"]["optimizer"] == "adam" and len(record["table"]) == 2
    printed = capsys.readouterr().out
    assert f"recommended batch size {rec['batch_size']}" in printed and "advice.json" in printed


def _write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("case, expected", [
    ("missing_file", "model: file 'nowhere/model.py' does not exist in the working directory"),
    ("missing_factory", "has no 'build'; it defines"),
    ("no_colon", "or FILE.py:NAME / package.module:NAME of your model factory"),
    ("bad_module", "module 'no_such_module_for_advise' cannot be imported"),
    ("model_wrong_kind", "must return a torch.nn.Module; it returned a int"),
    ("data_wrong_kind", "must be a map-style torch Dataset of (input, target) items"),
    ("loss_not_scalar", "must return a scalar (the mean over the batch)"),
    ("loss_unknown", "loss must be one of cross_entropy, mse"),
    ("bad_optimizer", "optimizer must be one of sgd, adam, adamw"),
    ("bad_budget", "--memory-budget must be a size"),
    ("bad_sizes", "--batch-sizes must be a comma-separated list of positive integers"),
    ("bad_lr", "lr must be a positive number"),
])
def test_user_mistakes_are_one_line_and_exit_2(tmp_path, capsys, case, expected):
    factories = _write(tmp_path, "factories.py", "import torch\n"
                       "def number():\n    return 3\n"
                       "def text():\n    return 'not data'\n"
                       "def per_example_loss(out, y):\n"
                       "    return torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), "
                       "y.reshape(-1), reduction='none')\n")
    model, data, extra = f"{LM}:make_model", f"{LM}:make_data", []
    if case == "missing_file":
        model = "nowhere/model.py:make_model"
    elif case == "missing_factory":
        model = f"{LM}:build"
    elif case == "no_colon":
        model = str(LM)
    elif case == "bad_module":
        model = "no_such_module_for_advise:make_model"
    elif case == "model_wrong_kind":
        model = f"{factories}:number"
    elif case == "data_wrong_kind":
        data = f"{factories}:text"
    elif case == "loss_not_scalar":
        extra = ["--loss", f"{factories}:per_example_loss"]
    elif case == "loss_unknown":
        extra = ["--loss", "hinge"]
    elif case == "bad_optimizer":
        extra = ["--optimizer", "lion"]
    elif case == "bad_budget":
        extra = ["--memory-budget", "lots"]
    elif case == "bad_sizes":
        extra = ["--batch-sizes", "8,x"]
    elif case == "bad_lr":
        extra = ["--lr", "-1"]
    out = tmp_path / "advice"
    rc = main(["advise", "--model", model, "--data", data, "--out", str(out), *QUICK, *extra])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith("bsresearch: error: ") and expected in err, err
    assert "Traceback" not in err and not out.exists()


def test_what_advise_assumed_is_said_beside_the_recommendation(tmp_path, capsys):
    # no lr, base batch or weights given: the summary says what it took for them, before any warning
    assert main(["advise", "--model", "mlp", "--dataset", "synthetic", "--out", str(tmp_path / "a"), *QUICK]) == 0
    printed = capsys.readouterr().out.splitlines()
    assumed = [line for line in printed if line.startswith("  assumed (not given): ")]
    assert [a.split(": ", 1)[1].split(",")[0] for a in assumed] == ["lr 0.05", "that lr holds at batch 32",
                                                                    "the noise scale measured at the model's "
                                                                    "initial weights; it usually grows as the loss "
                                                                    "falls"]
    assert printed.index(assumed[0]) == 1   # right under the recommendation
    assert any("B_simple" in line and "at the initial weights" in line for line in printed)
    record = json.loads((tmp_path / "a" / "advice.json").read_text())
    assert record["measured_at"] == "the initial weights" and len(record["assumptions"]) == 3
    # given: only the measurement point is assumed
    assert main(["advise", "--model", "mlp", "--dataset", "synthetic", "--lr", "0.02", "--base-batch-size", "8",
                 "--out", str(tmp_path / "b"), *QUICK]) == 0
    assert sum(line.startswith("  assumed") for line in capsys.readouterr().out.splitlines()) == 1


def test_devices_flag_and_the_configs_devices(tmp_path, capsys):
    out = tmp_path / "two"
    assert main(["advise", "--model", "mlp", "--dataset", "synthetic", "--devices", "2", "--out", str(out),
                 *QUICK]) == 0
    printed = capsys.readouterr().out
    record = json.loads((out / "advice.json").read_text())
    memory, rec = record["memory"], record["recommendation"]
    assert memory["devices"] == 2 and rec["devices"] == 2 and memory["sizes_tried"] == [2, 4]   # per-device shares
    assert memory["largest_global_batch_size"] == 2 * memory["largest_batch_size"] == 8
    assert rec["per_device_batch"] == rec["micro_batch_size"] // 2
    table = pd.read_csv(out / "advice.csv")
    assert table["devices"].tolist() == [2, 2] and table["per_device_batch"].tolist() == [2, 4]
    assert "on 2 devices" in printed and "2 devices not timed" in printed
    # a config file's devices, unless --devices names them
    config = tmp_path / "cfg.json"
    config.write_text(json.dumps({"model": "mlp", "dataset": "synthetic", "devices": 2}))
    assert main(["advise", str(config), "--out", str(tmp_path / "cfg"), *QUICK]) == 0
    assert json.loads((tmp_path / "cfg" / "advice.json").read_text())["memory"]["devices"] == 2
    assert main(["advise", str(config), "--devices", "1", "--out", str(tmp_path / "one"), *QUICK]) == 0
    assert json.loads((tmp_path / "one" / "advice.json").read_text())["memory"]["devices"] == 1


@pytest.mark.parametrize("value, expected", [
    ("0", "--devices must be a positive integer (1, 2, ...); got '0'"),
    ("-1", "--devices must be a positive integer (1, 2, ...); got '-1'"),
    ("1.5", "--devices must be a positive integer (1, 2, ...); got '1.5'"),
    ("x", "--devices must be a positive integer (1, 2, ...); got 'x'"),
    ("3", "batch_sizes must split into 3 equal per-device shares (multiples of devices 3); got 4"),
])
def test_bad_devices_are_one_line_and_exit_2(tmp_path, capsys, value, expected):
    out = tmp_path / "advice"
    rc = main(["advise", "--model", "mlp", "--dataset", "synthetic", "--devices", value, "--out", str(out), *QUICK])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith("bsresearch: error: ") and expected in err, err
    assert "Traceback" not in err and not out.exists()
