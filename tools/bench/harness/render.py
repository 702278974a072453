"""The benchmark pages (``docs/benchmarks/``), drawn from the result documents kept beside them.

NOTE [benchmark pages]: each benchmark has one page, ``docs/benchmarks/NAME.md``, whose
first section, "Current", holds blocks ``<!-- render results/A.json [results/B.json ...] -->``
... ``<!-- /render -->``; ``cachepipe bench render`` replaces each block's body with what
its result documents (NOTE [benchmark result document]) say: the command, the date and
commit, the machine, the table, the notes. Several documents in one block (a CPU run and
the GPU runs of the same benchmark) make one table with a ``run`` column, each run named by
its document's ``label`` (else its file name). ``docs/benchmarks/README.md`` holds the
index between ``<!-- index -->`` and ``<!-- /index -->``: one row per registered benchmark,
from ``results/NAME.json``. A page therefore never disagrees with its data: a test renders
every page and compares (``render --check`` does the same). A document of a run that was
not repeated for this release says where it was recorded in ``source``.
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from tools.bench.harness.output import format_table

__all__ = ["DOCS", "render_all", "render_index", "render_main", "render_page"]

DOCS = Path(__file__).resolve().parents[3] / "docs" / "benchmarks"
_BLOCK = re.compile(r"(<!-- render (?P<files>[^>]*?) -->\n)(?P<body>.*?)(<!-- /render -->)", re.S)
_INDEX = re.compile(r"(<!-- index -->\n)(.*?)(<!-- /index -->)", re.S)


def _load(docs: Path, name: str) -> dict:
    path = docs / name
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a readable result document ({exc})") from None
    for key in ("benchmark", "command", "date", "machine", "columns", "rows"):
        if key not in doc:
            raise ValueError(f"{path}: a result document needs {key!r}")
    return doc


def _label(name: str, doc: dict) -> str:
    return doc.get("label") or Path(name).stem


def _provenance(doc: dict, label: str | None) -> list[str]:
    who = f"**{label}**: " if label else ""
    lines = [f"{who}`{doc['command']}`", f"{'  ' if label else ''}{doc['date'][:10]}, commit "
             f"{(doc.get('machine_info') or {}).get('commit') or doc.get('commit', 'unknown')}; {doc['machine']}"]
    if doc.get("source"):
        lines.append(f"{'  ' if label else ''}{doc['source']}")
    return lines


def render_block(docs: Path, names: list[str]) -> str:
    """The body of one ``<!-- render ... -->`` block (NOTE [benchmark pages])."""
    docs_ = [(name, _load(docs, name)) for name in names]
    if len(docs_) == 1:
        name, doc = docs_[0]
        rows, columns, head = doc["rows"], doc["columns"], _provenance(doc, None)
    else:
        columns = ["run"] + [c for c in dict.fromkeys(c for _, d in docs_ for c in d["columns"])]
        rows = [dict(r, run=_label(n, d)) for n, d in docs_ for r in d["rows"]]
        head = [line for n, d in docs_ for line in _provenance(d, _label(n, d))]
    out = ["\n".join(f"{line}  " for line in head), "", format_table(rows, columns)]
    for title, extra_rows, extra_columns in ((t["title"], t["rows"], t["columns"])
                                             for _, d in docs_ for t in d.get("tables", [])):
        out += ["", title, "", format_table(extra_rows, extra_columns)]
    notes = [note for _, d in docs_ for note in d.get("notes", [])]
    if notes:
        out += ["", "```", *notes, "```"]
    return "\n".join(out) + "\n"


def render_page(text: str, docs: Path = DOCS) -> str:
    """``text`` (a page) with every render block redrawn."""
    return _BLOCK.sub(lambda m: m[1] + render_block(docs, m["files"].split()) + m[4], text)


def render_index(text: str, benchmarks: dict, docs: Path = DOCS) -> str:
    """``text`` (the README) with its index redrawn from ``results/NAME.json`` of every
    benchmark of ``benchmarks`` (the registry: name -> entry)."""
    rows = []
    for name, entry in benchmarks.items():
        path = docs / "results" / f"{name}.json"
        doc = _load(docs, f"results/{name}.json") if path.exists() else None
        info = (doc or {}).get("machine_info") or {}
        machine = (f"{info['cores']} cores{', ' + info['gpu'] if info.get('gpu') else ''}" if info
                   else (doc or {}).get("machine", "not run"))
        rows.append({"benchmark": f"[`{name}`]({name}.md)", "measures": entry.help,
                     "headline": (doc or {}).get("headline") or "no current figure",
                     "machine": machine, "date": (doc or {}).get("date", "")[:10],
                     "commit": info.get("commit") or (doc or {}).get("commit", "")})
    table = format_table(rows, ["benchmark", "measures", "headline", "machine", "date", "commit"])
    return _INDEX.sub(lambda m: m[1] + table + "\n" + m[3], text)


def render_all(benchmarks: dict, docs: Path = DOCS, check: bool = False) -> list[Path]:
    """Redraw the README's index (one row per entry of ``benchmarks``) and every page's
    blocks; returns the files that changed (with ``check``: that would change, left as they are)."""
    changed = []
    for path in [docs / "README.md", *sorted(p for p in docs.glob("*.md") if p.name != "README.md")]:
        text = path.read_text()
        new = render_index(text, benchmarks, docs) if path.name == "README.md" else render_page(text, docs)
        if new != text:
            changed.append(path)
            if not check:
                path.write_text(new)
    return changed


def render_main(argv: list[str], benchmarks: dict) -> int:
    """``cachepipe bench render [--check] [--docs DIR]`` over the registry ``benchmarks``."""
    parser = argparse.ArgumentParser(prog="cachepipe bench render",
                                     description="redraw the benchmark pages from their result documents")
    parser.add_argument("--check", action="store_true", help="only compare: exit 1 if a page disagrees with its data")
    parser.add_argument("--docs", default=str(DOCS), help=f"the pages' folder (default: {DOCS})")
    args = parser.parse_args(argv)
    try:
        changed = render_all(benchmarks, Path(args.docs), check=args.check)
    except ValueError as exc:
        print(f"cachepipe bench render: error: {exc}")
        return 2
    for path in changed:
        print(f"{'differs from its data' if args.check else 'redrawn'}: {path}")
    return 1 if args.check and changed else 0
