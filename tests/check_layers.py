#!/usr/bin/env python3
"""The include direction in src/: no file includes the header of a file above it.

Usage: check_layers.py [SRC_DIR]   (default: the src/ next to tests/)
       check_layers.py --self-test [SRC_DIR]

Every file of src/ belongs to a module (a .c and its .h; a header-only file is
its own module; _int headers belong to the module they are private to), and
every module to a layer of LAYERS below, the chain README.md's "Source layout"
shows. An `#include "x.h"` in a module of layer n may name a header of layer n
or below, never above; within one layer, two modules may not include each
other. A file of src/ that is in no layer fails too: a new file must be placed.
Modules listed but absent from src/ are skipped. There are no exceptions: a
violation is an error (issue #19's steps emptied the list they had, and P7
removed it).

Exits 0 and prints the chain it checked, or 1 with one line per violation.
--self-test plants violations in copies of SRC_DIR (an include of a higher
layer, two modules of one layer including each other, a file in no layer)
and exits 0 only when the check passes the copy as it is and fails each
planted one with its message (ctest `layers_selftest`).
"""

import contextlib
import io
import os
import re
import shutil
import sys
import tempfile

# Highest layer first. Names are modules: a file's name without its extension.
LAYERS = [
    (9, "main cli"),
    (8, "admin admin_stats admin_recent admin_gate prom prom_proto prom_accept compare live dashboard"),
    (7, "worker"),
    (6, "proxy"),
    (5, "client"),
    (4, "request mirror"),
    (3, "exchange"),
    (2, "meter"),
    # control includes nothing of ours, and worker (7) includes control.h: it
    # belongs low, not with the admin API.
    (1, "upstream scrape router stats store paired store_held store_query store_check accesslog workload recent "
     "loader tls control fdlimit"),
    (0, "reqparse respparse framer eventstream classify keyscan reqinfo timeline tracectx hist slice series_key "
     "knee config balance log bevio rxstamp varint strutil loop check version promtext signrank"),
]

# Files that belong to another module than their name says.
OWNER = {
    "store_int.h": "store",
    "store_pack.c": "store",
    # the settings table fills struct config and config_defaults() walks it:
    # one module in two files
    "settings.c": "config",
    "settings.h": "config",
}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def module_of(name):
    if name in OWNER:
        return OWNER[name]
    base = name
    for ext in (".h.in", ".c", ".h"):
        if base.endswith(ext):
            return base[: -len(ext)]
    return base


def layer_map():
    """Module name -> layer number; raises ValueError on a module listed twice."""
    layer = {}
    for n, names in LAYERS:
        for m in names.split():
            if m in layer:
                raise ValueError(f"{m} is listed twice")
            layer[m] = n
    return layer


def main(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    src = argv[1] if len(argv) > 1 else os.path.join(here, "..", "src")
    try:
        layer = layer_map()
    except ValueError as e:
        print(f"check_layers: {e}", file=sys.stderr)
        return 1

    files = sorted(f for f in os.listdir(src) if f.endswith((".c", ".h")))
    errors = []
    edges = {}  # (module, module) -> [(file, header)]
    present = set()
    for f in files:
        m = module_of(f)
        present.add(m)
        if m not in layer:
            errors.append(f"{f}: module {m} is in no layer of tests/check_layers.py: place it")
            continue
        with open(os.path.join(src, f), encoding="utf-8") as fh:
            text = fh.read()
        for h in INCLUDE.findall(text):
            hm = module_of(h)
            if hm not in layer:
                errors.append(f'{f}: includes "{h}", whose module {hm} is in no layer')
                continue
            if hm == m:
                continue
            edges.setdefault((m, hm), []).append((f, h))
            if layer[hm] > layer[m]:
                errors.append(f'{f} (layer {layer[m]}): includes "{h}" of {hm} (layer {layer[hm]}), above it')

    for (a, b), incs in sorted(edges.items()):
        if a < b and layer[a] == layer[b] and (b, a) in edges:
            lines = ", ".join(f'{f} -> "{h}"' for f, h in incs + edges[(b, a)])
            errors.append(f"{a} and {b} (layer {layer[a]}) include each other: {lines}")

    if errors:
        for e in errors:
            print(e)
        return 1
    print("include direction checked, highest layer first:")
    for n, names in LAYERS:
        now = [m for m in names.split() if m in present]
        if now:
            print(f"  {n}  {' '.join(now)}")
    return 0


def self_test(src):
    # (what is planted: file -> line appended, the message expected)
    plants = [
        ({}, None),
        ({"meter.c": '#include "client.h"\n'}, 'meter.c (layer 2): includes "client.h" of client (layer 5), above it'),
        ({"framer.c": '#include "classify.h"\n', "classify.c": '#include "framer.h"\n'},
         "classify and framer (layer 0) include each other"),
        ({"planted_new.c": "int planted;\n"}, "planted_new.c: module planted_new is in no layer"),
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
