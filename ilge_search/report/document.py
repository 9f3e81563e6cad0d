"""The one document renderer: a report written as Markdown, LaTeX (tables only) and HTML at once.

:class:`Document` collects headings, paragraphs, bullets, images and tables of :class:`Cell` objects;
cells equal to :data:`MISSING` are never bold.
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["MISSING", "Cell", "Document", "model_sentence", "plural", "slug"]

MISSING = "—"

_LATEX_ESCAPES = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
}


def plural(count: int, noun: str, many: str | None = None) -> str:
    """``"1 task"``, ``"2 tasks"``; ``many`` for irregular plurals (``plural(n, "study", "studies")``)."""
    return f"{count} {noun if count == 1 else many or noun + 's'}"


def model_sentence(model: str, parts: list[str]) -> list[str]:
    """``parts`` as one sentence on ``model`` (none when there are no parts)."""
    return [f"{model}: " + "; ".join(parts) + "."] if parts else []


def slug(*parts: str) -> str:
    """A file-name and LaTeX-label safe join of ``parts``."""
    return "-".join(re.sub(r"[^A-Za-z0-9.\-]+", "_", p).strip("_") for p in parts)


def _tex(text: str) -> str:
    out = "".join(_LATEX_ESCAPES.get(ch, ch) for ch in text)
    return out.replace("±", r"$\pm$").replace("×", r"$\times$").replace(MISSING, "---")


def _inline_html(text: str) -> str:
    """Escaped text with the Markdown the report's sentences use (`code`, *emphasis*) as HTML."""
    text = re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))
    return re.sub(r"\*([^*]+)\*", r"<em>\1</em>", text)


@dataclass
class Cell:
    """One table cell: its text, bold (never for :data:`MISSING`) or italic."""

    text: str
    bold: bool = False
    italic: bool = False


class Document:
    """One document written three ways at once: Markdown, LaTeX (tables only) and HTML."""

    def __init__(self) -> None:
        self.md: list[str] = []
        self.tex: list[str] = ["% requires \\usepackage{booktabs,graphicx}", ""]
        self.html: list[str] = []

    def heading(self, level: int, text: str, anchor: str | None = None) -> None:
        """A heading; with an ``anchor``, links ``#anchor`` (:meth:`contents`) jump to it in both formats."""
        if anchor is None:
            self.md += ["#" * level + " " + text, ""]
            self.html.append(f"<h{level}>{html.escape(text)}</h{level}>")
            return
        self.md += [f'<a id="{html.escape(anchor)}"></a>', "", "#" * level + " " + text, ""]
        self.html.append(f'<h{level} id="{html.escape(anchor)}">{html.escape(text)}</h{level}>')

    def contents(self, entries: Sequence[tuple[str, str, Sequence[tuple[str, str]]]]) -> None:
        """A table of contents: one line per ``(text, anchor, sub-links)``, each sub-link
        ``(text, anchor)`` on the same line (e.g. a model and its tasks)."""
        md, items = [], []
        for text, anchor, links in entries:
            line = f"[{text}](#{anchor})"
            item = f'<a href="#{html.escape(anchor)}">{html.escape(text)}</a>'
            if links:
                line += ": " + " · ".join(f"[{t}](#{a})" for t, a in links)
                item += ": " + " · ".join(f'<a href="#{html.escape(a)}">{html.escape(t)}</a>' for t, a in links)
            md.append(f"- {line}")
            items.append(f"<li>{item}</li>")
        self.md += [*md, ""]
        self.html.append('<nav class="contents"><ul>' + "".join(items) + "</ul></nav>")

    def paragraph(self, text: str, tex: bool = False) -> None:
        self.md += [text, ""]
        self.html.append(f"<p>{_inline_html(text)}</p>")
        if tex:
            self.tex += ["% " + line for line in text.splitlines()] + [""]

    def bullets(self, items: Sequence[str]) -> None:
        if items:
            self.md += [f"- {item}" for item in items] + [""]
            self.html.append("<ul>" + "".join(f"<li>{_inline_html(item)}</li>" for item in items) + "</ul>")

    def images(self, paths: Mapping[str, str], widths: Mapping[str, int | None] | None = None) -> None:
        """Images by kind; ``widths`` (pixels, by kind) is the size the HTML page shows each at
        (never wider than the page; an unknown width shows the image at its own size)."""
        if paths:
            widths = widths or {}
            self.md += [f"![{kind}]({path})" for kind, path in paths.items()] + [""]
            self.html += [
                f'<img src="{html.escape(path)}" alt="{html.escape(kind)}"'
                + (f' width="{widths[kind]}"' if widths.get(kind) else "")
                + ">"
                for kind, path in paths.items()
            ]

    def table(
        self,
        header: Sequence[str],
        rows: Sequence[Sequence[Cell]],
        *,
        caption: str = "",
        label: str | None = None,
        text_columns: int = 1,
    ) -> None:
        """A table; with a ``label`` it is also written to the LaTeX file, with ``caption``."""
        if caption:
            self.paragraph(caption)
        self.md += ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
        self.md += ["| " + " | ".join(self._md_cell(c) for c in row) + " |" for row in rows] + [""]
        self.html += [
            "<table>",
            "<thead><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr></thead>",
            "<tbody>",
        ]
        self.html += ["<tr>" + "".join(f"<td>{self._html_cell(c)}</td>" for c in row) + "</tr>" for row in rows]
        self.html += ["</tbody>", "</table>"]
        if label is not None:
            spec = "l" * text_columns + "r" * (len(header) - text_columns)
            self.tex += [
                r"\begin{table}[t]",
                r"\centering",
                r"\small",
                rf"\caption{{{_tex(caption)}}}",
                rf"\label{{{label}}}",
                r"\resizebox{\linewidth}{!}{%",
                rf"\begin{{tabular}}{{{spec}}}",
                r"\toprule",
                " & ".join(_tex(h) for h in header) + r" \\",
                r"\midrule",
            ]
            self.tex += [" & ".join(self._tex_cell(c) for c in row) + r" \\" for row in rows]
            self.tex += [r"\bottomrule", r"\end{tabular}}", r"\end{table}", ""]

    @staticmethod
    def _md_cell(cell: Cell) -> str:
        text = cell.text.replace("|", "\\|")
        if cell.bold and cell.text != MISSING:
            return f"**{text}**"
        return f"*{text}*" if cell.italic else text

    @staticmethod
    def _tex_cell(cell: Cell) -> str:
        text = _tex(cell.text)
        if cell.bold and cell.text != MISSING:
            return rf"\textbf{{{text}}}"
        return rf"\textit{{{text}}}" if cell.italic else text

    @staticmethod
    def _html_cell(cell: Cell) -> str:
        text = html.escape(cell.text)
        if cell.bold and cell.text != MISSING:
            return f"<strong>{text}</strong>"
        return f"<em>{text}</em>" if cell.italic else text

    def markdown(self) -> str:
        """The Markdown text (ends with a newline when the last block does)."""
        return "\n".join(self.md)

    def latex(self) -> str:
        """The LaTeX text: the commented paragraphs and the labelled tables."""
        return "\n".join(self.tex)

    def html_page(self, title: str) -> str:
        """A standalone HTML page with everything added so far."""
        style = (
            "body{font-family:sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}"
            "table{border-collapse:collapse;margin:1em 0;font-size:0.9em}"
            "th,td{border-bottom:1px solid #ddd;padding:4px 8px;text-align:right}"
            "th:first-child,td:first-child{text-align:left}thead th{border-bottom:2px solid #444}"
            "img{max-width:100%;height:auto;display:block;margin:1em 0}"
            "nav.contents{background:#f6f6f6;padding:0.3em 1em;margin:1em 0}nav.contents li{margin:0.2em 0}"
        )
        return (
            f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f"<title>{html.escape(title)}</title>\n<style>{style}</style>\n</head>\n<body>\n"
            + "\n".join(self.html)
            + "\n</body>\n</html>\n"
        )
