#!/usr/bin/env python3
"""The include direction in src/: no file includes the header of a file above it.

Usage: check_layers.py [SRC_DIR]   (default: the src/ next to tests/)

Every file of src/ belongs to a module (a .c and its .h; a header-only file is
its own module; _int headers belong to the module they are private to), and
every module to a layer of LAYERS below, the chain README.md's "Source layout"
shows. An `#include "x.h"` in a module of layer n may name a header of layer n
or below, never above; within one layer, two modules may not include each
other. A file of src/ that is in no layer fails too: a new file must be placed.
Modules listed but absent from src/ are skipped, so the target files of issue
#19 can be listed before they exist.

ALLOWED lists today's violations, one (file, header) include each; it only
shrinks: an entry whose include is gone fails, so the step that removes the
include removes its line too.

Exits 0 and prints the chain it checked, or 1 with one line per violation.
"""

import os
import re
import sys

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
    (0, "reqparse respparse framer classify keyscan reqinfo timeline hist slice series_key "
     "knee config log bevio rxstamp varint strutil loop check version promtext signrank"),
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

# Today's violations, (including file, included header). Plan section 2.8:
# each step of issue #19 deletes the lines it fixes.
ALLOWED = set()

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def module_of(name):
    if name in OWNER:
        return OWNER[name]
    base = name
    for ext in (".h.in", ".c", ".h"):
        if base.endswith(ext):
            return base[: -len(ext)]
    return base


def main(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    src = argv[1] if len(argv) > 1 else os.path.join(here, "..", "src")
    layer = {}
    for n, names in LAYERS:
        for m in names.split():
            if m in layer:
                print(f"check_layers: {m} is listed twice", file=sys.stderr)
                return 1
            layer[m] = n

    files = sorted(f for f in os.listdir(src) if f.endswith((".c", ".h")))
    errors = []
    edges = {}  # (module, module) -> [(file, header)]
    present = set()
    used = set()
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
                if (f, h) in ALLOWED:
                    used.add((f, h))
                else:
                    errors.append(f'{f} (layer {layer[m]}): includes "{h}" of {hm} (layer {layer[hm]}), above it')

    for (a, b), incs in sorted(edges.items()):
        if a < b and layer[a] == layer[b] and (b, a) in edges:
            both = incs + edges[(b, a)]
            allowed = [i for i in both if i in ALLOWED]
            if allowed:
                used.update(allowed)
            else:
                lines = ", ".join(f'{f} -> "{h}"' for f, h in both)
                errors.append(f"{a} and {b} (layer {layer[a]}) include each other: {lines}")

    for f, h in sorted(ALLOWED - used):
        errors.append(f'allow-list entry ({f}, {h}) no longer matches an include: delete it')

    if errors:
        for e in errors:
            print(e)
        return 1
    print("include direction checked, highest layer first:")
    for n, names in LAYERS:
        now = [m for m in names.split() if m in present]
        if now:
            print(f"  {n}  {' '.join(now)}")
    if ALLOWED:
        print("allowed for now:", ", ".join(f"{f} -> {h}" for f, h in sorted(ALLOWED)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
