"""Where a training step's time goes: a breakdown of shoal's data-parallel step, per rank.

Runs a training example (examples/train/*.py, backend shoal) unchanged, with timers around the
parts of its step, and prints one line per rank when it finishes:

    SHOAL_LIBRARY=build-nocuda/lib/libshoal.so PYTHONPATH=bindings/python OMP_NUM_THREADS=1 \
        build-nocuda/bin/shoalrun -np 2 /usr/bin/python3 bench/train/step_profile.py \
        examples/train/digits_mlp.py --compression powersgd --epochs 1 --max-steps 40

(or under bench/netns/run.sh for the emulated cluster). Per step, the first 3 steps left out,
medians over the steps (wall clock, ms) and means (CPU, ms):

  step        the whole step (Recorder.timed_step)
  forward     zero_grad + forward + loss.item(): the step less backward and optimizer.step
  backward    loss.backward(), the gradient hooks included
  hooks       DistributedOptimizer._submit: describing each gradient and shoal_iallreduce (inside backward)
  sync        synchronize(): shoal.wait_all for the step's requests, then the post-processing
  wait        of which shoal.wait_all
  update      optimizer.step() less synchronize(): the optimizer's own update

  cpu_main    CPU of the Python thread over the step (/proc/self/task/<tid>/schedstat, ns)
  cpu_engine  CPU of shoal's engine thread (the thread named shoal-engine)
  cpu_other   CPU of every other thread of the process (UCX's, torch's)
  ctx         voluntary / involuntary context switches per step of each of the three

  rounds, collectives, tensors, full rounds per step: shoal.async_stats() over the same steps
  neg_us      the engine's time in negotiation rounds per step (async_stats' negotiation_us)

With SHOAL_TIMELINE set, shoal writes rank 0's trace as always; bench/train/timeline_summary.py
summarizes it (bench/train/step_breakdown.sh --timeline runs both).
"""
import os
import runpy
import sys
import threading
import time

script = os.path.abspath(sys.argv[1])
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(script))
import common  # noqa: E402  (the example's helper module, patched before the example imports it)
import torch  # noqa: E402

import shoal  # noqa: E402
from shoal.torch import optimizer as shoal_optimizer  # noqa: E402

WARMUP = 3
_main_tid = threading.get_native_id()

# STEP_PROFILE_PIN=1: pin this process (and so the engine thread it starts later) to core
# rank % cores, rank from the launcher's SHOAL_RANK: an experiment on how much of the step is the
# scheduler moving 4 busy threads (2 ranks x Python + engine) over 2 cores.
if os.environ.get("STEP_PROFILE_PIN") == "1":
    _core = int(os.environ.get("SHOAL_RANK", "0")) % os.cpu_count()
    os.sched_setaffinity(0, {_core})


def _async_stats():
    """shoal.async_stats(), or zeros when this run does not use shoal (--backend local or ddp)."""
    if not shoal.is_initialized():
        return {"cycles": 0, "full_rounds": 0, "cache_hits": 0, "tensors": 0, "groups": 0, "negotiation_us": 0.0}
    return shoal.async_stats()


_names = {}


def _thread_name(tid):
    if tid not in _names:
        try:
            with open("/proc/self/task/%d/comm" % tid) as f:
                _names[tid] = f.read().strip()
        except OSError:
            return "?"
    return _names[tid]


def _threads():
    """{tid: (cpu ns, voluntary, involuntary switches)} for every thread of this process."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open("/proc/self/task/%s/schedstat" % tid) as f:
                cpu = int(f.read().split()[0])
            vol = invol = 0
            with open("/proc/self/task/%s/status" % tid) as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches"):
                        vol = int(line.split()[1])
                    elif line.startswith("nonvoluntary_ctxt_switches"):
                        invol = int(line.split()[1])
            out[int(tid)] = (cpu, vol, invol)
        except OSError:  # a thread that just ended
            pass
    return out


class Clock:
    """Wall and Python-thread CPU of the named parts of the current step."""

    def __init__(self):
        self.parts = {}

    def add(self, name, wall, cpu):
        w, c, n = self.parts.get(name, (0.0, 0.0, 0))
        self.parts[name] = (w + wall, c + cpu, n + 1)


current = Clock()
steps = []          # one dict per step: part -> (wall s, cpu s, count), plus the thread CPU
stats_at = {}


def timed(name, function):
    def wrapper(*args, **kwargs):
        w0, c0 = time.perf_counter(), time.thread_time()
        try:
            return function(*args, **kwargs)
        finally:
            current.add(name, time.perf_counter() - w0, time.thread_time() - c0)
    wrapper.__wrapped__ = function
    return wrapper


torch.Tensor.backward = timed("backward", torch.Tensor.backward)
shoal_optimizer._DistributedOptimizer._submit = timed("hooks", shoal_optimizer._DistributedOptimizer._submit)
shoal_optimizer._DistributedOptimizer.synchronize = timed("sync", shoal_optimizer._DistributedOptimizer.synchronize)
shoal_optimizer._DistributedOptimizer.step = timed("optimizer_step", shoal_optimizer._DistributedOptimizer.step)
shoal.wait_all = timed("wait", shoal.wait_all)

_timed_step = common.Recorder.timed_step


def timed_step(self, step):
    global current
    if len(self.step_s) == WARMUP:
        stats_at["start"] = _async_stats()
    current = Clock()
    before = _threads()
    w0, c0 = time.perf_counter(), time.thread_time()
    loss = _timed_step(self, step)
    current.add("step", time.perf_counter() - w0, time.thread_time() - c0)
    after = _threads()
    cpu_main = cpu_other = cpu_engine = 0
    ctx = [0, 0, 0, 0, 0, 0]
    for tid, (cpu, vol, invol) in after.items():
        cpu0, vol0, invol0 = before.get(tid, (0, 0, 0))
        if tid == _main_tid:
            cpu_main += cpu - cpu0
            ctx[0] += vol - vol0
            ctx[1] += invol - invol0
        elif _thread_name(tid) == "shoal-engine":
            cpu_engine += cpu - cpu0
            ctx[2] += vol - vol0
            ctx[3] += invol - invol0
        else:
            cpu_other += cpu - cpu0
            ctx[4] += vol - vol0
            ctx[5] += invol - invol0
    record = dict(current.parts)
    record["threads"] = (cpu_main / 1e9, cpu_other / 1e9, ctx, cpu_engine / 1e9)
    steps.append(record)
    return loss


common.Recorder.timed_step = timed_step

_finish = common.Recorder.finish


def median(values):
    values = sorted(values)
    return values[len(values) // 2] if values else 0.0


def finish(self, model, final_metric):
    end = _async_stats()
    kept = steps[WARMUP:] or steps
    n = max(1, len(kept))
    start = stats_at.get("start", {k: 0 for k in end})

    def wall(part):
        return 1e3 * median([s.get(part, (0.0, 0.0, 0))[0] for s in kept])

    def cpu(part):
        return 1e3 * sum(s.get(part, (0.0, 0.0, 0))[1] for s in kept) / n

    forward_w = median([s["step"][0] - s.get("backward", (0, 0, 0))[0] - s.get("optimizer_step", (0, 0, 0))[0]
                        for s in kept]) * 1e3
    forward_c = sum(s["step"][1] - s.get("backward", (0, 0, 0))[1] - s.get("optimizer_step", (0, 0, 0))[1]
                    for s in kept) / n * 1e3
    update_w = median([s.get("optimizer_step", (0, 0, 0))[0] - s.get("sync", (0, 0, 0))[0] for s in kept]) * 1e3
    update_c = sum(s.get("optimizer_step", (0, 0, 0))[1] - s.get("sync", (0, 0, 0))[1] for s in kept) / n * 1e3
    hooks_n = sum(s.get("hooks", (0, 0, 0))[2] for s in kept) / n
    cpu_main = 1e3 * sum(s["threads"][0] for s in kept) / n
    cpu_other = 1e3 * sum(s["threads"][1] for s in kept) / n
    cpu_engine = 1e3 * sum(s["threads"][3] for s in kept) / n
    ctx = [sum(s["threads"][2][i] for s in kept) / n for i in range(6)]
    per = {k: (end[k] - start[k]) / n for k in end}
    line = ("rank %d profile: steps=%d step=%.2f/%.2f forward=%.2f/%.2f backward=%.2f/%.2f hooks=%.2f/%.2f(x%.1f) "
            "sync=%.2f/%.2f wait=%.2f/%.2f update=%.2f/%.2f cpu_main=%.2f cpu_engine=%.2f cpu_other=%.2f "
            "ctx_main=%.1f/%.1f ctx_engine=%.1f/%.1f ctx_other=%.1f/%.1f rounds=%.2f full_rounds=%.2f "
            "collectives=%.2f tensors=%.2f neg_us=%.0f (wall median/cpu mean, ms per step)" % (
                self.dist.rank, len(kept), wall("step"), cpu("step"), forward_w, forward_c, wall("backward"),
                cpu("backward"), wall("hooks"), cpu("hooks"), hooks_n, wall("sync"), cpu("sync"), wall("wait"),
                cpu("wait"), update_w, update_c, cpu_main, cpu_engine, cpu_other, *ctx,
                per["cycles"], per["full_rounds"], per["groups"], per["tensors"], per["negotiation_us"]))
    print(line, flush=True)
    return _finish(self, model, final_metric)


common.Recorder.finish = finish
runpy.run_path(script, run_name="__main__")
