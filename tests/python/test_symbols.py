"""The binding declares exactly the shoal_* functions libshoal exports (nm -D), no more, no fewer."""
import shutil
import subprocess

import pytest

from conftest import library


def test_binding_declares_every_exported_symbol():
    nm = shutil.which("nm")
    if nm is None:
        pytest.fail("nm (binutils) is needed to list libshoal's exported symbols")
    listing = subprocess.run([nm, "-D", "--defined-only", library()], check=True, stdout=subprocess.PIPE).stdout
    exported = {line.split()[-1] for line in listing.decode().splitlines()
                if line.split() and line.split()[-1].startswith("shoal_")}
    from shoal._lib import DECLARATIONS
    declared = set(DECLARATIONS)
    assert len(exported) > 40
    assert exported - declared == set(), "exported by libshoal but not declared in shoal/_lib.py"
    assert declared - exported == set(), "declared in shoal/_lib.py but not exported by libshoal"
