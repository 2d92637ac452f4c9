"""Horovod's helper functions (horovod.torch.functions) over shoal."""
import io
import pickle

import torch

from .mpi_ops import broadcast_, broadcast_async_, rank, synchronize, allgather, _comm


def broadcast_parameters(params, root_rank):
    """Broadcasts a model's state_dict() or named_parameters() from root_rank, in place."""
    if isinstance(params, dict):
        params = sorted(params.items())
    elif isinstance(params, list):
        params = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        try:
            params = list(params)
        except TypeError:
            raise ValueError("invalid params of type: %s" % type(params)) from None
    handles = []
    for i, (name, p) in enumerate(params):
        if p is None:
            continue
        if not isinstance(p, torch.Tensor):
            raise ValueError("broadcast_parameters: %s is a %s, not a tensor" % (name or i, type(p).__name__))
        key = "broadcast_parameters.%s" % (name if name is not None else i)
        handles.append(broadcast_async_(p.data if p.requires_grad else p, root_rank, key))
    for handle in handles:
        synchronize(handle)


def broadcast_object(obj, root_rank=0, name=None, process_set=None):
    """Pickles obj on root_rank (a global rank, in process_set when one is given) and returns it:
    the root gets obj itself, the other ranks an unpickled copy (as Horovod's)."""
    name = name or type(obj).__name__
    if rank() == root_rank:
        buffer = io.BytesIO()
        torch.save(obj, buffer, pickle_module=pickle)
        data = torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)
        length = torch.tensor([data.numel()], dtype=torch.int64)
    else:
        length = torch.zeros(1, dtype=torch.int64)
    broadcast_(length, root_rank, name="broadcast_object.%s.size" % name, process_set=process_set)
    if rank() != root_rank:
        data = torch.zeros(int(length), dtype=torch.uint8)
    broadcast_(data, root_rank, name="broadcast_object.%s.data" % name, process_set=process_set)
    return obj if rank() == root_rank else _unpickle(data)


def _unpickle(data):
    raw = bytes(memoryview(_as_bytes(data)))
    return torch.load(io.BytesIO(raw), pickle_module=pickle)


def _as_bytes(data):
    """A uint8 tensor's bytes without tensor.numpy() (which ties torch to numpy's ABI)."""
    import ctypes
    return (ctypes.c_uint8 * data.numel()).from_address(data.data_ptr())


def allgather_object(obj, name=None):
    """Pickles obj on every rank and returns the list of every rank's object."""
    buffer = io.BytesIO()
    torch.save(obj, buffer, pickle_module=pickle)
    data = torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)
    gathered = _comm().allgatherv(data)
    sizes = allgather(torch.tensor([data.numel()], dtype=torch.int64), name="allgather_object.%s.sizes"
                      % (name or type(obj).__name__))
    out, offset = [], 0
    for n in sizes.tolist():
        out.append(_unpickle(gathered[offset:offset + n].contiguous()))
        offset += n
    return out


def broadcast_optimizer_state(optimizer, root_rank, model=None):
    """Makes every rank's optimizer state (state and param_groups' hyperparameters) root_rank's."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    state = broadcast_object(optimizer.state_dict(), root_rank, name="broadcast_optimizer_state")
    if rank() != root_rank:
        optimizer.load_state_dict(state)
