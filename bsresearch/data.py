"""The data of a run, resident on its device or streamed, and the batch sampler that orders it.

Two ways to serve the same examples, chosen by RunConfig.data_loading:
- resident (`Dataset`): tensors loaded whole, moved to the device once; a batch is an index into them.
  The fast path for data that fits: every built-in dataset, and a user's tensors or TensorDataset.
- stream (`StreamedDataset`): a user's map-style torch Dataset served through torch's DataLoader (worker
  processes, pinned memory on CUDA), for data too large to hold as one tensor or built item by item.
Both take their batches from the run's own seeded BatchSampler, so the order of examples is the same:
on one machine the same data through either path gives the same history bit for bit.

Built-in datasets are standardised with training-set statistics; a user's data is used as given.

Registry (names in config.DATASETS):
- mnist1d:       generated offline by the `mnist1d` package (4000 train / 1000 test, 40-dim signals), cached.
- mnist1d_large: the same generator with 40000 train / 10000 test signals, for large-batch studies.
- fashion_mnist: IDX files from a data_dir, Debian's dataset-fashion-mnist, or torchvision's download.
- synthetic:     a seeded teacher-network classification task of any size, for tests.
- cifar10, cifar100, mnist, svhn: through torchvision when it imports and can find or fetch the files.
"""
from __future__ import annotations

import gzip
import os
import struct
import tempfile
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Subset, TensorDataset
from torch.utils.data import Dataset as TorchDataset
from torch.utils.data import default_collate as collate

from . import config as C
from .config import ConfigError, RunConfig
from .runtime import make_generator

DEBIAN_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
SYNTHETIC_DEFAULT_SIZE = 1024


class DatasetUnavailable(ConfigError):
    """The dataset's files are missing here and cannot be fetched; the message names the dataset, where
    its files were looked for and how to get them. `reason` is the short cause, without the advice."""

    def __init__(self, message: str, reason: str | None = None):
        super().__init__(message)
        self.reason = reason or message


EVAL_CHUNK = 2048    # examples per forward pass during evaluation
EVAL_TOKENS = 16384  # at most this many targets per forward pass (a language model's sequences of tokens)


def eval_chunk_size(tokens_per_example: int = 1) -> int:
    """Examples per evaluation forward pass: EVAL_CHUNK, fewer when each example holds many targets."""
    return max(1, min(EVAL_CHUNK, EVAL_TOKENS // tokens_per_example))


@dataclass(frozen=True)
class Dataset:
    """Resident data: tensors on one device. Built-in datasets: x (N, *input_shape) float32 standardised,
    y (N,) int64 class labels. A user's data: their tensors as given.

    A user's mapping batches keep their inputs as named tensors (batch.Features), indexed as a tensor is.
    `attributes` are what a user's dataset says of itself (userdata.ATTRIBUTES: num_classes,
    characters_per_token, bytes_per_token).
    """
    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int | None
    attributes: Mapping[str, Any] = field(default_factory=dict)
    resident = True

    @property
    def n_train(self) -> int:
        return len(self.x_train)

    @property
    def n_test(self) -> int:
        return len(self.x_test)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])

    def to(self, device: torch.device | str) -> Dataset:
        return replace(self, x_train=self.x_train.to(device), y_train=self.y_train.to(device),
                       x_test=self.x_test.to(device), y_test=self.y_test.to(device))

    def first(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first n training examples."""
        return self.x_train[:n], self.y_train[:n]

    def train_batches(self, indices: Iterable[torch.Tensor]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The training batch of each index tensor, gathered when it is asked for."""
        for idx in indices:
            yield self.x_train[idx], self.y_train[idx]

    def eval_batches(self, split: str, limit: int | None = None,
                     chunk_size: int = EVAL_CHUNK) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Consecutive chunks of the first `limit` examples (all by default) of split 'train' or 'test'."""
        x, y = (self.x_train, self.y_train) if split == "train" else (self.x_test, self.y_test)
        return in_chunks(x[:limit], y[:limit], chunk_size)


@dataclass(frozen=True)
class StreamedDataset:
    """A user's map-style Datasets served through torch's DataLoader, batches moved to `device`.

    Training batches come from the run's BatchSampler (the DataLoader's batch_sampler), evaluation in
    consecutive chunks of EVAL_CHUNK, as on the resident path. `workers` DataLoader processes; pinned memory
    on CUDA.
    """
    name: str
    train: TorchDataset
    test: TorchDataset
    device: torch.device
    workers: int = 0
    num_classes: int | None = None
    attributes: Mapping[str, Any] = field(default_factory=dict)
    collate_fn: Callable[[list[Any]], Any] = collate   # items -> a batch (a user's collator, padding say)
    resident = False
    _eval_loaders: dict[tuple[str, int | None, int], DataLoader] = field(default_factory=dict, compare=False,
                                                                         repr=False)

    @property
    def n_train(self) -> int:
        return len(self.train)  # type: ignore[arg-type]

    @property
    def n_test(self) -> int:
        return len(self.test)  # type: ignore[arg-type]

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.first(1)[0].shape[1:])

    def _loader(self, dataset: TorchDataset, **kwargs: Any) -> DataLoader:
        return DataLoader(dataset, num_workers=self.workers, pin_memory=self.device.type == "cuda",
                          collate_fn=self.collate_fn, **kwargs)

    def _to_device(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        from .userdata import as_pair
        return self._move(*as_pair(batch, f"dataset {self.name}"))

    def _move(self, x: Any, y: torch.Tensor) -> tuple[Any, torch.Tensor]:
        blocking = self.device.type != "cuda"
        return x.to(self.device, non_blocking=not blocking), y.to(self.device, non_blocking=not blocking)

    def first(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        from .userdata import collated
        return self._move(*collated(self.collate_fn, [self.train[i] for i in range(n)], f"dataset {self.name}"))

    def train_batches(self, indices: Iterable[torch.Tensor]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        lists = (idx.tolist() for idx in indices)
        for batch in self._loader(self.train, batch_sampler=lists):
            yield self._to_device(batch)

    def eval_batches(self, split: str, limit: int | None = None,
                     chunk_size: int = EVAL_CHUNK) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        key = (split, limit, chunk_size)
        if key not in self._eval_loaders:  # kept: its workers (persistent) serve every evaluation of the run
            dataset = self.train if split == "train" else self.test
            if limit is not None and limit < len(dataset):  # type: ignore[arg-type]
                dataset = Subset(dataset, range(limit))
            self._eval_loaders[key] = self._loader(dataset, batch_size=chunk_size, shuffle=False,
                                                   persistent_workers=self.workers > 0)
        for batch in self._eval_loaders[key]:
            yield self._to_device(batch)


Data = Dataset | StreamedDataset  # what a training run reads its examples from


# ----------------------------------------------------------------------------- where files live
def default_data_dir() -> Path:
    """$BSRESEARCH_DATA_DIR, else the checkout's data/ folder, else ~/.cache/bsresearch."""
    if os.environ.get("BSRESEARCH_DATA_DIR"):
        return Path(os.environ["BSRESEARCH_DATA_DIR"])
    checkout_data = Path(__file__).resolve().parent.parent / "data"
    if checkout_data.is_dir():
        return checkout_data
    return Path.home() / ".cache" / "bsresearch"


def _atomic_save_npz(path: Path, **arrays: np.ndarray) -> None:
    """Write to a temporary file and rename: parallel workers never read a half-written cache."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp.npz")
    os.close(fd)
    np.savez(tmp, **arrays)  # type: ignore[arg-type]  # numpy's stub types **kwds as its bool option
    os.replace(tmp, path)


# ----------------------------------------------------------------------------- loaders -> numpy arrays
Arrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


# MNIST-1D's generator makes `num_samples` signals, 80% for training. The default (5000) gives the
# paper's 4000/1000; 50000 gives 40000/10000, where a batch of 4000 is 10% of the data rather than all
# of it (large-batch studies need B/N small). Each size has its own cache file.
MNIST1D_SAMPLES = {"mnist1d": 5000, "mnist1d_large": 50000}


def _mnist1d_cache(data_dir: Path, num_samples: int) -> Path:
    name = "mnist1d_default.npz" if num_samples == MNIST1D_SAMPLES["mnist1d"] else f"mnist1d_{num_samples}.npz"
    return data_dir / "mnist1d" / name


def _load_mnist1d(data_dir: Path, num_samples: int = MNIST1D_SAMPLES["mnist1d"]) -> Arrays:
    cache = _mnist1d_cache(data_dir, num_samples)
    if not cache.exists():
        try:
            from mnist1d.data import get_dataset_args, make_dataset
        except Exception as exc:  # noqa: BLE001 - any import failure means the same thing to the user
            raise DatasetUnavailable(f"mnist1d needs the 'mnist1d' package (pip install mnist1d): {exc}") from None
        # make_dataset seeds NumPy's and Python's global RNGs; keep the caller's streams untouched.
        import random
        np_state, py_state = np.random.get_state(), random.getstate()
        try:
            args = get_dataset_args()
            args.num_samples = num_samples
            d = make_dataset(args)
        finally:
            np.random.set_state(np_state)
            random.setstate(py_state)
        _atomic_save_npz(cache, x=d["x"], y=d["y"], x_test=d["x_test"], y_test=d["y_test"])
    with np.load(cache) as f:
        return f["x"], f["y"], f["x_test"], f["y_test"]


def _read_idx(path: Path) -> np.ndarray:
    """Read an IDX file (the MNIST format), gzipped or not."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    _, dtype_code, ndim = struct.unpack(">HBB", data[:4])
    shape = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    if dtype_code != 0x08:
        raise ValueError(f"{path}: unsupported IDX element type {dtype_code:#x}")
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


_FASHION_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                  "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def _find_idx_files(folders: list[Path]) -> list[Path] | None:
    for folder in folders:
        found = []
        for stem in _FASHION_FILES:
            candidates = [folder / f"{stem}.gz", folder / stem]
            hit = next((c for c in candidates if c.exists()), None)
            if hit is None:
                break
            found.append(hit)
        else:
            return found
    return None


def fashion_mnist_folders(data_dir: Path) -> list[Path]:
    return [data_dir / "fashion_mnist", data_dir / "fashion-mnist", data_dir,
            data_dir / "FashionMNIST" / "raw", DEBIAN_FASHION_MNIST]


def _load_fashion_mnist(data_dir: Path) -> Arrays:
    folders = fashion_mnist_folders(data_dir)
    files = _find_idx_files(folders)
    if files is None:
        try:
            _torchvision_download("FashionMNIST", data_dir, "fashion_mnist")
        except DatasetUnavailable as exc:
            raise DatasetUnavailable(
                f"dataset fashion_mnist: its four IDX files ({', '.join(_FASHION_FILES)}, .gz or not) are in none "
                f"of {', '.join(map(str, folders))}. Get them with `apt-get install dataset-fashion-mnist` (Debian, "
                f"into {DEBIAN_FASHION_MNIST}), or put them in a folder and pass it with --data-dir (data_dir, "
                f"$BSRESEARCH_DATA_DIR), or let torchvision download them (torchvision: {exc.reason})") from None
        files = _find_idx_files(folders + [data_dir / "torchvision" / "FashionMNIST" / "raw"])
        if files is None:
            raise DatasetUnavailable(f"dataset fashion_mnist: torchvision downloaded it into {data_dir / 'torchvision'}"
                                     f" but its IDX files are not there")
    x, y, x_test, y_test = (_read_idx(p) for p in files)
    return x[:, None], y, x_test[:, None], y_test


def _load_synthetic(data_dir: Path, n_train: int = SYNTHETIC_DEFAULT_SIZE) -> Arrays:
    """A fixed random two-layer teacher labels Gaussian inputs in 20 dimensions with 4 classes.

    The task is the same for every run (its seed is fixed); `train_size` sets how many examples exist.
    """
    rng = np.random.default_rng(20_181_106)
    dim, hidden, classes = 20, 32, 4
    w1 = rng.standard_normal((dim, hidden)) / np.sqrt(dim)
    w2 = rng.standard_normal((hidden, classes)) / np.sqrt(hidden)
    n_test = max(256, n_train // 4)
    x = rng.standard_normal((n_train + n_test, dim))
    logits = np.maximum(x @ w1, 0) @ w2 + 0.1 * rng.standard_normal((n_train + n_test, classes))
    y = logits.argmax(1)
    return x[:n_train], y[:n_train], x[n_train:], y[n_train:]


def _import_torchvision(dataset: str = "this dataset"):
    """torchvision, or DatasetUnavailable explaining why not.

    A torchvision wheel built for another torch raises RuntimeError (not ImportError) at import,
    e.g. "operator torchvision::nms does not exist", so every exception is caught.
    """
    try:
        import torchvision  # noqa: F401
        import torchvision.datasets as datasets
        return datasets
    except Exception as exc:  # noqa: BLE001
        reason = f"it does not import here ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
        raise DatasetUnavailable(
            f"{dataset} needs torchvision, which does not import here ({type(exc).__name__}: {exc}). "
            f"Install the torchvision build that matches torch {torch.__version__} from the same index "
            f"as torch (pip install 'bsresearch[vision]' on a standard PyPI torch)", reason=reason) from None


def _torchvision_download(class_name: str, data_dir: Path, dataset: str | None = None, **kwargs):
    dataset = f"dataset {dataset or class_name}"
    datasets = _import_torchvision(dataset)
    cls = getattr(datasets, class_name)
    root = data_dir / "torchvision"
    try:
        try:
            return cls(str(root), download=False, **kwargs)
        except RuntimeError:
            return cls(str(root), download=True, **kwargs)
    except Exception as exc:  # noqa: BLE001 - network errors come in many types
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise DatasetUnavailable(f"{dataset}: its files are not in {root} and could not be downloaded "
                                 f"({type(exc).__name__}: {first}); put torchvision's files there (or point "
                                 f"--data-dir at a folder holding torchvision/), or connect to the network",
                                 reason=f"download failed ({type(exc).__name__}: {first})") from None


def _torchvision_loader(class_name: str) -> Callable[[Path], Arrays]:
    name = class_name.lower()  # the config.DATASETS name
    def load(data_dir: Path) -> Arrays:
        if class_name == "SVHN":
            train = _torchvision_download(class_name, data_dir, name, split="train")
            test = _torchvision_download(class_name, data_dir, name, split="test")
            return train.data, np.asarray(train.labels), test.data, np.asarray(test.labels)
        train = _torchvision_download(class_name, data_dir, name, train=True)
        test = _torchvision_download(class_name, data_dir, name, train=False)

        def images(ds) -> np.ndarray:
            arr = np.asarray(ds.data)
            return arr[:, None] if arr.ndim == 3 else arr.transpose(0, 3, 1, 2)  # -> (N, C, H, W)
        return images(train), np.asarray(train.targets), images(test), np.asarray(test.targets)
    return load


@dataclass(frozen=True)
class DatasetInfo:
    name: str
    description: str
    num_classes: int
    load: Callable[[Path], Arrays]


DATASETS: dict[str, DatasetInfo] = {
    "mnist1d": DatasetInfo("mnist1d", "MNIST-1D, 4000/1000 signals of length 40, generated offline", 10,
                           _load_mnist1d),
    "mnist1d_large": DatasetInfo("mnist1d_large", "MNIST-1D, 40000/10000 signals of length 40, generated offline",
                                 10, lambda root: _load_mnist1d(root, MNIST1D_SAMPLES["mnist1d_large"])),
    "fashion_mnist": DatasetInfo("fashion_mnist", "Fashion-MNIST, 60000/10000 images 28x28", 10,
                                 _load_fashion_mnist),
    "synthetic": DatasetInfo("synthetic", "teacher-network task, 20-dim, 4 classes, any size", 4,
                             _load_synthetic),
    "cifar10": DatasetInfo("cifar10", "CIFAR-10 via torchvision, 50000/10000 images 32x32x3", 10,
                           _torchvision_loader("CIFAR10")),
    "cifar100": DatasetInfo("cifar100", "CIFAR-100 via torchvision, 50000/10000 images 32x32x3", 100,
                            _torchvision_loader("CIFAR100")),
    "mnist": DatasetInfo("mnist", "MNIST via torchvision, 60000/10000 images 28x28", 10,
                         _torchvision_loader("MNIST")),
    "svhn": DatasetInfo("svhn", "SVHN via torchvision, 73257/26032 images 32x32x3", 10,
                        _torchvision_loader("SVHN")),
}


def dataset_availability(data_dir: str | Path | None = None) -> list[tuple[str, bool, str]]:
    """(name, available, detail) for every dataset, without loading or downloading anything large."""
    root = Path(data_dir) if data_dir else default_data_dir()
    rows = []
    for name, info in DATASETS.items():
        if name == "synthetic":
            rows.append((name, True, "generated on demand"))
        elif name in MNIST1D_SAMPLES:
            try:
                import mnist1d  # noqa: F401
                cached = _mnist1d_cache(root, MNIST1D_SAMPLES[name]).exists()
                cost = "about 2 s" if name == "mnist1d" else "about 20 s"
                rows.append((name, True, "cached" if cached else f"generated on first use ({cost})"))
            except Exception as exc:  # noqa: BLE001
                rows.append((name, False, f"pip install mnist1d ({exc})"))
        elif name == "fashion_mnist":
            files = _find_idx_files(fashion_mnist_folders(root))
            if files:
                rows.append((name, True, str(files[0].parent)))
            else:
                rows.append((name, False, "apt-get install dataset-fashion-mnist, or put the IDX files in "
                                          f"{root / 'fashion_mnist'}, or torchvision with network"))
        else:
            try:
                _import_torchvision()
                rows.append((name, True, "torchvision (files downloaded on first use if missing)"))
            except DatasetUnavailable as exc:
                rows.append((name, False, str(exc).split(". ")[0]))
        rows[-1] = (rows[-1][0], rows[-1][1], rows[-1][2] + f" - {info.description}")
    return rows


# ----------------------------------------------------------------------------- public loading
def _standardise(x_train: torch.Tensor, x_test: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Zero mean, unit variance from training statistics: per channel for images, one scalar otherwise."""
    dims = (0, 2, 3) if x_train.ndim == 4 else tuple(range(x_train.ndim))
    mean = x_train.mean(dim=dims, keepdim=True)
    std = x_train.std(dim=dims, keepdim=True).clamp_min(1e-8)
    if x_train.ndim == 4:
        mean, std = mean[0], std[0]
    return (x_train - mean) / std, (x_test - mean) / std


def load_dataset(name: str, data_dir: str | Path | None = None, train_size: int | None = None,
                 device: torch.device | str = "cpu") -> Dataset:
    """Load, subsample (a fixed subset, the same for every seed), standardise and move to `device`.

    For `synthetic`, train_size is the number of examples generated (default 1024).
    """
    if name not in DATASETS:
        raise ConfigError(f"dataset must be one of {', '.join(DATASETS)}; got {name!r}")
    info = DATASETS[name]
    root = Path(data_dir) if data_dir else default_data_dir()
    if name == "synthetic":
        arrays = _load_synthetic(root, train_size or SYNTHETIC_DEFAULT_SIZE)
    else:
        arrays = info.load(root)
    x_np, y_np, x_test_np, y_test_np = arrays
    x, x_test = (torch.from_numpy(np.array(a, dtype=np.float32)) for a in (x_np, x_test_np))
    y, y_test = (torch.from_numpy(np.array(a, dtype=np.int64)) for a in (y_np, y_test_np))
    if train_size is not None and name != "synthetic":
        if train_size > len(x):
            raise ConfigError(f"train_size {train_size} exceeds the {len(x)} training examples of {name}")
        keep = torch.randperm(len(x), generator=make_generator(0, f"subset:{name}"))[:train_size]
        x, y = x[keep], y[keep]
    x, x_test = _standardise(x, x_test)
    return Dataset(name, x, y, x_test, y_test, info.num_classes).to(device)


def dataset_for(cfg: RunConfig, device: torch.device | str = "cpu") -> Data:
    """The config's data on `device`: a built-in dataset or the user's (cfg.dataset a reference, see
    userdata.py), resident or streamed as cfg.data_loading says (auto: resident when it came as tensors)."""
    device = torch.device(device)
    if not C.is_reference(cfg.dataset):
        where = "cpu" if cfg.data_loading == "stream" else device
        data = load_dataset(cfg.dataset, cfg.data_dir, cfg.train_size, where)
        if cfg.data_loading != "stream":
            return data
        return StreamedDataset(data.name, TensorDataset(data.x_train, data.y_train),
                               TensorDataset(data.x_test, data.y_test), device, cfg.loader_workers, data.num_classes)
    from .userdata import load_user_data
    user = load_user_data(cfg)
    num_classes = user.attributes.get("num_classes")
    as_tensors = user.train.tensors is not None and user.test.tensors is not None
    if cfg.data_loading == "stream" or (cfg.data_loading == "auto" and not as_tensors):
        return StreamedDataset(cfg.dataset, user.train.as_dataset(), user.test.as_dataset(), device,
                               cfg.loader_workers, num_classes, user.attributes, user.train.collate_fn)
    x, y = user.train.materialize(f"dataset {cfg.dataset} (train)")
    x_test, y_test = user.test.materialize(f"dataset {cfg.dataset} (test)")
    return Dataset(cfg.dataset, x, y, x_test, y_test, num_classes, user.attributes).to(device)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- batches
class BatchSampler:
    """Indices of successive training batches, drawn on the generator's device.

    shuffle: epochs of a fresh permutation each, the last partial batch dropped.
    replacement: every batch drawn independently and uniformly (with replacement).
    The state (generator, permutation, position) can be saved and restored for an exact resume.
    """

    def __init__(self, n: int, batch_size: int, generator: torch.Generator, replacement: bool = False):
        if batch_size > n:
            raise ConfigError(f"batch_size {batch_size} exceeds the training set size {n}")
        self.n, self.batch_size, self.generator, self.replacement = n, batch_size, generator, replacement
        self.order: torch.Tensor | None = None
        self.position = 0
        self.epochs_started = 0

    def next(self) -> torch.Tensor:
        device = self.generator.device
        if self.replacement:
            return torch.randint(self.n, (self.batch_size,), generator=self.generator, device=device)
        if self.order is None or self.position + self.batch_size > self.n:
            self.order = torch.randperm(self.n, generator=self.generator, device=device)
            self.position = 0
            self.epochs_started += 1
        idx = self.order[self.position:self.position + self.batch_size]
        self.position += self.batch_size
        return idx

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state(), "order": self.order, "position": self.position,
                "epochs_started": self.epochs_started}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])
        self.order = state["order"].to(self.generator.device) if state["order"] is not None else None
        self.position, self.epochs_started = int(state["position"]), int(state["epochs_started"])


def resident_dataset_for(cfg: RunConfig, device: torch.device | str = "cpu") -> Dataset:
    """The config's data as tensors on `device` whatever cfg.data_loading says: for measurements and
    analyses that index examples."""
    data = dataset_for(cfg.replace(data_loading="resident"), device)
    assert isinstance(data, Dataset)
    return data


class BatchIndices:
    """The index batches of a run, one per step from `step` on, drawn from its BatchSampler; the batch size of
    each step is `size_at(step)` (the batch schedule).

    A DataLoader with workers draws batches ahead of training, so the sampler runs ahead of the step that
    trains; with `track` the sampler's state after each batch is kept until `sampler_state(step)` asks for
    the state after the batch of `step`, which is what a checkpoint taken then must hold.
    """

    def __init__(self, sampler: BatchSampler, size_at: Callable[[int], int], step: int = 0, track: bool = False):
        self.sampler, self.size_at, self.step, self.track = sampler, size_at, step, track
        self.states: deque[tuple[int, dict]] = deque()

    def __iter__(self) -> Iterator[torch.Tensor]:
        return self

    def __next__(self) -> torch.Tensor:
        self.sampler.batch_size = self.size_at(self.step)
        idx = self.sampler.next()
        self.step += 1
        if self.track:
            self.states.append((self.step, self.sampler.state_dict()))
        return idx

    def sampler_state(self, step: int) -> dict:
        """The sampler's state after the batch of `step` completed updates was drawn."""
        if not self.track:
            return self.sampler.state_dict()
        while self.states and self.states[0][0] < step:
            self.states.popleft()
        if not self.states or self.states[0][0] != step:
            raise RuntimeError(f"the sampler's state after step {step} was not kept")
        return self.states[0][1]


def in_chunks(x: torch.Tensor, y: torch.Tensor, chunk_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Consecutive (x, y) slices of at most chunk_size examples, in order (for evaluation)."""
    for start in range(0, len(x), chunk_size):
        yield x[start:start + chunk_size], y[start:start + chunk_size]
