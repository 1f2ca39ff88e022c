"""A MkDocs hook (mkdocs.yml names it under `hooks`): two things the docstrings and the pages write as GitHub
reads them, which Python-Markdown reads otherwise. It applies to the pages and to the docstrings that
mkdocstrings renders.
- A placeholder in prose, such as <name> in reports/<name>/ outside backticks, shows as written instead of
  vanishing as an unknown HTML tag. A tag with attributes, a closing tag, a void element, and an opening tag
  closed later in the same paragraph stay HTML.
- A bullet list may start on the line after a paragraph ("Conventions:" then "- the loss ..."), with no blank
  line between them.
"""
from __future__ import annotations

import re

from markdown import Extension
from markdown.inlinepatterns import InlineProcessor
from markdown.preprocessors import Preprocessor
from markdown.util import AtomicString

VOID = {"br", "hr", "img", "input", "wbr"}
BULLET = re.compile(r"( *)[-*+] \S")


class Placeholder(InlineProcessor):
    def handleMatch(self, m, data):
        if m[1].lower() in VOID or f"</{m[1]}>" in data:
            return None, None, None
        return AtomicString(m[0]), m.start(0), m.end(0)        # text: escaped when the page is written


def indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


class ListAfterParagraph(Preprocessor):
    """A blank line before a bullet that follows a paragraph's line at the same indentation or deeper
    (not a list item's continuation, not code: fenced blocks are stashed by the time this runs)."""

    def run(self, lines):
        out: list[str] = []
        for line in lines:
            prev = out[-1] if out else ""
            if (BULLET.match(line) and prev.strip() and not BULLET.match(prev) and indent(prev) < 4
                    and indent(line) <= indent(prev) and not prev.lstrip().startswith(("|", "#", "<"))):
                out.append("")
            out.append(line)
        return out


class GitHubReading(Extension):
    def extendMarkdown(self, md):
        md.inlinePatterns.register(Placeholder(r"<([A-Za-z]\w*)>", md), "placeholder", 95)   # before raw HTML (90)
        md.preprocessors.register(ListAfterParagraph(md), "list_after_paragraph", 19)        # after the fences (25)


def on_config(config):
    config.markdown_extensions.append(GitHubReading())
    return config
