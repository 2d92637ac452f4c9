"""Pufferfish: train pre-factorized layers after a full-rank warm-up (DESIGN.md §7.3).

    model, names = shoal.torch.pufferfish.factorize_model(model, rank_factor=4,
                                                          skip=("conv1", "fc"))
    optimizer = torch.optim.SGD(model.parameters(), ...)      # new parameters: a new optimizer
    ...
    loss.backward()
    shoal.torch.pufferfish.allreduce_gradients(model)         # every gradient in ONE allreduce
    optimizer.step()

factorize_model replaces each chosen nn.Linear / nn.Conv1d / nn.Conv2d (groups=1)
by two layers whose weights come from shoal_lowrank_factorize (a truncated SVD,
W ~= U' V'^T) at the rank shoal_lowrank_rank gives: min(out, in*k...) // rank_factor.
Rank 0 factorizes and broadcasts, so every rank holds identical bits.
"""
import copy

import torch

import shoal

_KINDS = (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d)


def _skipped(name, skip):
    return any(name == s or name.startswith(s + ".") for s in skip)


def _replacement(module, u, v, r):
    """The two factor layers for module, with weights U' [out, r] and V' [cols, r]."""
    with torch.no_grad():
        if isinstance(module, torch.nn.Linear):
            first = torch.nn.Linear(module.in_features, r, bias=False)
            second = torch.nn.Linear(r, module.out_features, bias=module.bias is not None)
            first.weight.copy_(v.t())
            second.weight.copy_(u)
        else:
            conv = type(module)
            kernel = module.weight.shape[2:]
            first = conv(module.in_channels, r, module.kernel_size, stride=module.stride, padding=module.padding,
                         dilation=module.dilation, bias=False, padding_mode=module.padding_mode)
            second = conv(r, module.out_channels, 1, bias=module.bias is not None)
            first.weight.copy_(v.t().reshape(r, module.in_channels, *kernel))
            second.weight.copy_(u.reshape(module.out_channels, r, *([1] * len(kernel))))
        if module.bias is not None:
            second.bias.copy_(module.bias)
    return torch.nn.Sequential(first, second).to(dtype=module.weight.dtype)


def factorize_model(model, rank_factor=4, skip=(), min_rank=1, root_rank=0):
    """A copy of model with every chosen layer replaced by its factor pair, and a name map
    {layer name: (first factor's name, second factor's name)}.

    Chosen: nn.Linear, nn.Conv1d, nn.Conv2d with groups == 1, not named in skip (a name or
    its prefix: typically the first layer, the last layer and shortcuts), and whose factors
    hold fewer parameters than the weight. Collective when shoal is initialized: every rank
    must call it with the same model structure."""
    if rank_factor < 1 or min_rank < 1:
        raise ValueError("factorize_model: rank_factor and min_rank must be >= 1")
    comm = shoal.communicator() if shoal.is_initialized() else None
    new = copy.deepcopy(model)
    names = {}
    for name, module in list(new.named_modules()):
        if not isinstance(module, _KINDS) or _skipped(name, skip) or getattr(module, "groups", 1) != 1:
            continue
        weight = module.weight.detach()
        rows, cols = weight.shape[0], weight[0].numel()
        r = min(max(shoal.rank_for(rows, cols, rank_factor), min_rank), rows, cols)
        if r * (rows + cols) >= rows * cols:
            continue  # no saving: leave it full rank
        matrix = weight.reshape(rows, cols).to(torch.float32).contiguous()
        u = torch.zeros(rows, r, dtype=torch.float32)
        v = torch.zeros(cols, r, dtype=torch.float32)
        if comm is None or comm.rank == root_rank:
            u_np, v_np, _ = shoal.factorize(matrix, r)
            u.copy_(torch.from_dlpack(u_np) if hasattr(torch, "from_dlpack") else torch.tensor(u_np))
            v.copy_(torch.from_dlpack(v_np) if hasattr(torch, "from_dlpack") else torch.tensor(v_np))
        if comm is not None and comm.size > 1:
            comm.broadcast(u, root=root_rank, out=u)
            comm.broadcast(v, root=root_rank, out=v)
        pair = _replacement(module, u, v, r)
        if comm is not None and comm.size > 1 and module.bias is not None:
            comm.broadcast(pair[1].bias.data, root=root_rank, out=pair[1].bias.data)
        parent_name, _, child = name.rpartition(".")
        parent = new.get_submodule(parent_name) if parent_name else new
        setattr(parent, child, pair)
        names[name] = (name + ".0", name + ".1")
    return new, names


def switch_epoch(total_epochs, warmup_fraction=0.25):
    """The epoch at which to factorize: full rank for the first warmup_fraction of training
    (Pufferfish used 80 of 300 CIFAR epochs, 15 of 90 on ImageNet)."""
    if not 0 <= warmup_fraction <= 1:
        raise ValueError("switch_epoch: warmup_fraction must be in [0, 1], got %r" % (warmup_fraction,))
    return int(round(total_epochs * warmup_fraction))


def allreduce_gradients(model, op="avg"):
    """Averages every parameter gradient of model over all ranks in ONE uncompressed collective
    (shoal_fused_allreduce), in place. Parameters without a gradient get zeros first, so every
    rank passes the same list."""
    grads = []
    for p in model.parameters():
        if not p.requires_grad:
            continue
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        if not p.grad.is_contiguous():
            p.grad = p.grad.contiguous()
        grads.append(p.grad)
    by_dtype = {}
    for g in grads:
        by_dtype.setdefault(g.dtype, []).append(g)
    for dtype in sorted(by_dtype, key=str):  # one call per dtype, in the same order on every rank
        shoal.fused_allreduce(by_dtype[dtype], op=op)
    return grads
