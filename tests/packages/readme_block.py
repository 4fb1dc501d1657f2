"""Print a README's code block as printed: the first fenced block of a language under a heading.

    python3 readme_block.py README.md "## Quick start" python

The heading is matched as a whole line; the block is the first ```<language> fence after it,
before the next heading of the same or a higher level. No such heading or block is an error
(exit 1), so a README that drops or renames its quick start fails the package test.
"""

from __future__ import annotations

import sys


def block(text: str, heading: str, language: str) -> str:
    lines = text.splitlines()
    level = len(heading) - len(heading.lstrip("#"))
    try:
        start = lines.index(heading)
    except ValueError:
        raise SystemExit(f"readme_block: no heading {heading!r}") from None
    inside: list[str] | None = None
    fence = ""
    for line in lines[start + 1 :]:
        if inside is None:
            stripped = line.lstrip("#")
            if line.startswith("#") and stripped.startswith(" ") and len(line) - len(stripped) <= level:
                break  # the section ended
            if line.startswith("```") and line[3:].strip() == language:
                inside, fence = [], "```"
        elif line.startswith(fence) and line.strip() == fence:
            return "\n".join(inside) + "\n"
        else:
            inside.append(line)
    raise SystemExit(f"readme_block: no ```{language} block under {heading!r}")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit("usage: readme_block.py README.md HEADING LANGUAGE")
    with open(sys.argv[1], encoding="utf-8") as f:
        sys.stdout.write(block(f.read(), sys.argv[2], sys.argv[3]))
