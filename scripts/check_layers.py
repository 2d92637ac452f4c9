#!/usr/bin/env python3
"""Fails when an #include runs upward between the library's layers
(docs/architecture.md, "Layers and rules").

Folders under lib/ (and the top-level collectives/) may include only their own
layer or a lower one; built-in compressors may include only the public headers
(shoal/), compressors/ (their own code and the compressor SDK in
compressors/common/), lib/core/ and, in GPU builds, the one device-memory
header. Run from anywhere: check_layers.py [repository root]."""
import os
import re
import sys

# Top to bottom. A folder may include itself or anything after it.
LAYERS = ["api", "runtime", "plugin", "gpu", "comm", "aggregate", "collectives", "transport", "bootstrap", "core"]
COMPRESSOR_ALLOWED = ("shoal/", "compressors/", "core/", "gpu/cuda/stream_memory.h")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
SOURCES = (".h", ".cc", ".cu", ".cuh")


def layer_of_path(relative):
    parts = relative.split("/")
    if parts[0] == "lib" and len(parts) > 2:
        return parts[1]
    if parts[0] == "collectives":
        return "collectives"
    return None


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    rank = {name: i for i, name in enumerate(LAYERS)}
    problems = []
    for top in ("lib", "collectives", "compressors"):
        for folder, _, files in os.walk(os.path.join(root, top)):
            for name in sorted(files):
                if not name.endswith(SOURCES):
                    continue
                path = os.path.join(folder, name)
                relative = os.path.relpath(path, root)
                layer = layer_of_path(relative)
                with open(path, encoding="utf-8", errors="replace") as source:
                    for number, line in enumerate(source, 1):
                        match = INCLUDE.match(line)
                        if not match:
                            continue
                        target = match.group(1)
                        head = target.split("/")[0]
                        where = f"{relative}:{number}: #include \"{target}\""
                        if top == "compressors":
                            if head in rank and not target.startswith(COMPRESSOR_ALLOWED):
                                problems.append(f"{where}: a compressor may include only shoal/, compressors/, "
                                                "core/ and gpu/cuda/stream_memory.h")
                            continue
                        if layer not in rank:
                            problems.append(f"{where}: {relative} is in no layer; add its folder to LAYERS")
                            break
                        if head == "compressors" and layer != "api" and layer != "gpu":
                            problems.append(f"{where}: only the API and GPU layers may include compressors/")
                        elif head in rank and rank[head] < rank[layer]:
                            problems.append(f"{where}: {layer} is below {head}; includes point down "
                                            f"({' > '.join(LAYERS)})")
    for problem in problems:
        print(problem)
    if problems:
        print(f"check_layers: {len(problems)} include(s) run upward (docs/architecture.md)")
        return 1
    print("check_layers: every include points down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
