#!/usr/bin/env python3
"""README.md's "Source layout" against src/ and its folders.

Usage: check_readme_layout.py [REPO_DIR]   (default: the directory above tests/)

The section's file table has one row per file (or group of files) of src/:
`| folder/ | names | what it is |`, the names in backquotes. It fails when

- a file of src/ is not named, where naming `x.c` (or any `x.*`) stands for
  the other `x.*` too (its header); src/CMakeLists.txt is named in the text;
- a path the section names (`src/...`, `tests/...`, `contrib/...`, in any
  table) does not exist;
- a file is named twice in the file table;
- a row's folder is not the folder its files are in;
- a folder of src/ has no row in the folder table (the first table);
- the chain (listener → client → request → exchange → meter) is not drawn.

Exits 0, or 1 with one line per problem.
"""

import os
import re
import sys

CHAIN = re.compile(r"listener \(proxy/proxy\.c\) → client \(proxy/client\.c\) → request \(proxy/request\.c[^)]*\) → "
                   r"exchange \(proxy/exchange\.c\) → meter \(measure/meter\.c\)")
NAME = re.compile(r"`((?:src|tests|contrib|conf|docs|proto)/[^`]*)`")


def section(readme):
    lines = readme.split("\n")
    start = lines.index("## Source layout")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return lines[start:end]


def main(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    repo = argv[1] if len(argv) > 1 else os.path.join(here, "..")
    src = os.path.join(repo, "src")
    with open(os.path.join(repo, "README.md"), encoding="utf-8") as fh:
        lines = section(fh.read())
    errors = []

    if not any(CHAIN.search(line) for line in lines):
        errors.append("the chain listener (proxy/proxy.c) → client → request → exchange → meter is not drawn")

    folders = sorted(d for d in os.listdir(src) if os.path.isdir(os.path.join(src, d)))
    described = set()  # folders with a row in the folder table
    named = {}  # src path (folder/file) -> how often the file table names it
    for line in lines:
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        for path in NAME.findall(line):
            if not os.path.exists(os.path.join(repo, path.rstrip("/"))):
                errors.append(f"{path}: named in Source layout, not in the tree")
        m = re.fullmatch(r"`src/(\w+)/`", cells[0])
        if m:
            described.add(m.group(1))
            continue
        if not re.fullmatch(r"\w+/", cells[0]):  # another table, or a header row
            continue
        folder = cells[0][:-1]
        for path in NAME.findall(cells[1]):
            if not path.startswith("src/"):
                continue
            f = path[len("src/"):]
            named[f] = named.get(f, 0) + 1
            if os.path.dirname(f) != folder:
                errors.append(f"{path}: in a row of {folder}/, but it is in {os.path.dirname(f) or 'src'}/")

    for d in folders:
        if d not in described:
            errors.append(f"src/{d}/: no row in the folder table")
    for f, k in sorted(named.items()):
        if k > 1:
            errors.append(f"src/{f}: named {k} times in the file table")
    covered = {f.split(".")[0] for f in named}
    count = 0
    for d in folders:
        for f in sorted(os.listdir(os.path.join(src, d))):
            rel = f"{d}/{f}"
            count += 1
            if rel in named or rel.split(".")[0] in covered:
                continue
            errors.append(f"src/{rel}: not in README.md's Source layout (add a row in its folder)")

    if errors:
        for e in errors:
            print(e)
        return 1
    print(f"README.md's Source layout names the {count} files of src/'s {len(folders)} folders in their folders")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
