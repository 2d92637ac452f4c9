"""The installed wheel (SHOAL_TEST_WHEEL=1 scripts/test_python.sh): the package finds its own
bundled libshoal and shoalrun, with no SHOAL_LIBRARY and no PYTHONPATH."""
import os
import subprocess
import sys

import shoal
import shoal.run


def test_library_is_the_bundled_copy():
    package = os.path.dirname(os.path.abspath(shoal.__file__))
    assert "SHOAL_LIBRARY" not in os.environ
    assert os.path.dirname(shoal.library_path) == os.path.join(package, "_lib"), shoal.library_path
    assert "site-packages" in package


def test_bundled_shoalrun_runs_two_ranks():
    program = ("import numpy as np, shoal; shoal.init(); "
               "print('sum', int(shoal.allreduce(np.array([shoal.rank() + 1]))[0]))")
    proc = subprocess.run([sys.executable, "-m", "shoal.run", "-np", "2", "--timeout-s", "60", sys.executable, "-c",
                           program], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=90)
    out = proc.stdout.decode()
    assert proc.returncode == 0, out
    assert out.count("sum 3") == 2, out
    assert shoal.run.find_shoalrun().startswith(os.path.dirname(os.path.abspath(shoal.__file__)))
