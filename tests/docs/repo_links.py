"""mdBook preprocessor: a guide page's link to a file of the repository outside docs/ becomes a link to it
on the repository's web page (book.toml's `git-repository-url`, branch main).

Such links resolve in a checkout and on GitHub, where the pages are read as Markdown, but not in the built
book, which holds only docs/. mdBook runs this as `python3 ../tests/docs/repo_links.py` (book.toml) with
`[context, book]` as JSON on stdin, and reads the book back from stdout; `supports RENDERER` answers yes.
tests/docs/check.py --book then finds no link in the built book that leads nowhere.
"""

from __future__ import annotations

import json
import posixpath
import re
import sys
from pathlib import Path
from typing import Any

from check import fenced_lines  # tests/docs/check.py, beside this file: the fences as the checks read them

LINK = re.compile(r"(\]\()([^()\s]+)(\))")


def rewrite(content: str, page: str, docs: Path, repo: Path, base: str) -> str:
    """`content` of the page at `page` (relative to docs/) with links that leave docs/ sent to `base`."""
    fenced = fenced_lines(content)
    return "\n".join(
        line if number in fenced
        else LINK.sub(lambda link: link.group(1) + target(link.group(2), page, docs, repo, base) + link.group(3), line)
        for number, line in enumerate(content.split("\n"))
    )


def target(link: str, page: str, docs: Path, repo: Path, base: str) -> str:
    if re.match(r"^[a-z][a-z0-9+.-]*:", link) or link.startswith("#"):
        return link
    name, hash_, anchor = link.partition("#")
    resolved = (docs / posixpath.dirname(page) / name).resolve()
    if docs in resolved.parents or resolved == docs or repo not in resolved.parents:
        return link
    relative = resolved.relative_to(repo).as_posix()
    kind = "tree" if resolved.is_dir() else "blob"
    return f"{base}/{kind}/main/{relative}{hash_}{anchor}"


def chapters(items: list[Any]) -> list[dict[str, Any]]:
    """Every chapter of a book's items, nested ones included."""
    found: list[dict[str, Any]] = []
    for item in items:
        if isinstance(item, dict) and "Chapter" in item:
            chapter = item["Chapter"]
            found.append(chapter)
            found.extend(chapters(chapter.get("sub_items", [])))
    return found


def main() -> int:
    if sys.argv[1:2] == ["supports"]:
        return 0
    context, book = json.load(sys.stdin)
    root = Path(context["root"]).resolve()
    docs = (root / context["config"]["book"].get("src", "src")).resolve()
    repo = root.parent
    base = context["config"]["output"]["html"]["git-repository-url"].rstrip("/")
    items = book.get("items", book.get("sections", []))
    for chapter in chapters(items):
        if chapter.get("path"):
            chapter["content"] = rewrite(chapter["content"], chapter["path"], docs, repo, base)
    json.dump(book, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
