"""Negotiation rounds per training step of shoal's async runtime.

Runs a training example (examples/train/*.py, backend shoal) unchanged and, when it finishes, prints
one line per rank with shoal.async_stats() (cycles = negotiation rounds) and the steps it timed:

    SHOAL_LIBRARY=build-nocuda/lib/libshoal.so PYTHONPATH=bindings/python \
        build-nocuda/bin/shoalrun -np 2 /usr/bin/python3 bench/runtime_rounds.py \
        examples/train/digits_mlp.py --epochs 1 --max-steps 40

The rounds include the few blocking calls of each epoch's evaluation (the loss mean), so
rounds/step slightly overstates the training steps' own.
"""
import os
import runpy
import sys

script = os.path.abspath(sys.argv[1])
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(script))
import common  # noqa: E402  (the example's helper module, patched before the example imports it)

_finish = common.Recorder.finish


def finish(self, model, final_metric):
    import shoal
    stats = shoal.async_stats()
    steps = max(1, len(self.step_s))
    kept = sorted(self.step_s[3:] or self.step_s)
    print("rank %d: rounds=%d full_rounds=%d cache_hits=%d tensors=%d collectives=%d steps=%d rounds_per_step=%.2f "
          "step_ms_median=%.2f cpu_ms_per_step=%.2f" % (
              self.dist.rank, stats["cycles"], stats["full_rounds"], stats["cache_hits"], stats["tensors"],
              stats["groups"], len(self.step_s), stats["cycles"] / steps, 1e3 * kept[len(kept) // 2],
              1e3 * sum(self.cpu_s) / max(1, len(self.cpu_s))), flush=True)
    return _finish(self, model, final_metric)


common.Recorder.finish = finish
runpy.run_path(script, run_name="__main__")
