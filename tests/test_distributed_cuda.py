"""carbon.distributed on the NCCL backend with one rank (scripts/device_check.sh
runs it on a GPU machine): the shape check and the collectives run on CUDA
tensors, and DDP with carbon.allreduce_hook trains to the same bits as the
model without DDP. Skipped without a GPU."""

from __future__ import annotations

import socket

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import carbon
import carbon.distributed as cd
from tests import distributed_worker as worker

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available() or not dist.is_nccl_available(),
                                 reason="needs a CUDA GPU and NCCL")]


@pytest.fixture(scope="module")
def nccl_group():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_one_rank_all_reduce_and_reduce_scatter_keep_the_values(nccl_group):
    x = worker.collective_input(0).cuda()
    for op in (cd.ReduceOp.SUM, cd.ReduceOp.AVG):
        t = x.clone()
        cd.all_reduce(t, op)
        assert torch.equal(t.view(torch.int32), x.view(torch.int32))
    out = torch.empty_like(x)
    cd.reduce_scatter(out, x, cd.ReduceOp.AVG)
    assert torch.equal(out.view(torch.int32), x.view(torch.int32))


def test_ddp_with_the_hook_equals_plain_training_on_cuda(nccl_group):
    def train(use_ddp: bool):
        model = worker.make_model().cuda()
        net = torch.nn.parallel.DistributedDataParallel(model) if use_ddp else model
        if use_ddp:
            net.register_comm_hook(None, carbon.allreduce_hook)
        opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
        for step in range(worker.STEPS):
            x, y = worker.batch(step, 0)
            with carbon.enabled():
                F.cross_entropy(net(x.cuda()), y.cuda()).backward()
                opt.step()
            opt.zero_grad()
        return {k: v.cpu() for k, v in model.state_dict().items()}
    plain, ddp = train(False), train(True)
    for k in plain:
        assert torch.equal(plain[k].view(torch.int32), ddp[k].view(torch.int32)), k
