"""MkDocs hooks (mkdocs.yml `hooks:`): the generated pages and the benchmark figures.

- on_files adds the reference pages of tools/docs/reference.py (and the documents they were made
  from) to the site: generated at every build from the code, never committed, so they cannot drift.
  A file of the same name in docs/ is an error: there would be two versions of one page.
- on_page_markdown replaces the figure markers of tools/docs/figures.py with the values of
  benchmarks/results/*.json; a marker that names a missing file or figure fails the build.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools.docs import figures, reference  # noqa: E402  (after the path that finds them)


def on_files(files: Files, config: Any) -> Files:
    for path, make in {**reference.PAGES, **reference.FILES}.items():
        if files.get_file_from_path(path) is not None:
            raise PluginError(f"docs/{path} is generated at build time (tools/docs/reference.py): delete the file")
        files.append(File.generated(config, path, content=make()))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    try:
        return figures.render(markdown)
    except figures.FigureError as err:
        raise PluginError(f"{page.file.src_uri}: {err}") from None
