"""A rank that dies turns into ShoalError on every other rank within SHOAL_TIMEOUT_S, never a hang."""
import pytest

from conftest import shoalrun

CASES = [("numpy",), ("numpy", "started")]
try:
    import torch  # noqa: F401
    CASES.append(("torch",))
except ImportError:
    pass


@pytest.mark.parametrize("args", CASES, ids=["-".join(c) for c in CASES])
def test_dead_rank_is_an_error_on_the_others(args):
    rc, out = shoalrun(3, "dead_rank.py", *args, timeout_s=60, env={"SHOAL_TIMEOUT_S": "5"})
    assert rc == 0, out
    for rank in (0, 2):
        assert "rank %d: ShoalError" % rank in out, out
    assert "FAIL" not in out, out


def test_torch_case_runs_where_torch_is_installed():
    pytest.importorskip("torch")
    assert ("torch",) in CASES


def test_mismatched_names_fail_every_rank_instead_of_hanging():
    rc, out = shoalrun(2, "mismatched_names.py", timeout_s=60,
                       env={"SHOAL_STALL_CHECK_S": "1", "SHOAL_STALL_SHUTDOWN_S": "3"})
    assert rc == 0, out
    assert "rank 0: ShoalError" in out and "rank 1: ShoalError" in out, out
