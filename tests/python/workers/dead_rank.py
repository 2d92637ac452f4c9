"""Rank 1 dies (os._exit, no finalize) after one collective; every other rank's next
blocking call and async request must raise ShoalError within SHOAL_TIMEOUT_S, not hang.
Exit 0 means the survivors saw the error in time. argv[1]: "numpy" or "torch"; argv[2] "started": die after the runtime started."""
import os
import sys
import time

import numpy as np

import shoal

mode = sys.argv[1]
timeout_s = float(os.environ["SHOAL_TIMEOUT_S"])
if mode == "torch":
    import torch
    import shoal.torch as hvd
    hvd.init()
else:
    shoal.init()
comm = shoal.communicator()
comm.allreduce(np.ones(4, np.float32))
if len(sys.argv) > 2 and sys.argv[2] == "started":
    comm.async_start()  # the peer dies while the runtime's background thread runs
    comm.iallreduce(np.ones(4, np.float32), name="before-death").wait()
if comm.rank == 1:
    sys.stdout.flush()
    os._exit(0)  # a sudden death: exit status 0 so that shoalrun does not stop the others first
time.sleep(0.2)
start = time.monotonic()
try:
    if mode == "torch":
        model = torch.nn.Linear(4, 2)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters())
        model(torch.ones(3, 4)).sum().backward()
        opt.step()
    else:
        comm.iallreduce(np.ones(1000, np.float32), name="after-death").wait()
    print("FAIL: no error after a peer died")
    sys.exit(1)
except shoal.ShoalError as error:
    elapsed = time.monotonic() - start
    print("rank %d: ShoalError after %.1f s: %s" % (comm.rank, elapsed, error))
    if elapsed > timeout_s + 5:
        print("FAIL: the error came later than SHOAL_TIMEOUT_S=%g s" % timeout_s)
        sys.exit(1)
os._exit(0)  # the communicator is broken; skip the atexit finalize
