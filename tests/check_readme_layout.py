#!/usr/bin/env python3
"""README.md's "Source layout" against src/ and the layers of check_layers.py.

Usage: check_readme_layout.py [REPO_DIR]   (default: the directory above tests/)

The section's first table has one row per file (or group of files) of src/:
`| layer | names | what it is |`, the names in backquotes. It fails when

- a file of src/ is not named, where naming `x.c` (or any `x.*`) stands for
  the other `x.*` too (its header);
- a path the section names (`src/...`, `tests/...`, `contrib/...`, in either
  table) does not exist;
- a file is named twice in the first table;
- a row's layer is not the layer check_layers.py gives the module of a C
  file it names;
- the chain (listener → client → request → exchange → meter) is not drawn.

Exits 0, or 1 with one line per problem.
"""

import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_layers  # noqa: E402

CHAIN = re.compile(r"listener \(proxy\.c\) → client \(client\.c\) → request \(request\.c[^)]*\) → "
                   r"exchange \(exchange\.c\) → meter \(meter\.c\)")
NAME = re.compile(r"`((?:src|tests|contrib|conf|docs|proto)/[^`]*)`")


def section(readme):
    lines = readme.split("\n")
    start = lines.index("## Source layout")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return lines[start:end]


def main(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    repo = argv[1] if len(argv) > 1 else os.path.join(here, "..")
    with open(os.path.join(repo, "README.md"), encoding="utf-8") as fh:
        lines = section(fh.read())
    layer = check_layers.layer_map()
    errors = []

    if not any(CHAIN.search(line) for line in lines):
        errors.append("the chain listener (proxy.c) → client → request → exchange → meter is not drawn")

    named = {}  # src file -> how often the layer table names it
    first_table = True
    seen_table = False
    for line in lines:
        if not line.startswith("|"):
            if seen_table:
                first_table = False
            continue
        seen_table = True
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        for path in NAME.findall(line):
            if not os.path.exists(os.path.join(repo, path.rstrip("/"))):
                errors.append(f"{path}: named in Source layout, not in the tree")
        if not first_table or not cells[0].isdigit():  # another table, or the header row
            continue
        n = int(cells[0])
        for path in NAME.findall(cells[1]):
            if not path.startswith("src/"):
                continue
            f = path[len("src/"):]
            named[f] = named.get(f, 0) + 1
            if f.endswith((".c", ".h", ".h.in")):
                m = check_layers.module_of(f)
                if layer.get(m) != n:
                    errors.append(f"{path}: row says layer {n}, check_layers.py says {layer.get(m)}")

    for f, k in sorted(named.items()):
        if k > 1:
            errors.append(f"src/{f}: named {k} times in the layer table")
    covered = {f.split(".")[0] for f in named}
    for f in sorted(os.listdir(os.path.join(repo, "src"))):
        if f in named or f.split(".")[0] in covered:
            continue
        errors.append(f"src/{f}: not in README.md's Source layout (add a row in its layer)")

    if errors:
        for e in errors:
            print(e)
        return 1
    print(f"README.md's Source layout names the {len(os.listdir(os.path.join(repo, 'src')))} files of src/ "
          "in their layers")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
