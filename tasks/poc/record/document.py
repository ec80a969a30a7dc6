"""The record's document model, a list of blocks (heading, paragraph, table, preformatted,
figure), and its two renderings, HTML and PDF (fpdf2, DejaVu Sans from matplotlib's own data),
so both carry the same sections, numbers and figures: a figure is inline SVG in the HTML and
the same matplotlib figure as a PNG image in the PDF."""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.data.render import render_page


@dataclass
class Block:
    """One block of the document."""

    kind: str  # h1, h2, h3, p, pre, table, figure
    text: str = ""  # a figure's caption
    heads: Sequence[str] = ()
    rows: Sequence[Sequence[Any]] = ()
    classes: Sequence[str] = ()
    svg: str = ""  # a figure, for the HTML
    png: bytes = b""  # the same figure, for the PDF


class Doc:
    """The document as it is written, block by block."""

    def __init__(self) -> None:
        self.blocks: list[Block] = []

    def h(self, level: int, text: str) -> None:
        self.blocks.append(Block(f"h{level}", text))

    def p(self, text: str) -> None:
        self.blocks.append(Block("p", text))

    def pre(self, text: str) -> None:
        self.blocks.append(Block("pre", text))

    def table(
        self, heads: Sequence[str], rows: Sequence[Sequence[Any]], classes: Sequence[str] = ()
    ) -> None:
        if not rows:
            self.p("none")
            return
        cells = [["" if c is None else str(c) for c in r] for r in rows]
        self.blocks.append(Block("table", heads=list(heads), rows=cells, classes=list(classes)))

    def figure(self, svg: str, png: bytes, caption: str) -> None:
        """A figure: ``svg`` inline in the HTML, ``png`` (the same figure) in the PDF, the
        caption under it in both."""
        if not svg or not png:
            raise ValueError("a figure needs both its SVG (HTML) and its PNG (PDF)")
        self.blocks.append(Block("figure", text=caption, svg=svg, png=png))


def render_html(doc: Doc, title: str) -> str:
    """The self-contained page (templates/record.html.j2): every text escaped, figures inline."""
    package = __name__.rpartition(".")[0]
    return render_page(package, "record.html.j2", page_title=title, blocks=doc.blocks)


def _font_dir() -> Path:
    """DejaVu Sans ships with matplotlib (a dependency): no Debian font package needed."""
    import matplotlib

    return Path(matplotlib.get_data_path()) / "fonts" / "ttf"


MM_PER_INCH = 21.0  # a 6.4 in figure 134 mm wide: two figures with captions fit a page


def _figure_size(b: Block, page_width: float) -> tuple[float, float]:
    """The figure's width and height on the page (mm): its inches scaled, at most the page."""
    from PIL import Image

    image = Image.open(io.BytesIO(b.png))
    w_px, h_px = image.size
    dpi = float(image.info.get("dpi", (150, 150))[0]) or 150.0
    width = min(page_width, MM_PER_INCH * w_px / dpi)
    return width, width * h_px / w_px


def _pdf_figure(pdf: Any, b: Block) -> None:
    """The PNG as an image (an XObject), its caption under it; a new page when it won't fit."""
    width, height = _figure_size(b, pdf.epw)
    if pdf.get_y() + height + 10 > pdf.h - pdf.b_margin:
        pdf.add_page()
    pdf.image(io.BytesIO(b.png), w=width, h=height)
    pdf.set_font("DejaVu", "", 7)
    pdf.multi_cell(max(width, 150), 3.5, b.text, new_x="LMARGIN", new_y="NEXT")
    pdf.ln(2)


def render_pdf(doc: Doc, title: str) -> bytes:
    from fpdf import FPDF
    from fpdf.fonts import FontFace

    pdf = FPDF(orientation="landscape", format="A4")
    pdf.set_title(title)
    pdf.set_auto_page_break(True, margin=12)
    fonts = _font_dir()
    pdf.add_font("DejaVu", "", str(fonts / "DejaVuSans.ttf"))
    pdf.add_font("DejaVu", "B", str(fonts / "DejaVuSans-Bold.ttf"))
    pdf.add_font("DejaVuMono", "", str(fonts / "DejaVuSansMono.ttf"))
    pdf.add_page()
    width = pdf.epw
    sizes = {"h1": 15, "h2": 12, "h3": 10}
    fills = {
        "met": (221, 255, 221),
        "not-met": (255, 221, 221),
        "undecided": (255, 238, 204),
        "blocked": (255, 238, 204),
    }
    for i, b in enumerate(doc.blocks):
        if b.kind in sizes:
            # No heading alone at the foot of a page, nor apart from the figure it titles.
            after = doc.blocks[i + 1] if i + 1 < len(doc.blocks) else None
            room = _figure_size(after, width)[1] + 25 if after and after.kind == "figure" else 40
            if pdf.get_y() > pdf.h - room:
                pdf.add_page()
            pdf.set_font("DejaVu", "B", sizes[b.kind])
            pdf.ln(2)
            pdf.multi_cell(width, sizes[b.kind] * 0.5, b.text, new_x="LMARGIN", new_y="NEXT")
            pdf.ln(1)
        elif b.kind == "p":
            pdf.set_font("DejaVu", "", 8)
            pdf.multi_cell(width, 4, b.text, new_x="LMARGIN", new_y="NEXT")
            pdf.ln(1)
        elif b.kind == "pre":
            pdf.set_font("DejaVuMono", "", 6.5)
            pdf.multi_cell(width, 3, b.text, new_x="LMARGIN", new_y="NEXT")
            pdf.ln(1)
        elif b.kind == "figure":
            _pdf_figure(pdf, b)
        else:
            pdf.set_font("DejaVu", "", 7)
            # Column widths by content (capped), so long paths wrap instead of numbers.
            lens = [
                min(60, max([len(h) * 1.4 + 1, *(max(map(len, r[i].split("\n"))) for r in b.rows)]))
                for i, h in enumerate(b.heads)
            ]
            with pdf.table(
                col_widths=[max(4, n) for n in lens],
                width=width,
                text_align="LEFT",
                line_height=3.5,
                headings_style=FontFace(emphasis="BOLD", fill_color=(235, 235, 235)),
            ) as table:
                table.row(list(b.heads))
                for i, cells in enumerate(b.rows):
                    cls = b.classes[i] if i < len(b.classes) else ""
                    style = FontFace(fill_color=fills[cls]) if cls in fills else None
                    row = table.row()
                    for c in cells:
                        row.cell(c, style=style)
            pdf.ln(2)
    return bytes(pdf.output())
