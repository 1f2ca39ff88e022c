"""The one loader of a user's own code: the object a reference names, called with the keyword arguments it
declares, and the checks of what it returns. Every path (train, sweeps, fused groups, advise, measurements,
benchmarks) goes through here.

Every mistake is a ConfigError naming the problem and what is accepted, raised before any work: a missing
file or name, a syntax error in the user's file (file and line), a module that raises while it is imported
or a factory that raises (the exception and where), keyword arguments the factory does not accept.
"""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch.nn as nn

from . import references
from .config import ConfigError, did_you_mean


def _user_frame(exc: BaseException, path: Path | None) -> str:
    """' (file.py, line N)': the deepest frame of the traceback in the user's file (or the deepest at all)."""
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if path is not None and Path(f.filename).resolve() == path] or frames[-1:]
    return f" ({Path(mine[-1].filename).name}, line {mine[-1].lineno})" if mine else ""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def _import_file(path: Path, what: str, source: str) -> Any:
    module_name = f"_bsresearch_user_{path.stem}_{abs(hash(str(path)))}"
    module = sys.modules.get(module_name)
    if module is not None:
        return module
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"{what} file {source!r} is not a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickling look modules up by name
    folder = str(path.parent)
    sys.path.insert(0, folder)   # the file imports its siblings as it would when run as a script
    try:
        spec.loader.exec_module(module)
    except ModuleNotFoundError as exc:
        del sys.modules[module_name]
        raise ConfigError(f"{what} file {source!r} cannot import {exc.name!r}{_user_frame(exc, path)}: it is "
                          f"neither in the file's folder {folder} nor installed in this Python "
                          f"({sys.executable})") from None
    except SyntaxError as exc:
        del sys.modules[module_name]
        raise ConfigError(f"{what} file {source!r} has a syntax error at line {exc.lineno}: {exc.msg}") from None
    except Exception as exc:  # noqa: BLE001 - whatever the user's module raises on import is reported, not crashed on
        del sys.modules[module_name]
        raise ConfigError(f"{what} file {source!r} raised {_first_line(exc)} while it was imported"
                          f"{_user_frame(exc, path)}") from None
    finally:
        if folder in sys.path:
            sys.path.remove(folder)
    return module


def load_object(reference: str, what: str) -> Any:
    """The object named by 'path/to/file.py:NAME' or 'package.module:NAME'. `what` names the option in
    messages ('model', 'dataset', 'loss'). A relative file is found as references.find_file says."""
    try:
        ref = references.parse(reference)
    except ConfigError as exc:
        raise ConfigError(f"{what}: {exc}") from None
    if ref.is_file:
        path = references.find_file(ref.source)
        if path is None:
            raise ConfigError(f"{what} file {ref.source!r} does not exist (looked under the project root "
                              f"{references.project_root()} and in {Path.cwd()})")
        module = _import_file(path, what, ref.source)
    else:
        try:
            module = importlib.import_module(ref.source)
        except ModuleNotFoundError as exc:
            raise ConfigError(f"{what} module {ref.source!r} cannot be imported ({exc}); give a module on "
                              f"PYTHONPATH or a path to a .py file") from None
        except SyntaxError as exc:
            raise ConfigError(f"{what} module {ref.source!r}: syntax error in {Path(exc.filename or '').name} at "
                              f"line {exc.lineno}: {exc.msg}") from None
        except Exception as exc:  # noqa: BLE001
            raise ConfigError(f"{what} module {ref.source!r} raised {_first_line(exc)} while it was "
                              f"imported{_user_frame(exc, None)}") from None
    if not hasattr(module, ref.name):
        public = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
                        and getattr(v, "__module__", None) == module.__name__)
        raise ConfigError(f"{what}: {ref.source!r} has no {ref.name!r}{did_you_mean(ref.name, public)}; it defines "
                          f"{', '.join(public) or 'nothing callable'}")
    return getattr(module, ref.name)


def load_factory(reference: str, what: str) -> Callable[..., Any]:
    """load_object, which must be callable (a factory, or a loss function)."""
    factory = load_object(reference, what)
    if not callable(factory):
        raise ConfigError(f"{what}: {reference!r} is a {type(factory).__name__}, not a function to call")
    return factory


def accepted_keywords(factory: Callable[..., Any]) -> tuple[list[str], bool]:
    """(the keyword arguments `factory` declares, whether it takes **kwargs)."""
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: let the call decide
        return [], True
    names = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    return names, any(p.kind == p.VAR_KEYWORD for p in params)


def call_factory(factory: Callable[..., Any], kwargs: Mapping[str, Any], what: str, reference: str,
                 option: str) -> Any:
    """factory(**kwargs), after checking that it declares every keyword (`option` names the config field
    that holds them, e.g. 'model_kwargs'); what it raises becomes one line naming it and where."""
    names, var_keyword = accepted_keywords(factory)
    if not var_keyword:
        for key in kwargs:
            if key not in names:
                raise ConfigError(f"{option}: {reference} does not accept {key!r}{did_you_mean(key, names)}; it "
                                  f"accepts {', '.join(names) or 'no keyword arguments'}")
    try:
        return factory(**kwargs)
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's factory failing is their message, in one line
        path = references.find_file(references.parse(reference).source) if ":" in reference else None
        raise ConfigError(f"{what} {reference} raised {_first_line(exc)}{_user_frame(exc, path)}") from None


def check_model(model: Any, source: str = "model_fn") -> nn.Module:
    """`model` if it is an nn.Module with trainable parameters, else ConfigError naming `source`."""
    if not isinstance(model, nn.Module):
        raise ConfigError(f"{source} must return a torch.nn.Module; it returned a {type(model).__name__}")
    if not any(p.requires_grad for p in model.parameters()):
        raise ConfigError(f"{source} returned a {type(model).__name__} with no trainable parameters")
    return model
