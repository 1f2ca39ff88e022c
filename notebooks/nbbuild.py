"""Helpers shared by the notebook generators (build_*.py): cells from indented source, and a writer that
gives every notebook the same kernel, stable cell ids and no outputs."""
import textwrap
from pathlib import Path

import nbformat as nbf

KERNEL = {"kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"},
          "language_info": {"name": "python"}}


def code(src: str, tags=()) -> nbf.NotebookNode:
    cell = nbf.v4.new_code_cell(textwrap.dedent(src).strip("\n"))
    if tags:
        cell.metadata["tags"] = list(tags)
    return cell


def md(src: str) -> nbf.NotebookNode:
    return nbf.v4.new_markdown_cell(textwrap.dedent(src).strip("\n"))


def write(cells: list, path: Path) -> Path:
    """Validate and write `cells` as a notebook; ids are stable, so an unchanged notebook stays byte-identical."""
    nb = nbf.v4.new_notebook()
    nb.cells = cells
    nb.metadata.update(KERNEL)
    for i, cell in enumerate(nb.cells):
        cell.id = f"cell-{i:02d}"
    nbf.validate(nb)
    nbf.write(nb, path)
    print("wrote", path)
    return path
