"""Ranks submit different names: with SHOAL_STALL_SHUTDOWN_S set, every rank's request fails with
ShoalError naming the stalled tensor, never a hang (the text names a stalled tensor). Exit 0 means every rank saw that error."""
import sys
import time

import numpy as np

import shoal

shoal.init()
comm = shoal.communicator()
name = "only.on.rank.%d" % comm.rank
start = time.monotonic()
try:
    comm.iallreduce(np.ones(4, np.float32), name=name).wait(timeout_s=60)
    print("FAIL: a request no other rank submitted completed")
    sys.exit(1)
except shoal.ShoalError as error:
    print("rank %d: ShoalError after %.1f s (%s): %s" % (comm.rank, time.monotonic() - start, error.status_name,
                                                         error.message))
    # The runtime's stall shutdown, long before the wait's own 60 s deadline, naming a stalled tensor.
    assert time.monotonic() - start < 30, "the stall was not detected before the wait's deadline"
    assert "stall" in error.message and "only.on.rank." in error.message, error.message
    assert not error.message.startswith("shoal_wait"), error.message
