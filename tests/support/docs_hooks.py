"""MkDocs hooks of the docs site (mkdocs.yml): the generated navigation's order, and links out of docs/.

- **Navigation.** mkdocs.yml lists no page: the navigation is docs/'s folders, each in the order MkDocs
  gives its files (``index.md`` first, then by name), and the folders in the order a reader needs them
  (``SECTIONS``), the others after them. A page added by anyone appears without an edit elsewhere.
- **Links out of docs/.** A page may link to a file of the repository outside docs/ (a test suite's
  README, a deploy/ file), which the site does not hold. MkDocs would warn that it is "not found among
  documentation files"; here the file must exist instead (and, for a Markdown file, the heading an
  ``#anchor`` names), else the strict build fails. The link then points at the file in the repository
  (``repo_url``), or without one becomes the file's path as text.
"""

from __future__ import annotations

import logging
import posixpath
import re
from pathlib import Path
from typing import Any

from markdown.extensions.toc import slugify
from mkdocs.structure.files import Files, file_sort_key
from mkdocs.structure.nav import nest_paths

log = logging.getLogger("mkdocs.plugins.ca_externalgrpc")

#: the top folders of docs/, in the order of the navigation
SECTIONS = ("tutorials", "how-to", "reference", "explanation", "evidence")

_FENCE = re.compile(r"^\s*(```|~~~)")
_CODE_SPAN = re.compile(r"(`+).+?\1")
_LINK = re.compile(r"(!?\[(?P<text>[^\]]*)\])\((?P<target>[^)\s]+)(?P<title>\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^#{1,6}\s+(?P<text>.+?)\s*#*\s*$")
_HTML_ID = re.compile(r"""<a\s+(?:id|name)=["']([^"']+)["']""")


def _rank(src_uri: str) -> int:
    folder = src_uri.split("/")[0] if "/" in src_uri else ""
    if not folder:
        return 0  # docs/index.md and any page at the top
    return 1 + SECTIONS.index(folder) if folder in SECTIONS else 1 + len(SECTIONS)


def on_files(files: Files, config: Any) -> Files:
    if config["nav"] is None:
        pages = sorted(files.documentation_pages(), key=lambda f: (_rank(f.src_uri), file_sort_key(f)))
        config["nav"] = nest_paths(f.src_uri for f in pages if f.inclusion.is_in_nav())
    return files


def _anchors(path: Path) -> set[str]:
    """The heading ids a Markdown file has as MkDocs and GitHub make them, and its explicit anchors."""
    found: set[str] = set()
    fenced = False
    for line in path.read_text().splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        heading = _HEADING.match(line)
        if heading:
            text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.group("text"))
            found.add(slugify(text, "-"))
        found.update(_HTML_ID.findall(line))
    return found


def _outside_link(match: re.Match[str], page_dir: Path, docs: Path, repo: Path, config: Any, where: str) -> str:
    target = match.group("target")
    if re.match(r"^[a-z][a-z0-9+.-]*:|^#|^/", target):
        return match.group(0)  # a URL, an anchor on this page, or an absolute path (MkDocs judges those)
    path_text, _, anchor = target.partition("#")
    resolved = Path(posixpath.normpath((page_dir / path_text).as_posix()))
    if resolved.is_relative_to(docs):
        return match.group(0)  # a page or file of the site: MkDocs checks it and its anchor
    if not resolved.is_relative_to(repo) or not resolved.exists():
        log.warning("%s links to %s, which is not a file of the repository", where, target)
        return match.group(0)
    if anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
        log.warning("%s links to %s, but %s has no heading with the id %r", where, target, resolved.name, anchor)
    relative = resolved.relative_to(repo).as_posix()
    if config.get("repo_url"):
        url = f"{config['repo_url'].rstrip('/')}/blob/HEAD/{relative}" + (f"#{anchor}" if anchor else "")
        return f"{match.group(1)}({url}{match.group('title') or ''})"
    return f"{match.group('text')} (`{relative}`)"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    docs = Path(config["docs_dir"]).resolve()
    repo = Path(config["config_file_path"]).resolve().parent
    page_dir = (docs / page.file.src_uri).parent
    lines = []
    fenced = False
    for number, line in enumerate(markdown.split("\n"), 1):
        if _FENCE.match(line):
            fenced = not fenced
        if fenced or "](" not in line:
            lines.append(line)
            continue
        spans = [m.span() for m in _CODE_SPAN.finditer(line)]
        where = f"docs/{page.file.src_uri}:{number}"

        def replace(match: re.Match[str], spans: list[tuple[int, int]] = spans, where: str = where) -> str:
            if any(start <= match.start() < end for start, end in spans):
                return match.group(0)
            return _outside_link(match, page_dir, docs, repo, config, where)

        lines.append(_LINK.sub(replace, line))
    return "\n".join(lines)
