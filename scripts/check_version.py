#!/usr/bin/env python3
"""The version is written once, in include/shoal/shoal.h (CMake reads it from
there); pyproject.toml repeats it because the wheel's metadata needs it before
CMake runs. Fails when the two differ. Usage: check_version.py [repository root]."""
import os
import re
import sys

root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
header = open(os.path.join(root, "include/shoal/shoal.h"), encoding="utf-8").read()
parts = [re.search(r"^#define SHOAL_VERSION_%s (\d+)$" % p, header, re.M) for p in ("MAJOR", "MINOR", "PATCH")]
if not all(parts):
    sys.exit("check_version: include/shoal/shoal.h lacks a SHOAL_VERSION_MAJOR/MINOR/PATCH line")
version = ".".join(m.group(1) for m in parts)
project = open(os.path.join(root, "pyproject.toml"), encoding="utf-8").read()
found = re.search(r'^version = "([^"]+)"$', project, re.M)
if not found or found.group(1) != version:
    sys.exit("check_version: pyproject.toml says %s, include/shoal/shoal.h says %s: make them equal"
             % (found.group(1) if found else "nothing", version))
print("check_version: %s in include/shoal/shoal.h and pyproject.toml" % version)
