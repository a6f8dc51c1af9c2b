#!/usr/bin/env python3
"""The include direction in src/: a folder includes only its own headers and
those of the folders below it.

Usage: check_layers.py [SRC_DIR]   (default: the src/ next to tests/)
       check_layers.py --self-test [SRC_DIR]

src/ has one folder per layer and src/CMakeLists.txt one library per folder,
`tt_folder(NAME SOURCES ... LINK tt_below ...)`. The LINK lists are the
layering: a folder may use the folders it links and, through them, what they
link. This check reads them from src/CMakeLists.txt (the one place the order
is written) and fails:

- on an `#include "x.h"` in a folder of a header that is not in the folder or
  one below it (the build refuses most of these too, since a folder's headers
  are reachable only through its library; the check also names the edge);
- on a header that is in no folder, or in two;
- on two modules of one folder that include each other (a module is a .c and
  its .h; a _int header belongs to the module it is private to);
- on folders that link each other, directly or round about;
- on a .c file of a folder that its tt_folder() does not list, or a listed
  file that is not there, and on a file of src/ outside every folder but
  CMakeLists.txt.

Exits 0 and prints the folders it checked, highest first, or 1 with one line
per violation. --self-test plants violations in copies of SRC_DIR (an include
of a folder above, two modules of one folder including each other, a file no
library lists, a folder cycle) and exits 0 only when the check passes the
copy as it is and fails each planted one with its message (ctest
`layers_selftest`).
"""

import contextlib
import io
import os
import re
import shutil
import sys
import tempfile

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
FOLDER = re.compile(r"^tt_folder\((\w+)(.*?)\)\s*$", re.M | re.S)

# Files that belong to another module than their name says.
OWNER = {
    "store_int.h": "store",
    "store_pack.c": "store",
    # the settings table fills struct config and config_defaults() walks it:
    # one module in two files
    "settings.c": "config",
    "settings.h": "config",
}


def module_of(name):
    if name in OWNER:
        return OWNER[name]
    for ext in (".h.in", ".c", ".h"):
        if name.endswith(ext):
            return name[: -len(ext)]
    return name


def read_folders(src):
    """folder -> (set of folders it links, list of sources it lists)."""
    with open(os.path.join(src, "CMakeLists.txt"), encoding="utf-8") as fh:
        text = re.sub(r"#.*", "", fh.read())
    folders = {}
    for name, body in FOLDER.findall(text):
        words = body.split()
        links, sources, mode = set(), [], None
        for w in words:
            if w in ("SOURCES", "LINK"):
                mode = w
            elif mode == "LINK" and w.startswith("tt_"):
                links.add(w[3:])
            elif mode == "SOURCES" and w.startswith(f"{name}/"):
                sources.append(w[len(name) + 1 :])
        folders[name] = (links, sources)
    return folders


def below(folders, name, seen=()):
    """Every folder `name` reaches through its links; raises on a cycle."""
    out = set()
    for d in folders[name][0]:
        if d == name or d in seen:
            raise ValueError(" -> ".join(seen + (name, d)))
        if d not in folders:
            continue
        out.add(d)
        out |= below(folders, d, seen + (name,))
    return out


def main(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    src = argv[1] if len(argv) > 1 else os.path.join(here, "..", "src")
    errors = []
    folders = read_folders(src)
    reach = {}
    for name in folders:
        try:
            reach[name] = below(folders, name)
        except ValueError as e:
            errors.append(f"folders link each other: {e}")
            reach[name] = set()
    for name, (links, _) in folders.items():
        for d in links - set(folders):
            errors.append(f"tt_{name} links tt_{d}, which is no folder of src/")

    for f in sorted(os.listdir(src)):
        if os.path.isfile(os.path.join(src, f)) and f != "CMakeLists.txt":
            errors.append(f"{f}: in no folder of src/: place it")
        elif os.path.isdir(os.path.join(src, f)) and f not in folders:
            errors.append(f"{f}/: a folder no tt_folder() in src/CMakeLists.txt declares")

    home = {}  # header -> folder
    files = {}  # folder -> its .c/.h files
    for name in folders:
        d = os.path.join(src, name)
        files[name] = sorted(f for f in os.listdir(d) if f.endswith((".c", ".h", ".h.in"))) if os.path.isdir(d) else []
        for f in files[name]:
            h = f[:-3] if f.endswith(".h.in") else f  # configured into the build tree
            if h.endswith(".h"):
                if h in home:
                    errors.append(f"{h}: in {home[h]}/ and {name}/")
                home[h] = name
        listed = set(folders[name][1])
        for f in files[name]:
            if f.endswith(".c") and f not in listed and f != "main.c":
                errors.append(f"{name}/{f}: not in tt_folder({name}) of src/CMakeLists.txt")
        for f in sorted(listed):
            if not os.path.exists(os.path.join(d, f)):
                errors.append(f"{name}/{f}: listed in tt_folder({name}) but not there")

    edges = {}  # (folder, module, module) -> [(file, header)]
    for name in folders:
        for f in files[name]:
            with open(os.path.join(src, name, f), encoding="utf-8") as fh:
                text = fh.read()
            m = module_of(f)
            for h in INCLUDE.findall(text):
                hd = home.get(os.path.basename(h))
                if "/" in h or hd is None:
                    errors.append(f'{name}/{f}: includes "{h}", which is no header of a folder of src/')
                    continue
                if hd != name and hd not in reach[name]:
                    errors.append(f'{name}/{f}: includes "{h}" of {hd}/, which {name}/ does not link')
                    continue
                hm = module_of(h)
                if hd == name and hm != m:
                    edges.setdefault((name, m, hm), []).append((f, h))
    for (d, a, b), incs in sorted(edges.items()):
        if a < b and (d, b, a) in edges:
            lines = ", ".join(f'{f} -> "{h}"' for f, h in incs + edges[(d, b, a)])
            errors.append(f"{a} and {b} ({d}/) include each other: {lines}")

    if errors:
        for e in errors:
            print(e)
        return 1
    print("include direction checked, each folder with what it may include:")
    for name in sorted(folders, key=lambda n: (-len(reach[n]), n)):
        print(f"  {name + '/':11} {' '.join(sorted(reach[name])) or '-'}")
    return 0


def self_test(src):
    # (what is planted: path -> line appended, the message expected)
    plants = [
        ({}, None),
        ({"measure/meter.c": '#include "client.h"\n'},
         'measure/meter.c: includes "client.h" of proxy/, which measure/ does not link'),
        ({"parse/framer.c": '#include "classify.h"\n', "parse/classify.c": '#include "framer.h"\n'},
         "classify and framer (parse/) include each other"),
        ({"parse/planted_new.c": "int planted;\n"}, "parse/planted_new.c: not in tt_folder(parse)"),
        ({"planted_top.c": "int planted;\n"}, "planted_top.c: in no folder of src/"),
        ({"CMakeLists.txt": "tt_folder(planted LINK tt_planted2)\ntt_folder(planted2 LINK tt_planted)\n"},
         "folders link each other"),
    ]
    failed = 0
    for plant, want in plants:
        with tempfile.TemporaryDirectory() as tmp:
            copy = os.path.join(tmp, "src")
            shutil.copytree(src, copy)
            for f, line in plant.items():
                with open(os.path.join(copy, f), "a", encoding="utf-8") as fh:
                    fh.write(line)
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                rc = main(["check_layers.py", copy])
        got = out.getvalue()
        ok = rc == 0 if want is None else rc == 1 and want in got
        print(f"{'ok  ' if ok else 'FAIL'} {', '.join(plant) or 'src/ as it is'}: exit {rc}")
        if not ok:
            print(got, end="")
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--self-test":
        here = os.path.dirname(os.path.abspath(__file__))
        sys.exit(self_test(sys.argv[2] if len(sys.argv) > 2 else os.path.join(here, "..", "src")))
    sys.exit(main(sys.argv))
