"""RunConfig's fields in words: the comment written beside each field in config.py, and the sections its
body groups them in, for the command line's help and the run notebook's parameters cell.

Those comments are the one place a field is described. They are read from config.py's source with Python's
own parser (ast for the fields, tokenize for the comments), so a description is never written twice.
"""
from __future__ import annotations

import ast
import functools
import inspect
import io
import json
import tokenize
import typing
from typing import Any

from .config import FIELD_NAMES, RunConfig

SECTION_PREFIX = "# --- "   # a comment on a line of its own in RunConfig's body starts a section


@functools.lru_cache(maxsize=1)
def _body() -> tuple[dict[int, str], dict[int, str], list[tuple[int, str]]]:
    """(line -> field name, line -> the comment on that line, [(line, section title)]) of RunConfig's source."""
    source = inspect.getsource(RunConfig)
    fields = {node.lineno: node.target.id for node in ast.parse(source).body[0].body  # type: ignore[attr-defined]
              if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)}
    comments: dict[int, str] = {}
    sections: list[tuple[int, str]] = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type != tokenize.COMMENT:
            continue
        line = token.start[0]
        if token.string.startswith(SECTION_PREFIX) and token.line.strip() == token.string:
            sections.append((line, token.string.removeprefix(SECTION_PREFIX).strip()))
        else:
            comments[line] = token.string.removeprefix("#").strip()
    return fields, comments, sections


def field_help() -> dict[str, str]:
    """Field name -> the comment written beside it in config.py (the CLI's help, the parameters cell)."""
    fields, comments, _ = _body()
    return {name: comments[line] for line, name in fields.items() if name in FIELD_NAMES and line in comments}


def field_sections() -> list[tuple[str, list[str]]]:
    """(section title, field names) in the order RunConfig's body lists them ('# --- data' starts one)."""
    fields, _, sections = _body()
    out: list[tuple[str, list[str]]] = []
    marks = dict(sections)
    for line in sorted(set(fields) | set(marks)):
        if line in marks:
            if marks[line] != "serialisation":
                out.append((marks[line], []))
        elif fields[line] in FIELD_NAMES and out:
            out[-1][1].append(fields[line])
    return out


def _annotation(hint: Any) -> str:
    """A field's type as the run notebook's parameters cell writes it (papermill reads Optional[X], not X | None)."""
    args = typing.get_args(hint)
    if type(None) in args:
        return f"Optional[{_annotation(next(a for a in args if a is not type(None)))}]"
    origin = typing.get_origin(hint)
    if origin is tuple:
        return f"list[{typing.get_args(hint)[0].__name__}]"
    if origin is dict:
        return "dict"
    return hint.__name__


def parameters_cell() -> str:
    """The source of notebooks/01_train's `parameters` cell: every RunConfig field with its type, its default
    and the comment beside it in config.py, grouped as there. Generated (`make clean-notebooks` writes it),
    so the descriptions live in one place; a test checks the notebook holds exactly this."""
    hints, defaults, helps = typing.get_type_hints(RunConfig), RunConfig().to_dict(), field_help()
    lines = ["# Every RunConfig field with its type and default (bsresearch/config.py, where this cell is generated",
             "# from); papermill injects a sweep run's values after this cell.",
             "from typing import Optional", ""]
    for title, names in field_sections():
        lines.append(f"# --- {title}")
        for name in names:
            value = defaults[name]
            shown = json.dumps(value) if isinstance(value, str) else repr(value)
            code = f"{name}: {_annotation(hints[name])} = {shown}"
            lines.append(f"{code:<39} # {helps[name]}")
    return "\n".join(lines)


PARAMETERS_MARKER = '# %% tags=["parameters"]\n'


def template_with_parameters(text: str) -> str:
    """The run notebook's text (jupytext percent format) with its parameters cell's generated part, the
    lines up to its first blank line after the fields, replaced by parameters_cell()."""
    start = text.index(PARAMETERS_MARKER) + len(PARAMETERS_MARKER)
    end = text.index("\n\n# --- where the run is written", start)
    return text[:start] + parameters_cell() + text[end:]
