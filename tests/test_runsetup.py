"""runsetup: the one setup. The dry run's messages (one ConfigError naming the model, the data and the loss, for
each way they can fail to fit), the dry run leaving the model and the RNG as they were, the refusal to resume a
checkpoint of another trajectory, and the results of a finished run and of a run that ran out of memory before
training (a simulated out-of-memory error)."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from conftest import tiny_config

from bsresearch import config as C
from bsresearch import runsetup
from bsresearch.config import ConfigError
from bsresearch.data import Dataset
from bsresearch.losses import loss_for
from bsresearch.rundir import RunDir
from bsresearch.runsetup import RunSetup, dry_run, finished_result, out_of_memory_result, run_setup
from bsresearch.train import run


def data(n: int = 8, features: int = 4, classes: int = 3) -> Dataset:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(n, features, generator=g), torch.randint(0, classes, (n,), generator=g)
    return Dataset("toy", x, y, x[:2], y[:2], classes)


class Returns(nn.Module):
    """A linear model whose forward returns what `shape` makes of the logits."""

    def __init__(self, shape=lambda logits: logits, classes: int = 3) -> None:
        super().__init__()
        self.linear = nn.Linear(4, classes)
        self.shape = shape

    def forward(self, x):
        return self.shape(self.linear(x))


CE = loss_for("cross_entropy")


# ----------------------------------------------------------------------------- the dry run's messages
def test_a_model_that_cannot_take_the_inputs_is_named_with_the_inputs():
    with pytest.raises(ConfigError) as caught:
        dry_run(nn.Linear(5, 3), data(), CE, model_name="mine.py:Net", data_name="dataset toy")
    message = str(caught.value)
    assert message.startswith("model mine.py:Net on a batch of dataset toy (inputs (2, 4) float32) failed: "
                              "RuntimeError: ")
    assert "\n" not in message


def test_an_output_without_logits_is_named():
    with pytest.raises(ConfigError, match=r"^model net returned a dict without logits"):
        dry_run(Returns(lambda logits: {"scores": logits}), data(), CE, model_name="net")


def test_an_output_the_loss_cannot_take_names_the_loss_the_output_and_the_targets():
    with pytest.raises(ConfigError) as caught:
        dry_run(Returns(lambda logits: logits[:, :, None].expand(-1, -1, 7)[:, :, :5]), data(), CE, model_name="net")
    assert str(caught.value).startswith("loss cross_entropy on the output of model net ((2, 3, 5) float32) and "
                                        "targets (2,) int64 failed: ")


def test_a_loss_that_is_not_a_scalar_is_refused():
    per_example = loss_for(lambda output, y: nn.functional.cross_entropy(output, y, reduction="none"))
    with pytest.raises(ConfigError, match=r"must return a scalar \(the mean over the batch\); it returned "
                                          r"\(2,\) float32 for output \(2, 3\) float32 and targets \(2,\) int64"):
        dry_run(Returns(), data(), per_example, model_name="net")


def test_a_gradient_that_cannot_be_computed_is_named():
    with pytest.raises(ConfigError, match=r"^the gradient of loss cross_entropy with respect to model net's "
                                          r"parameters failed: RuntimeError: "):
        dry_run(Returns(lambda logits: logits.detach()), data(), CE, model_name="net")


def test_class_indices_beyond_the_model_s_classes_are_refused():
    with pytest.raises(ConfigError, match=r"model net gives 2 class scores, but the targets of dataset toy run "
                                          r"from 0 to 2: class indices must be 0 to 1"):
        dry_run(Returns(classes=2), data(), CE, model_name="net", data_name="dataset toy")


def test_a_training_set_smaller_than_the_batch_is_refused_before_any_model_is_built():
    with pytest.raises(ConfigError, match="batch"):
        run_setup(tiny_config(train_size=16, batch_size=32))


def test_the_dry_run_leaves_the_model_and_the_global_rng_as_they_were():
    model = Returns()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.eval()
    rng = torch.get_rng_state()
    task = dry_run(model, data(), CE)
    assert torch.equal(torch.get_rng_state(), rng)
    assert not model.training and all(p.grad is None for p in model.parameters())
    after = model.state_dict()
    assert list(before) == list(after) and all(torch.equal(before[k], after[k]) for k in before)
    assert task.accuracy and task.tokens_per_example == 1


def test_a_setup_of_parts_a_caller_holds_is_checked_by_the_same_dry_run():
    with pytest.raises(ConfigError, match="^model advise-model on a batch of"):
        RunSetup.checked(nn.Linear(5, 3), data(), CE, model_name="advise-model")
    setup = RunSetup.checked(Returns(), data(), CE)
    assert setup.device == torch.device("cpu") and setup.task.accuracy


# ----------------------------------------------------------------------------- resuming
def test_a_checkpoint_of_another_trajectory_is_not_resumed(tmp_path):
    """A trajectory's store holding a state saved by a run of another trajectory (its key differs): the run
    refuses it, naming the file and what to delete, instead of continuing from weights that are not its own."""
    cfg = tiny_config(optimizer="adam", lr=1e-2, batch_size=8, base_batch_size=8, lr_scaling="sqrt", budget="tokens",
                      budget_amount=800, eval_every=20, snapshot_at_tokens=(240, 400), adam_beta2=0.95,
                      beta2_scaling="half_life")
    setup = run_setup(cfg)
    rd = RunDir(tmp_path / "sweep" / "a")
    trajectory = setup.trajectory(cfg, rd)
    assert trajectory is not None and trajectory.saves
    other = cfg.replace(lr=cfg.lr * 2)
    assert C.trajectory_key(other) != C.trajectory_key(cfg)
    stranger = setup.member(0, other)
    trajectory.folder.mkdir(parents=True)
    from bsresearch.state import save_checkpoint
    save_checkpoint(trajectory.path(trajectory.saves[0]), other, stranger.state, True, {})
    with pytest.raises(ConfigError, match=r"holds the state of another trajectory; delete .*\.trajectories"):
        setup.member(0, cfg, rd, trajectory=trajectory)
    trajectory.release()


def test_a_checkpoint_of_another_run_in_the_run_directory_is_not_resumed(tmp_path):
    """The run directory's resumable checkpoint of another config (another run id) is not this run's: the
    member starts at step 0."""
    cfg = tiny_config(budget_amount=20, checkpoint_every=10)
    from conftest import killed_at
    with killed_at(15):
        run(cfg, tmp_path / "run")
    setup = run_setup(cfg)
    assert setup.member(0, cfg, tmp_path / "run").state.step == 10
    assert setup.member(0, cfg.replace(lr=0.05), tmp_path / "run").state.step == 0
    assert setup.member(0, cfg, tmp_path / "run", resume=False).state.step == 0


# ----------------------------------------------------------------------------- results without training
def test_a_finished_run_directory_is_its_result_and_an_unfinished_one_is_none(tmp_path):
    assert finished_result(None) is None and finished_result(tmp_path / "absent") is None
    done = run(tiny_config(budget_amount=5), tmp_path / "done")
    again = finished_result(tmp_path / "done")
    assert again is not None and again.state == "ok" and again.metrics == done.metrics
    assert len(again.history) == len(done.history) == 2
    assert [r["step"] for r in again.history] == [r["step"] for r in done.history]
    RunDir(tmp_path / "done").write_status("running")
    assert finished_result(tmp_path / "done") is None


def test_out_of_memory_before_training_is_written_as_the_run_s_result(tmp_path):
    cfg = tiny_config()
    result = out_of_memory_result(cfg, tmp_path / "run", torch.device("cpu"), "simulated", group="g1")
    rd = RunDir(tmp_path / "run")
    assert result.state == rd.state() == "oom" and result.run_dir == rd.path
    assert result.error == "out of memory while loading the data or building the model on cpu: simulated"
    assert rd.status()["group"] == "g1" and rd.status()["error"] == result.error
    assert rd.config()["derived"]["run_id"] == C.run_id(cfg)   # results.load reads it as a run, not pending
    assert out_of_memory_result(cfg, None, torch.device("cpu"), "x").run_dir is None


def test_a_simulated_out_of_memory_in_the_setup_is_the_run_s_result(tmp_path, monkeypatch):
    """The data did not fit on the device (a simulated torch.OutOfMemoryError while it is loaded): train.run
    returns state oom, written to its run directory, not raised; any other error is raised."""
    def no_room(cfg, device):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    monkeypatch.setattr(runsetup, "dataset_for", no_room)
    result = run(tiny_config(), tmp_path / "run")
    assert result.state == "oom" and "Tried to allocate 2.00 GiB" in (result.error or "")
    assert RunDir(tmp_path / "run").state() == "oom"

    def broken(cfg, device):
        raise ValueError("not a memory problem")
    monkeypatch.setattr(runsetup, "dataset_for", broken)
    with pytest.raises(ValueError, match="not a memory problem"):
        run(tiny_config(), tmp_path / "other")
