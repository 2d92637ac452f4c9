"""hvd.SyncBatchNorm: batch normalization whose statistics cover the whole global batch.

Written with shoal.torch's differentiable allreduce (op=Sum), so autograd derives the backward
pass: the gradient of every rank's loss reaches every rank's inputs through the allreduced sums,
as a BatchNorm over the concatenated batch would give. Takes CPU tensors (and CUDA tensors in a
CUDA build); Horovod's takes CUDA tensors only.
"""
import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from .mpi_ops import Sum, allreduce, size


class SyncBatchNorm(_BatchNorm):
    """Horovod's SyncBatchNorm (same arguments as torch.nn.BatchNorm*d): in training, the mean and
    variance are those of the global batch (every rank's, allreduced); in eval mode (with
    running statistics) it is a plain BatchNorm with them."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError("expected at least 2D input (got {}D input)".format(input.dim()))

    def forward(self, input):
        self._check_input_dim(input)
        factor = 0.0
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        if (not self.training and self.track_running_stats) or size() == 1:
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight, self.bias,
                                self.training or not self.track_running_stats, factor, self.eps)
        return self._global_batch_norm(input, factor)

    def _global_batch_norm(self, x, factor):
        dims = [0] + list(range(2, x.dim()))
        shape = [1, x.shape[1]] + [1] * (x.dim() - 2)
        count = allreduce(torch.tensor([x.numel() // x.shape[1]], dtype=torch.float64), op=Sum,
                          name="sync_batch_norm.count")
        n = float(count)
        mean = allreduce(x.sum(dims), op=Sum) / n
        centered = x - mean.reshape(shape)
        var = allreduce(centered.pow(2).sum(dims), op=Sum) / n
        out = centered * torch.rsqrt(var + self.eps).reshape(shape)
        if self.weight is not None:
            out = out * self.weight.reshape(shape) + self.bias.reshape(shape)
        if self.training and self.track_running_stats:
            with torch.no_grad():
                self.running_mean.mul_(1 - factor).add_(mean.detach(), alpha=factor)
                unbiased = var.detach() * (n / (n - 1)) if n > 1 else var.detach()
                self.running_var.mul_(1 - factor).add_(unbiased, alpha=factor)
        return out
