"""shoal.torch against Horovod's behaviour, the way Horovod's examples and a demanding user's
scripts use it (workers/torch_compat.py on 2 ranks under shoalrun; skipped only without torch).
The worker runs once for the module; each case is its own test."""
import re

import pytest

from conftest import shoalrun, torch_or_skip

CASES = ["collectives", "broadcast_object_root_keeps_its_object", "accumulate_and_clip",
         "optimizer_state_broadcast", "unused_and_frozen_parameters", "sparse_gradients", "user_compressor",
         "more_of_horovods_api", "sync_batch_norm", "process_sets"]


@pytest.fixture(scope="module")
def run():
    torch_or_skip()
    return shoalrun(2, "torch_compat.py", timeout_s=240)


def test_every_case_is_listed():
    source = open(__file__.replace("test_torch_compat.py", "workers/torch_compat.py")).read()
    assert re.findall(r"^def case_(\w+)\(", source, re.M) == CASES


@pytest.mark.parametrize("case", CASES)
def test_case(run, case):
    rc, out = run
    assert out.count("torch_compat %s OK" % case) == 2, out
    if case == CASES[-1]:
        assert rc == 0, out
