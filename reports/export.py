"""Export: save a report page as one self-contained HTML file (``reports.server`` serves them live).

The saved file inlines every script and stylesheet (Bokeh, Panel, the template's CSS),
so it opens offline; ``save_html`` refuses to write a page that still links one.
"""

from __future__ import annotations

import re
from pathlib import Path

import panel as pn
from bokeh.document import Document
from bokeh.models import ImportedStyleSheet, InlineStyleSheet, UIElement
from bokeh.resources import INLINE
from panel.io.resources import CDN_DIST, DIST_DIR, set_resource_mode

from reports.app import build_page
from reports.data import ReportData, experiment_ids
from warehouse.analyses import refresh
from warehouse.store import Warehouse

_LINK = re.compile(r"<link\b[^>]*?href=[\"'](https?://[^\"']+)[\"'][^>]*>", re.I)
_SCRIPT = re.compile(r"<script\b[^>]*?src=[\"'](https?://[^\"']+)[\"'][^>]*>\s*</script>", re.I)
#: Scripts the page never uses (no LaTeX on it) that only add size.
_UNUSED = re.compile(r"<script type=\"text/javascript\">\s*/\* BEGIN bokeh-mathjax\.min\.js \*/.*?/\* END bokeh-mathjax\.min\.js \*/\s*</script>", re.S)


# An empty icon: without one the browser asks the file system for favicon.ico.
_NO_ICON = '<link rel="icon" href="data:,">'
_ICON = re.compile(r"<link\b[^>]*rel=[\"'](?:icon|apple-touch-icon|shortcut icon)[\"'][^>]*>", re.I)


class OfflineError(RuntimeError):
    """The page would still load something from the network."""


def external_links(html: str) -> list[str]:
    """URLs the page's ``<script src>`` and ``<link href>`` tags would fetch from the network."""
    return [m.group(1) for m in _LINK.finditer(html)] + [m.group(1) for m in _SCRIPT.finditer(html)]


def _local(url: str) -> Path | None:
    if not url.startswith(CDN_DIST):
        return None
    path = Path(DIST_DIR) / url[len(CDN_DIST):].split("?")[0]
    return path if path.is_file() else None


def _inline_sheet(sheet, shared: dict[str, InlineStyleSheet]):
    """The inline copy of a stylesheet Panel links to its CDN (others unchanged)."""
    if not isinstance(sheet, ImportedStyleSheet):
        return sheet
    path = _local(sheet.url)
    if path is None:
        return sheet
    if sheet.url not in shared:
        shared[sheet.url] = InlineStyleSheet(css=path.read_text(encoding="utf-8"))
    return shared[sheet.url]


def _inline(html: str) -> str:
    """Replace links to Panel's CDN by the files Panel ships; drop icon links."""
    def link(m: re.Match) -> str:
        tag = m.group(0)
        path = _local(m.group(1))
        return f"<style>\n{path.read_text(encoding='utf-8')}\n</style>" if path else tag

    def script(m: re.Match) -> str:
        path = _local(m.group(1))
        return f"<script type=\"text/javascript\">\n{path.read_text(encoding='utf-8')}\n</script>" if path else m.group(0)

    html = _SCRIPT.sub(script, _LINK.sub(link, _ICON.sub("", html)))
    head = [_NO_ICON]
    # The Bootstrap template's modal calls `new bootstrap.Modal`; in inline mode Panel
    # leaves Bootstrap's script out of the page, so add the copy Panel ships.
    if "bootstrap.Modal" in html and "bootstrap.bundle" not in html:
        bundle = Path(DIST_DIR) / "bundled" / "bootstrap5" / "js" / "bootstrap.bundle.min.js"
        head.append(f"<script type=\"text/javascript\">\n{bundle.read_text(encoding='utf-8')}\n</script>")
    return html.replace("<head>", "<head>\n" + "\n".join(head), 1)


def save_html(page: pn.template.BaseTemplate, path: str | Path, title: str = "keynes report") -> Path:
    """Save ``page`` as one self-contained HTML file.

    Raises:
        OfflineError: some resource could not be inlined (names the URLs).
    """
    path = Path(path)
    doc = Document()
    with set_resource_mode("inline"):
        page.server_doc(doc, title=title)  # the public form of what panel.save does for a template
    # Stylesheets that Panel links to its CDN become inline copies of the files it ships;
    # freezing the document recomputes its model graph once instead of after every change.
    # One shared InlineStyleSheet per file keeps each stylesheet once in the page.
    shared: dict[str, InlineStyleSheet] = {}
    with doc.models.freeze():
        for model in list(doc.models):
            if isinstance(model, UIElement) and any(isinstance(s, ImportedStyleSheet) for s in model.stylesheets):
                model.stylesheets = [_inline_sheet(s, shared) for s in model.stylesheets]
    buffer = _render(doc, title)
    html = _UNUSED.sub("", _inline(buffer))
    left = external_links(html)
    if left:
        raise OfflineError(f"the page still links {len(left)} resource(s): {', '.join(left[:3])}")
    path.write_text(html, encoding="utf-8")
    return path


def _render(doc: Document, title: str) -> str:
    import io

    from panel.io.save import save

    out = io.StringIO()
    save(doc, out, title=title, resources=INLINE, template=doc.template, template_variables=doc.template_variables)
    return out.getvalue()


def _pages(warehouse: Warehouse, experiment: str | list[str] | None) -> list[str | list[str]]:
    """What each page shows: an experiment id, or a list of ids for one comparison page.

    None → one page per experiment; a name or id → its page; several → one comparison page.
    """
    if isinstance(experiment, (list, tuple)) and len(experiment) > 1:
        return [[experiment_ids(warehouse, e)[0] for e in experiment]]
    if isinstance(experiment, (list, tuple)):
        experiment = experiment[0] if experiment else None
    return list(experiment_ids(warehouse, experiment))


def _data(warehouse: Warehouse, page: str | list[str]) -> ReportData:
    """The page's data, with the analyses of its rounds brought up to date first."""
    refresh(warehouse, [page] if isinstance(page, str) else page)
    return ReportData(warehouse, page)


def write_reports(db: str | Path, out: str | Path, experiment: str | list[str] | None = None) -> list[Path]:
    """Write the report page(s) of a warehouse.

    Args:
        db: the warehouse file.
        out: the HTML file; with several experiments (and none chosen) each gets
            ``<out stem>-<experiment id>.html`` beside it.
        experiment: an experiment id or name (its newest run); several: one page comparing
            their arms; None means one page per experiment.

    Returns:
        The files written.
    """
    warehouse = Warehouse(db)
    pages = _pages(warehouse, experiment)
    out = Path(out)
    written = []
    for page in pages:
        target = out if len(pages) == 1 else out.with_name(f"{out.stem}-{page}{out.suffix or '.html'}")
        data = _data(warehouse, page)
        title = "keynes report · " + " vs ".join(data.labels[e] for e in data.experiment_ids)
        written.append(save_html(build_page(data), target, title=title))
    return written

