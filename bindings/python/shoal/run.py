"""`python3 -m shoal.run -np 4 python3 train.py`: the shoalrun launcher a wheel bundles
(shoal/_bin/shoalrun), for installs that have no shoalrun on PATH. With the package used
from a build tree (SHOAL_LIBRARY set), it runs the shoalrun next to that libshoal."""
import os
import shutil
import sys


def find_shoalrun():
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [os.path.join(here, "_bin", "shoalrun")]
    library = os.environ.get("SHOAL_LIBRARY")
    if library:
        candidates.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(library))), "bin",
                                          "shoalrun"))
    for path in candidates:
        if os.access(path, os.X_OK):
            return path
    return shutil.which("shoalrun")


def main():
    path = find_shoalrun()
    if path is None:
        sys.exit("shoal.run: no shoalrun found (not in this package, next to $SHOAL_LIBRARY, or on PATH)")
    os.execv(path, [path] + sys.argv[1:])


if __name__ == "__main__":
    main()
