import numpy as np
import pytest
import torch

from bsresearch import config as C
from bsresearch.config import ConfigError
from bsresearch.data import (
    DATASETS,
    DEBIAN_FASHION_MNIST,
    BatchSampler,
    DatasetUnavailable,
    _find_idx_files,
    dataset_availability,
    load_dataset,
)
from bsresearch.runtime import make_generator


def test_registry_matches_config():
    assert tuple(DATASETS) == C.DATASETS


def test_mnist1d_offline_shapes_and_standardisation():
    d = load_dataset("mnist1d")
    assert d.x_train.shape == (4000, 40) and d.x_test.shape == (1000, 40)
    assert d.num_classes == 10 and set(d.y_train.unique().tolist()) == set(range(10))
    assert abs(d.x_train.mean().item()) < 1e-4 and abs(d.x_train.std().item() - 1) < 1e-3


def test_mnist1d_generation_leaves_global_rngs_alone(tmp_path):
    np.random.seed(123)
    expected = np.random.rand()
    np.random.seed(123)
    load_dataset("mnist1d", data_dir=tmp_path)  # generates into an empty folder
    assert np.random.rand() == expected
    assert (tmp_path / "mnist1d" / "mnist1d_default.npz").exists()


def test_train_size_subset_is_fixed_across_seeds():
    a = load_dataset("mnist1d", train_size=500)
    b = load_dataset("mnist1d", train_size=500)
    assert a.n_train == 500 and torch.equal(a.x_train, b.x_train)
    with pytest.raises(ConfigError, match="train_size 5000 exceeds"):
        load_dataset("mnist1d", train_size=5000)


def test_synthetic_any_size_and_deterministic():
    a, b = load_dataset("synthetic", train_size=300), load_dataset("synthetic", train_size=300)
    assert a.x_train.shape == (300, 20) and torch.equal(a.y_train, b.y_train)
    assert len(a.y_train.unique()) == 4


@pytest.mark.skipif(_find_idx_files([DEBIAN_FASHION_MNIST]) is None,
                    reason="Debian's dataset-fashion-mnist is not installed (make data)")
def test_fashion_mnist_from_debian_files():
    d = load_dataset("fashion_mnist", train_size=2000)
    assert d.x_train.shape == (2000, 1, 28, 28) and d.x_test.shape == (10000, 1, 28, 28)
    assert d.num_classes == 10


def test_fashion_mnist_from_a_data_dir(tmp_path):
    """IDX files in data_dir/fashion_mnist are found (here: tiny files written by the test)."""
    import gzip
    import struct
    folder = tmp_path / "fashion_mnist"
    folder.mkdir()

    def write(name, arr):
        header = struct.pack(">HBB", 0, 8, arr.ndim) + struct.pack(">" + "I" * arr.ndim, *arr.shape)
        with gzip.open(folder / f"{name}.gz", "wb") as f:
            f.write(header + arr.astype(np.uint8).tobytes())
    rng = np.random.default_rng(0)
    write("train-images-idx3-ubyte", rng.integers(0, 255, (20, 28, 28)))
    write("train-labels-idx1-ubyte", np.arange(20) % 10)
    write("t10k-images-idx3-ubyte", rng.integers(0, 255, (10, 28, 28)))
    write("t10k-labels-idx1-ubyte", np.arange(10))
    d = load_dataset("fashion_mnist", data_dir=tmp_path)
    assert d.x_train.shape == (20, 1, 28, 28) and d.y_test.tolist() == list(range(10))


def test_torchvision_datasets_fail_clearly_without_it(tmp_path, monkeypatch):
    import builtins
    real_import = builtins.__import__

    def broken(name, *args, **kwargs):  # what a torchvision built for another torch does
        if name.startswith("torchvision"):
            raise RuntimeError("operator torchvision::nms does not exist")
        return real_import(name, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", broken)
    with pytest.raises(DatasetUnavailable, match="needs torchvision.*RuntimeError.*nms"):
        load_dataset("cifar10", data_dir=tmp_path)
    rows = {name: ok for name, ok, _ in dataset_availability(tmp_path)}
    assert rows["cifar10"] is False and rows["synthetic"] is True


def test_same_seed_same_order_and_epochs_are_permutations():
    def first_batches(seed):
        s = BatchSampler(100, 10, make_generator(seed, "data"))
        return [s.next() for _ in range(20)]
    a, b, c = first_batches(0), first_batches(0), first_batches(1)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(torch.equal(x, y) for x, y in zip(a, c))
    assert sorted(torch.cat(a[:10]).tolist()) == list(range(100))   # one epoch covers each example once
    assert sorted(torch.cat(a[10:]).tolist()) == list(range(100))


def test_partial_batch_dropped_and_replacement_sampling():
    s = BatchSampler(25, 10, make_generator(0, "data"))
    s.next(), s.next()
    assert s.epochs_started == 1
    s.next()
    assert s.epochs_started == 2     # the 5 left over were dropped
    r = BatchSampler(50, 50, make_generator(0, "data"), replacement=True)
    draws = r.next()
    assert len(draws) == 50 and len(draws.unique()) < 50   # with replacement, repeats are expected
    with pytest.raises(ConfigError, match="exceeds the training set size"):
        BatchSampler(10, 11, make_generator(0, "data"))


def test_sampler_state_round_trip():
    s = BatchSampler(30, 7, make_generator(3, "data"))
    for _ in range(5):
        s.next()
    saved = s.state_dict()
    expected = [s.next() for _ in range(6)]
    t = BatchSampler(30, 7, make_generator(99, "data"))
    t.load_state_dict(saved)
    assert all(torch.equal(x, y) for x, y in zip(expected, [t.next() for _ in range(6)], strict=True))


def test_mnist1d_large_is_the_same_generator_with_more_signals(tmp_path, monkeypatch):
    """mnist1d_large has its own cache and split sizes (here a small stand-in size, to stay fast)."""
    from bsresearch import data as data_module
    monkeypatch.setitem(data_module.MNIST1D_SAMPLES, "mnist1d_large", 1500)
    large = load_dataset("mnist1d_large", data_dir=tmp_path)
    assert large.x_train.shape == (1200, 40) and large.x_test.shape == (300, 40)
    assert (tmp_path / "mnist1d" / "mnist1d_1500.npz").exists()
    assert not (tmp_path / "mnist1d" / "mnist1d_default.npz").exists()
    assert large.num_classes == 10 and set(large.y_train.tolist()) == set(range(10))


def test_fashion_mnist_missing_names_the_dataset_the_folders_and_the_remedies(tmp_path, monkeypatch):
    import bsresearch.data as data_module

    monkeypatch.setattr(data_module, "DEBIAN_FASHION_MNIST", tmp_path / "no-debian-package")

    def no_torchvision(dataset="this dataset"):
        raise DatasetUnavailable(f"{dataset} needs torchvision", reason="it does not import here")
    monkeypatch.setattr(data_module, "_import_torchvision", no_torchvision)
    with pytest.raises(DatasetUnavailable) as err:
        load_dataset("fashion_mnist", data_dir=tmp_path)
    message = str(err.value)
    assert "\n" not in message and message.startswith("dataset fashion_mnist:")
    for folder in data_module.fashion_mnist_folders(tmp_path):
        assert str(folder) in message
    for remedy in ("apt-get install dataset-fashion-mnist", "--data-dir", "torchvision", "does not import"):
        assert remedy in message
    assert not any(tmp_path.iterdir())  # nothing was created


@pytest.mark.parametrize("name", ["cifar10", "cifar100", "mnist", "svhn"])
def test_torchvision_datasets_name_themselves_when_unavailable(tmp_path, monkeypatch, name):
    import bsresearch.data as data_module

    def no_torchvision(dataset="this dataset"):
        raise DatasetUnavailable(f"{dataset} needs torchvision", reason="it does not import here")
    monkeypatch.setattr(data_module, "_import_torchvision", no_torchvision)
    with pytest.raises(DatasetUnavailable, match=f"dataset {name} needs torchvision"):
        load_dataset(name, data_dir=tmp_path)
