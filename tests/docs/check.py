"""The guide's and the READMEs' checks that no compiler makes: links resolve, and every example is tested.

    python3 tests/docs/check.py               # from anywhere in the repository; exit 1 with every finding
    python3 tests/docs/check.py --self-test   # the checks catch one planted fault of each kind
    python3 tests/docs/check.py --book target/book   # the built guide: no link in it leads nowhere

1. Every relative link in every Markdown file of the repository (git ls-files) names a file or folder
   that exists, and its `#anchor` names a heading of that file (GitHub's and mdBook's slugs agree on
   the headings used here: lower case, spaces to hyphens, punctuation other than `-` and `_` dropped,
   `-1`, `-2` … for repeats).
2. In the built guide (`--book DIR`), every relative `href` and `src` names a file of the book, and its
   `#anchor` an `id` in that file (a page's link out of docs/ was sent to the repository's web page by
   tests/docs/repo_links.py, mdBook's preprocessor here).
3. docs/SUMMARY.md, mdBook's table of contents, names every page under docs/ and only pages that exist.
4. Every fenced block names its language, and every example in the guide and the READMEs (EXAMPLE_GLOBS)
   is compiled or run by a test:
   - ```rust is the body (after its leading `//!` lines) of one of the workspace's examples, as `cargo
     metadata` lists them: `cargo test --workspace` and `cargo clippy --all-targets` build those;
   - ```ts is compiled under `tsc --strict` by js/test/readme-types.test.mjs, which reads the same files;
   - ```python is type-checked by mypy (`--check-untyped-defs`) by python/tests/test_docs.py, same files;
   - ```js is the npm package's quick start, which tests/packages/run.sh runs from the tarball.
   A ```toml or ```json block must parse. A block in another language is not an example (shell, text,
   SQL, WIT).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from html.parser import HTMLParser
from urllib.parse import unquote

REPO = Path(__file__).resolve().parents[2]

#: The Markdown files whose examples must be tested: the guide and the three READMEs a user reads first.
#: js/test/readme-types.test.mjs and python/tests/test_docs.py read the same list (`example_files`).
EXAMPLE_GLOBS = ["README.md", "python/README.md", "js/README.md", "docs/**/*.md"]

#: Languages whose blocks are examples, and the one test that covers each.
TESTED_BY = {
    "rust": "the body of one of the workspace's examples (compiled by cargo test --workspace)",
    "ts": "js/test/readme-types.test.mjs (tsc --strict)",
    "python": "python/tests/test_docs.py (mypy --check-untyped-defs)",
    "js": "the npm package's quick start (tests/packages/run.sh)",
}
#: Data whose blocks must at least parse: a config or a message a reader copies.
PARSED = {"toml": tomllib.loads, "json": json.loads}
#: Blocks that are not programs.
NOT_EXAMPLES = {"sh", "text", "sql", "wit"} | set(PARSED)

FENCE = re.compile(r"^(\s*)(```+|~~~+)(.*)$")
#: An inline link or image: its text may hold one level of brackets and run over lines (not paragraphs).
LINK = re.compile(r"\[(?:[^\[\]\n]|\n(?![ \t]*\n)|\[[^\]\n]*\])*\]\((?:<([^<>\n]+)>|([^()\s]+))(?:\s+\"[^\"]*\")?\)")
#: A reference definition: `[name]: target`.
REFERENCE = re.compile(r"^[ ]{0,3}\[[^\]]+\]:[ \t]*<?([^\s>]+)>?", re.MULTILINE)
#: An HTML link or image in the Markdown.
HTML_LINK = re.compile(r"""<(?:a|img|source)\b[^>]*?\s(?:href|src)=["']([^"']+)["']""", re.IGNORECASE)


def example_files() -> list[Path]:
    """The Markdown files of EXAMPLE_GLOBS, sorted, each once."""
    found: set[Path] = set()
    for pattern in EXAMPLE_GLOBS:
        found.update(p for p in REPO.glob(pattern) if p.is_file())
    return sorted(found)


def blocks(text: str) -> list[tuple[int, str, str]]:
    """The fenced blocks of a Markdown text: (line of the opening fence, language, body)."""
    out: list[tuple[int, str, str]] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m:
            indent, fence, info = m.groups()
            body: list[str] = []
            j = i + 1
            while j < len(lines) and lines[j].strip() != fence:
                body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j])
                j += 1
            out.append((i + 1, info.strip().split(",")[0].split(" ")[0], "\n".join(body)))
            i = j
        i += 1
    return out


def fenced_lines(text: str) -> set[int]:
    """The numbers (from 0) of a Markdown text's lines inside fenced blocks, the fences included."""
    fenced: set[int] = set()
    for start, _, body in blocks(text):
        fenced.update(range(start - 1, start + body.count("\n") + 2))
    return fenced


def prose(text: str) -> str:
    """The text with fenced blocks and inline code blanked (line numbers kept), where links are read."""
    fenced = fenced_lines(text)
    kept = ["" if i in fenced else line for i, line in enumerate(text.split("\n"))]
    return re.sub(r"`[^`\n]*`", lambda m: " " * len(m.group(0)), "\n".join(kept))


def slug(heading: str) -> str:
    """The anchor of a heading, as GitHub and mdBook make it."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


@functools.cache
def anchors(path: Path) -> frozenset[str]:
    """Every anchor a Markdown file defines: its headings' slugs (with repeats numbered) and `id`s."""
    text = path.read_text(encoding="utf-8")
    fenced = fenced_lines(text)
    seen: dict[str, int] = {}
    out: set[str] = set()
    for number, line in enumerate(text.split("\n")):
        if not re.match(r"^#{1,6}\s", line) or number in fenced:
            continue
        base = slug(re.sub(r"^#{1,6}\s+", "", line).rstrip("# ").replace("`", ""))
        n = seen.get(base, 0)
        out.add(base if n == 0 else f"{base}-{n}")
        seen[base] = n + 1
    out.update(re.findall(r"""<a\s+(?:name|id)=["']([^"']+)["']""", text))
    return frozenset(out)


def markdown_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "*.md"],
                            cwd=REPO, capture_output=True, text=True, check=True).stdout
    return sorted(REPO / name for name in listed.split("\0") if name and (REPO / name).is_file())


def link_targets(text: str) -> list[tuple[int, str]]:
    """(line, target) of every link of a Markdown text outside code: inline links and images (their text
    may run over lines; `<…>` targets too), reference definitions, and HTML `href` and `src` attributes."""
    body = prose(text)
    found: list[tuple[int, str]] = []
    for pattern in (LINK, REFERENCE, HTML_LINK):
        for m in pattern.finditer(body):
            target = next(g for g in m.groups() if g is not None)
            found.append((body.count("\n", 0, m.start()) + 1, target))
    return sorted(found)


def check_links(path: Path, findings: list[str]) -> None:
    for number, target in link_targets(path.read_text(encoding="utf-8")):
        if re.match(r"^([a-z][a-z0-9+.-]*:|//)", target):
            continue  # https:, mailto:
        where = f"{path.relative_to(REPO)}:{number}"
        name, _, anchor = target.partition("#")
        dest = (path.parent / unquote(name)).resolve() if name else path
        if not dest.exists():
            findings.append(f"{where}: link to {target}: no such file")
            continue
        if REPO not in dest.parents and dest != REPO:
            findings.append(f"{where}: link to {target} leaves the repository")
            continue
        if not anchor:
            continue
        if dest.suffix == ".md":
            if anchor not in anchors(dest):
                findings.append(f"{where}: link to {target}: {dest.relative_to(REPO)} has no heading #{anchor}")
        elif not (dest.is_file() and re.fullmatch(r"L(\d+)(-L\d+)?", anchor)
                  and int(re.match(r"L(\d+)", anchor).group(1)) <= dest.read_text(encoding="utf-8").count("\n") + 1):  # type: ignore[union-attr]
            findings.append(f"{where}: link to {target}: an anchor into a file that is not Markdown (only #L<line> of a line it has)")


def check_summary(findings: list[str]) -> None:
    docs = REPO / "docs"
    summary = docs / "SUMMARY.md"
    named = {(docs / t).resolve() for t in re.findall(r"\]\(([^)#]+\.md)\)", summary.read_text(encoding="utf-8"))}
    pages = {p.resolve() for p in docs.rglob("*.md") if p.name != "SUMMARY.md"}
    for page in sorted(pages - named):
        findings.append(f"docs/SUMMARY.md: the page {page.relative_to(REPO)} is not in the guide's table of contents")
    for page in sorted(named - pages):
        findings.append(f"docs/SUMMARY.md: names {page.relative_to(REPO)}, which does not exist")


def example_sources() -> dict[str, Path]:
    """The bodies (after the leading `//!` lines and the blank line) of the workspace's examples, the ones
    `cargo test --workspace` and `cargo clippy --workspace --all-targets` build, as `cargo metadata` lists them."""
    listed = subprocess.run(["cargo", "metadata", "--no-deps", "--format-version", "1", "--offline"],
                            cwd=REPO, capture_output=True, text=True, check=True).stdout
    out: dict[str, Path] = {}
    for package in json.loads(listed)["packages"]:
        for target in package["targets"]:
            if "example" not in target["kind"]:
                continue
            path = Path(target["src_path"])
            lines = path.read_text(encoding="utf-8").split("\n")
            while lines and (lines[0].startswith("//!") or not lines[0].strip()):
                lines.pop(0)
            out["\n".join(lines).strip()] = path
    return out


def js_quick_start() -> str:
    """js/README.md's quick start, by the extractor tests/packages/run.sh runs it with."""
    spec = importlib.util.spec_from_file_location("readme_block", REPO / "tests" / "packages" / "readme_block.py")
    assert spec and spec.loader
    extractor = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(extractor)
    quick_start: str = extractor.block((REPO / "js" / "README.md").read_text(encoding="utf-8"), "## Quick start", "js")
    return quick_start.strip()


def check_examples(findings: list[str]) -> None:
    rust = example_sources()
    js = js_quick_start()
    for path in example_files():
        text = path.read_text(encoding="utf-8")
        lines = text.split("\n")
        for number, text_line in enumerate(lines, 1):
            if re.match(r"^\s*>\s*(```|~~~)", text_line):
                findings.append(f"{path.relative_to(REPO)}:{number}: a fenced block inside a quote: the example tests read only top-level fences")
        for line, language, body in blocks(text):
            where = f"{path.relative_to(REPO)}:{line}"
            if not language:
                findings.append(f"{where}: a fenced block without a language (name one: {sorted(NOT_EXAMPLES | set(TESTED_BY))})")
            elif language in PARSED:
                try:
                    PARSED[language](body)
                except ValueError as e:  # tomllib.TOMLDecodeError and json.JSONDecodeError are ValueErrors
                    findings.append(f"{where}: this ```{language} block does not parse: {e}")
            elif language in NOT_EXAMPLES:
                continue
            elif language not in TESTED_BY:
                findings.append(f"{where}: ```{language}: no test compiles or runs this language")
            elif lines[line - 1] != f"```{language}":
                findings.append(f"{where}: write this fence as ```{language} alone at the start of its line: the example tests read only that form")
            elif language == "rust" and body.strip() not in rust:
                findings.append(f"{where}: this ```rust block is not the body of an example of the workspace, so nothing compiles it")
            elif language == "js" and body.strip() != js:
                findings.append(f"{where}: this ```js block is not js/README.md's quick start, the one block tests/packages/run.sh runs")


class _Html(HTMLParser):
    """The `id`s of an HTML page and its relative `href`s and `src`s."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name == "id" and value:
                self.ids.add(value)
            elif name in ("href", "src") and value and not re.match(r"^([a-z][a-z0-9+.-]*:|//)", value):
                self.links.append(value)


def check_book(book: Path, findings: list[str]) -> int:
    """Every relative link of the built book's pages leads to a file of the book (and an id in it)."""
    pages: dict[Path, _Html] = {}
    for page in sorted(book.rglob("*.html")):
        parsed = _Html()
        parsed.feed(page.read_text(encoding="utf-8"))
        pages[page.resolve()] = parsed
    if not pages:
        findings.append(f"{book}: no built pages (run mdbook build docs first)")
    for page, parsed in pages.items():
        for link in parsed.links:
            name, _, anchor = link.split("?")[0].partition("#")
            dest = (page.parent / unquote(name)).resolve() if name else page
            where = f"{page.relative_to(book.resolve())}"
            if not dest.exists():
                findings.append(f"{where}: the built guide links to {link}: no such file in the book")
            elif anchor and dest in pages and unquote(anchor) not in pages[dest].ids:
                findings.append(f"{where}: the built guide links to {link}: no id {anchor} there")
    return len(pages)


def self_test() -> int:
    """The checks must be able to fail: plant one fault of each kind in a scratch tree, expect each finding."""
    global REPO
    import shutil
    import tempfile

    here = REPO
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp).resolve()
        for folder in ("docs", "js", "tests/packages", "examples"):
            (root / folder).mkdir(parents=True)
        shutil.copy(here / "tests" / "packages" / "readme_block.py", root / "tests" / "packages")
        (root / "README.md").write_text("# Title\n", encoding="utf-8")
        (root / "js" / "README.md").write_text("## Quick start\n\n```js\nconsole.log(1);\n```\n", encoding="utf-8")
        (root / "Cargo.toml").write_text('[package]\nname = "t"\nversion = "0.0.0"\nedition = "2021"\n', encoding="utf-8")
        (root / "examples" / "a.rs").write_text("//! An example.\n\nfn main() {}\n", encoding="utf-8")
        (root / "docs" / "SUMMARY.md").write_text("[A](a.md)\n[Gone](gone.md)\n", encoding="utf-8")
        (root / "docs" / "orphan.md").write_text("# Orphan\n", encoding="utf-8")
        (root / "docs" / "a.md").write_text(
            "# A\n\n## A `real` heading\n\n[ok](#a-real-heading) [ok](../README.md#title) [ok](../examples)\n"
            "[bad anchor](#no-such) [bad file](missing.md) [bad anchor there](../README.md#nothing)\n\n"
            "```\nuntagged\n```\n\n```rust\nfn main() {}\n```\n\n```rust\nfn other() {}\n```\n\n"
            "```js\nconsole.log(1);\n```\n\n```js\nconsole.log(2);\n```\n\n```ruby\nputs 1\n```\n\n"
            "`[not a link](nowhere.md)`\n\n```text\n[not a link](nowhere.md)\n```\n\n"
            "[a link over\ntwo lines](gone-too.md) [ok](<a.md>) [ok](../examples/a.rs#L3) [bad](../examples/a.rs#L9)\n\n"
            "[ref]: nothing-here.md\n\n<img src=\"no.svg\">\n\n> ```python\n> 1\n> ```\n\n~~~ts\nlet a = 1;\n~~~\n\n"
            "```rust title=\"x\"\nfn main() {}\n```\n\n```toml\n[tools.x\n```\n\n```json\n{\"a\": }\n```\n",
            encoding="utf-8",
        )
        REPO = root
        findings: list[str] = []
        for page in (root / "docs" / "a.md", root / "README.md"):
            check_links(page, findings)
        check_summary(findings)
        check_examples(findings)
        (root / "book").mkdir()
        (root / "book" / "a.html").write_text(
            '<main><h2 id="there">There</h2><a href="#there">ok</a><a href="b.html#gone">bad anchor</a>'
            '<a href="../host/x.rs">bad file</a><a href="https://example.com/">ok</a><img src="a.svg"></main>',
            encoding="utf-8",
        )
        (root / "book" / "b.html").write_text('<main><a href="a.html#there">ok</a></main>', encoding="utf-8")
        check_book(root / "book", findings)
        REPO = here
    expected = [
        "a.md:6: link to #no-such: docs/a.md has no heading #no-such",
        "a.md:6: link to missing.md: no such file",
        "a.md:6: link to ../README.md#nothing: README.md has no heading #nothing",
        "the page docs/orphan.md is not in",
        "names docs/gone.md, which does not exist",
        "docs/a.md:8: a fenced block without a language",
        "docs/a.md:16: this ```rust block is not the body",
        "docs/a.md:24: this ```js block is not js/README.md's quick start",
        "docs/a.md:28: ```ruby: no test",
        "a.md:38: link to gone-too.md: no such file",
        "a.md:39: link to ../examples/a.rs#L9: an anchor into a file that is not Markdown",
        "a.md:41: link to nothing-here.md: no such file",
        "a.md:43: link to no.svg: no such file",
        "a fenced block inside a quote",
        "docs/a.md:49: write this fence as ```ts alone",
        "docs/a.md:53: write this fence as ```rust alone",
        "docs/a.md:57: this ```toml block does not parse",
        "docs/a.md:61: this ```json block does not parse",
        "a.html: the built guide links to b.html#gone: no id gone there",
        "a.html: the built guide links to ../host/x.rs: no such file in the book",
        "a.html: the built guide links to a.svg: no such file in the book",
    ]
    missed = [e for e in expected if not any(e in f for f in findings)]
    extra = [f for f in findings if not any(e in f for e in expected)]
    for e in missed:
        print(f"docs self-test: a planted fault was not found: {e}", file=sys.stderr)
    for f in extra:
        print(f"docs self-test: a finding nothing planted: {f}", file=sys.stderr)
    if missed or extra:
        return 1
    print(f"docs self-test: each of the {len(expected)} planted faults found, nothing else")
    return 0


def report(findings: list[str], passed: str) -> int:
    """Print the findings (exit 1) or what passed (exit 0)."""
    for finding in findings:
        print(finding, file=sys.stderr)
    if findings:
        print(f"docs: {len(findings)} finding(s)", file=sys.stderr)
        return 1
    print(f"docs: {passed}")
    return 0


def main() -> int:
    findings: list[str] = []
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    if sys.argv[1:2] == ["--book"] and len(sys.argv) == 3:
        count = check_book(Path(sys.argv[2]), findings)
        return report(findings, f"the built guide's {count} pages link only to what the book holds")
    if sys.argv[1:]:
        print(__doc__, file=sys.stderr)
        return 2
    files = markdown_files()
    for path in files:
        check_links(path, findings)
    check_summary(findings)
    check_examples(findings)
    return report(findings, f"{len(files)} Markdown files' links resolve; every example of {len(example_files())} files is tested")


if __name__ == "__main__":
    sys.exit(main())
