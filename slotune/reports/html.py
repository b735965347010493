"""Self-contained HTML: plotly's JavaScript inline once, figure data inline, no network.

A report that loads scripts from a CDN breaks offline and behind firewalls, so everything
the page needs is in the one file.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

import plotly.graph_objects as go
import plotly.offline

from slotune.reports.fmt import NA


@dataclass(frozen=True)
class Cell:
    """A table cell: shown text, a sort key, and an optional CSS class."""

    text: str
    sort: str | float | None = None
    css: str = ""


def e(value: object) -> str:
    return escape(str(value), quote=True)


def figure_block(key: str, fig: go.Figure) -> str:
    spec = fig.to_json().replace("</", "<\\/")
    return (
        f'<div class="figure" id="fig-{e(key)}" data-figure="{e(key)}"></div>\n'
        f'<script type="application/json" id="data-{e(key)}">{spec}</script>'
    )


def note(text: str) -> str:
    return f'<p class="note">{e(text)}</p>'


def table(
    headers: Sequence[str],
    rows: Sequence[Sequence[Cell | str]],
    *,
    css: str = "",
    table_id: str | None = None,
    sortable: bool = False,
) -> str:
    classes = " ".join(c for c in (css, "sortable" if sortable else "") if c)
    head = "".join(f"<th>{e(h)}</th>" for h in headers)
    body = []
    for row in rows:
        cells = []
        for cell in row:
            c = cell if isinstance(cell, Cell) else Cell(cell)
            attrs = f' class="{e(c.css)}"' if c.css else ""
            if c.sort is not None:
                attrs += f' data-sort="{e(c.sort)}"'
            cells.append(f"<td{attrs}>{e(c.text)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    ident = f' id="{e(table_id)}"' if table_id else ""
    return (
        f'<table class="{classes}"{ident}><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table>"
    )


def definition_list(items: Sequence[tuple[str, str]]) -> str:
    rows = "".join(f"<dt>{e(k)}</dt><dd>{e(v if v else NA)}</dd>" for k, v in items)
    return f'<dl class="provenance">{rows}</dl>'


def command_block(key: str, label: str, command: str | None) -> str:
    if not command:
        return f"<h4>{e(label)}</h4>{note('n/a: no command was stored.')}"
    return (
        f'<div class="command"><h4>{e(label)}</h4>'
        f'<button type="button" class="copy" data-target="cmd-{e(key)}">Copy</button>'
        f'<pre id="cmd-{e(key)}">{e(command)}</pre></div>'
    )


def section(section_id: str, title: str, body: str) -> str:
    return f'<section id="{e(section_id)}"><h2>{e(title)}</h2>\n{body}\n</section>'


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#111827;
background:#f9fafb}
main{max-width:1280px;margin:0 auto;padding:24px 32px 64px}
header{background:#111827;color:#f9fafb;padding:20px 32px}
header h1{margin:0;font-size:22px}header p{margin:4px 0 0;color:#d1d5db}
section{background:#fff;border:1px solid #e5e7eb;border-radius:10px;padding:16px 24px;
margin:20px 0}
h2{margin-top:4px;font-size:19px}h3{font-size:16px;margin:18px 0 8px}h4{margin:12px 0 4px}
p.lead{font-size:16px;line-height:1.5}
table{border-collapse:collapse;font-size:13px;margin:8px 0}
th,td{border-bottom:1px solid #e5e7eb;padding:4px 10px;text-align:left;white-space:nowrap}
th{background:#f3f4f6;white-space:normal;vertical-align:bottom}
td.changed{font-weight:600;color:#1d4ed8}td.met{color:#047857}td.missed{color:#b91c1c;
font-weight:600}
table.metrics td:first-child,td.wrap{white-space:normal}
td.infeasible{color:#6b7280}td.chosen{font-weight:700;background:#fef9c3}
.grid{display:flex;flex-wrap:wrap;gap:24px}.grid>div{flex:1 1 420px;min-width:0;overflow-x:auto}
.grid>div.wide{flex-grow:1.4}
.figure{min-height:200px;margin:8px 0}
.pair{display:grid;grid-template-columns:1fr 1fr;gap:12px}
.pair>.figure{min-width:0}
pre{background:#111827;color:#e5e7eb;padding:12px;border-radius:6px;white-space:pre-wrap;
overflow-wrap:anywhere;font-size:13px}
.command{position:relative}.command pre{padding-right:84px}
button.copy{position:absolute;right:8px;top:36px;background:#2563eb;color:#fff;border:0;
border-radius:4px;padding:4px 10px;cursor:pointer}
ul.diagnostics{list-style:none;padding:0}
ul.diagnostics li{padding:8px 12px;margin:6px 0;border-left:4px solid #9ca3af;
background:#f9fafb}
ul.diagnostics li.triggered{border-color:#dc2626;background:#fef2f2}
ul.diagnostics li.ok{border-color:#10b981}
.note{color:#6b7280;font-style:italic}
.tablewrap{overflow-x:auto;max-height:640px;overflow-y:auto}
table.sortable th{cursor:pointer;position:sticky;top:0}
table.sortable th.asc::after{content:" \\25B2"}table.sortable th.desc::after{content:" \\25BC"}
dl.provenance{display:grid;grid-template-columns:max-content 1fr;gap:4px 16px;font-size:14px}
dl.provenance dt{font-weight:600}dl.provenance dd{margin:0}
"""

_SCRIPT = """
(function () {
  function render() {
    var nodes = document.querySelectorAll("div.figure[data-figure]");
    var pending = [];
    nodes.forEach(function (div) {
      var spec = JSON.parse(document.getElementById("data-" + div.dataset.figure).textContent);
      var config = {responsive: true, displaylogo: false};
      pending.push(Plotly.newPlot(div, spec.data, spec.layout, config));
    });
    Promise.all(pending).then(function () {
      document.body.dataset.rendered = String(nodes.length);
    }, function (err) {
      document.body.dataset.rendered = "error";
      console.error("figure failed to render", err);
    });
  }
  function sortBy(table, th, index) {
    var asc = !th.classList.contains("asc");
    table.querySelectorAll("th").forEach(function (h) { h.classList.remove("asc", "desc"); });
    th.classList.add(asc ? "asc" : "desc");
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    function key(row) {
      var cell = row.cells[index];
      var raw = cell.hasAttribute("data-sort") ? cell.getAttribute("data-sort") : cell.textContent;
      raw = raw.trim();
      var n = Number(raw);
      return raw !== "" && !isNaN(n) ? [0, n] : [1, raw.toLowerCase()];
    }
    rows.sort(function (a, b) {
      var ka = key(a), kb = key(b);
      if (ka[0] !== kb[0]) { return ka[0] - kb[0]; }
      var c = ka[1] < kb[1] ? -1 : ka[1] > kb[1] ? 1 : 0;
      return asc ? c : -c;
    });
    rows.forEach(function (r) { body.appendChild(r); });
  }
  function copy(button) {
    var text = document.getElementById(button.dataset.target).textContent;
    function done() {
      button.textContent = "Copied";
      setTimeout(function () { button.textContent = "Copy"; }, 1500);
    }
    function fallback() {
      var area = document.createElement("textarea");
      area.value = text;
      document.body.appendChild(area);
      area.select();
      try { document.execCommand("copy"); done(); } catch (err) { button.textContent = "Select"; }
      area.remove();
    }
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(done, fallback);
    } else {
      fallback();
    }
  }
  document.querySelectorAll("table.sortable").forEach(function (table) {
    table.querySelectorAll("th").forEach(function (th, index) {
      th.addEventListener("click", function () { sortBy(table, th, index); });
    });
  });
  document.querySelectorAll("button.copy").forEach(function (button) {
    button.addEventListener("click", function () { copy(button); });
  });
  render();
})();
"""


def page(title: str, subtitle: str, sections: Sequence[str]) -> str:
    """The whole document; plotly.js appears exactly once, inline."""
    plotly_js = plotly.offline.get_plotlyjs()
    body = "\n".join(sections)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{e(title)}</title><style>{_CSS}</style>"
        f'<script type="text/javascript">{plotly_js}</script></head>\n'
        f"<body><header><h1>{e(title)}</h1><p>{e(subtitle)}</p></header>\n<main>\n{body}\n"
        f'</main>\n<script type="text/javascript">{_SCRIPT}</script></body></html>\n'
    )
