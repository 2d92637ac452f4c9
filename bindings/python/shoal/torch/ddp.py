"""A DDP communication hook that allreduces gradients through shoal.

    dist.init_process_group("gloo", ...)        # DDP still needs its process group (init sync, buckets)
    shoal.init()                                # or hvd.init(): the same ranks
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    state = shoal.torch.ddp.State(model)        # names the parameters; checkpointable
    ddp.register_comm_hook(state, shoal.torch.ddp.hook(hvd.Compression.powersgd(rank=2)))

Each gradient of a bucket becomes its own named shoal request (the parameter's
name), so compressors see real shapes and keep their state (error feedback,
warm starts) by name, whatever bucket DDP puts the parameter in. The first
`dense_steps` steps go uncompressed, while DDP rebuilds its buckets. The hook
returns at once; a worker thread waits for the requests and completes the
future, so communication overlaps the rest of backward.
"""
import queue
import threading

import torch

import shoal
from shoal import ShoalError

from .compression import Compression


class State:
    """The hook's state: parameter names, the step count, and checkpoints of the compressor state."""

    def __init__(self, model=None, named_parameters=None, dense_steps=2):
        if named_parameters is None and model is not None:
            named_parameters = model.named_parameters()
        self.names = {p: name for name, p in (named_parameters or [])}
        self.dense_steps = int(dense_steps)
        self.step = 0
        self._work = None
        self._compressors = set()

    def name_of(self, p, bucket_index, i):
        name = self.names.get(p)
        if name is None:  # without a model, the name follows DDP's bucket layout (stable once rebuilt)
            name = "bucket%d.%d" % (bucket_index, i)
        return "ddp." + name

    def _worker(self):
        if self._work is None:
            self._work = queue.Queue()
            threading.Thread(target=self._complete, daemon=True, name="shoal-ddp-hook").start()
        return self._work

    def _complete(self):
        while True:
            requests, future, buffer = self._work.get()
            try:
                shoal.wait_all(requests)
                future.set_result(buffer)
            except ShoalError as error:
                future.set_exception(error)

    def state_dict(self):
        """The step count and every named gradient's compressor state (error feedback, Q), as bytes."""
        comm = shoal.communicator()
        states = {}
        for compressor, options, name in sorted(self._compressors, key=lambda t: t[2]):
            saved = comm.compressor_state_save(compressor, name, compressor_options=options)
            if saved is not None:
                states[name] = (compressor, options, saved)
        return {"step": self.step, "compressor_state": states}

    def load_state_dict(self, state):
        self.step = int(state["step"])
        comm = shoal.communicator()
        for name, (compressor, options, saved) in state["compressor_state"].items():
            comm.compressor_state_load(compressor, name, saved, compressor_options=options)
            self._compressors.add((compressor, options, name))

    # DDP pickles the state for some checks; keep the worker out of it.
    def __getstate__(self):
        d = dict(self.__dict__)
        d["_work"] = None
        return d


def hook(compression=Compression.none):
    """A comm hook for DistributedDataParallel.register_comm_hook(state, hook(compression));
    state is a shoal.torch.ddp.State (or None: unnamed parameters, no checkpoints)."""
    fallback = State()

    def shoal_hook(state, bucket):
        state = state if isinstance(state, State) else fallback
        comm = shoal.communicator()
        requests = []
        for i, (p, grad) in enumerate(zip(bucket.parameters(), bucket.gradients())):
            if grad.numel() == 0:
                continue
            name = state.name_of(p, bucket.index(), i)
            if state.step < state.dense_steps:
                compressor, options = "none", None
            else:
                compressor, options = compression.shoal_compressor(grad)
                if compressor != "none":
                    state._compressors.add((compressor, options, name))
            requests.append(comm.iallreduce(grad, name, out=grad, op="avg", compressor=compressor,
                                            compressor_options=options))
        if bucket.is_last():
            state.step += 1
        future = torch.futures.Future()
        buffer = bucket.buffer()
        if not requests:
            future.set_result(buffer)
        else:
            # gradients() are views of buffer, so the in-place results land in it.
            state._worker().put((requests, future, buffer))
        return future

    return shoal_hook
