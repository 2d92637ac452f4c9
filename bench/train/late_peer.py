"""The later rank's latency for one small allreduce: rank 0 submits at once, rank 1 DELAY_US later
(busy-waiting, as a rank still finishing its backward); each rank times its own submit -> done.

    bench/netns/cluster.sh up 2 --rate 1gbit --name late
    SHOAL_CYCLE_TIME_MS=20 SLEEP_MS=30 ITERS=40 DELAY_US=2000 OMP_NUM_THREADS=1 \\
        bench/netns/run.sh --name late /usr/bin/python3 bench/train/late_peer.py
    bench/netns/cluster.sh down --name late

Each iteration starts both ranks together (a blocking allreduce), sleeps SLEEP_MS (longer than a
cycle, so rank 0's submission starts a round at once), then submits. Before the seventh session's
runtime change rank 1, which had joined rank 0's round with nothing pending, waited up to a cycle
to start its own (docs/training.md, "The NCF sketch step (issue 19, seventh session)").
"""
import os
import statistics
import time

import torch

import shoal.torch as hvd

hvd.init()
rank = hvd.rank()
delay = float(os.environ.get("DELAY_US", "300")) * 1e-6
pause = float(os.environ.get("SLEEP_MS", "3")) * 1e-3
x = torch.zeros(16)
latencies = []
for _ in range(int(os.environ.get("ITERS", "120"))):
    hvd.allreduce(torch.zeros(1), name="late_peer.sync")
    time.sleep(pause)
    if rank == 1:
        end = time.perf_counter() + delay
        while time.perf_counter() < end:
            pass
    start = time.perf_counter()
    hvd.synchronize(hvd.allreduce_async_(x, name="late_peer.x"))
    latencies.append(time.perf_counter() - start)
kept = sorted(latencies[10:] or latencies)
print("rank %d delay %.0f us: submit->done median %.0f us, p25 %.0f, p75 %.0f" % (
    rank, delay * 1e6, 1e6 * statistics.median(kept), 1e6 * kept[len(kept) // 4], 1e6 * kept[3 * len(kept) // 4]),
    flush=True)
hvd.shutdown()
