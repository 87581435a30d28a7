"""flower_apps.common.local_training gives, bit for bit, what each study's own loop gave.

The old loops of dfl-dp (SGD, clipping, device), unlinkable-dfl (SGD) and tabular-pdp (Adam,
MSE, last-epoch loss) are copied here as they were; each is run beside the shared one on the
same tiny model, data and generator seed, and the weights and returned losses must be equal.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from flower_apps.common import local_training as dfl_train
from flower_apps.common.local_training import evaluate, run_epochs, train_local
from flower_apps.tabular_pdp import model as tabular_model
from flower_apps.unlinkable_dfl import node as udfl_node

CPU = torch.device("cpu")


def _old_dfl_dp_train(model, x, y, *, lr, momentum, weight_decay, batch_size, epochs, grad_clip, generator, device):
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    loss_fn = nn.CrossEntropyLoss()
    total, seen = 0.0, 0
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=generator)
        for start in range(0, len(x), batch_size):
            idx = order[start : start + batch_size]
            xb, yb = x[idx].to(device, non_blocking=True), y[idx].to(device, non_blocking=True)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(xb), yb)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            opt.step()
            total += float(loss.detach()) * len(idx)
            seen += len(idx)
    return total / max(seen, 1), seen


def _old_unlinkable_train(model, x, y, *, lr, momentum, weight_decay, batch_size, epochs, generator):
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    loss_fn = nn.CrossEntropyLoss()
    total, seen = 0.0, 0
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=generator)
        for s in range(0, len(x), batch_size):
            idx = order[s : s + batch_size]
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(idx)
            seen += len(idx)
    return total / max(seen, 1), seen


def _old_tabular_train(model, x, y, *, lr, batch_size, epochs, generator, device):
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    loss_fn = nn.MSELoss()
    x, y = x.to(device), y.to(device)
    n = len(y)
    last = float("nan")
    for _ in range(epochs):
        perm = torch.randperm(n, generator=generator).to(device)
        total = 0.0
        for i in range(0, n, batch_size):
            idx = perm[i : i + batch_size]
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(idx)
        last = total / n
    return last


@torch.no_grad()
def _old_evaluate(model, x, y, device, batch_size=2048):  # dfl-dp's (unlinkable-dfl's had no device)
    model.eval()
    correct, loss, loss_fn = 0, 0.0, nn.CrossEntropyLoss(reduction="sum")
    for s in range(0, len(x), batch_size):
        xb, yb = x[s : s + batch_size].to(device), y[s : s + batch_size].to(device)
        out = model(xb)
        loss += float(loss_fn(out, yb))
        correct += int((out.argmax(1) == yb).sum())
    return correct / len(x), loss / len(x)


def _data(n: int = 23, d: int = 5, classes: int = 3):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, d, generator=g), torch.randint(0, classes, (n,), generator=g)


def _classifier() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3))


def _same_weights(a: nn.Module, b: nn.Module) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


KW = {"lr": 0.1, "momentum": 0.9, "weight_decay": 5e-4, "batch_size": 4, "epochs": 3}


@pytest.mark.parametrize("grad_clip", [0.05, 10.0])
def test_dfl_dp_loop_is_unchanged(grad_clip):
    x, y = _data()
    old, new = _classifier(), _classifier()
    ro = _old_dfl_dp_train(old, x, y, **KW, grad_clip=grad_clip, generator=torch.Generator().manual_seed(5),
                           device=CPU)
    rn = dfl_train.train_local(new, x, y, **KW, grad_clip=grad_clip, generator=torch.Generator().manual_seed(5),
                               device=CPU)
    assert ro == rn and _same_weights(old, new)
    assert _old_evaluate(old, x, y, CPU, 7) == dfl_train.evaluate(new, x, y, CPU, 7)


def test_unlinkable_dfl_loop_is_unchanged():
    x, y = _data()
    old, new = _classifier(), _classifier()
    ro = _old_unlinkable_train(old, x, y, **KW, generator=torch.Generator().manual_seed(5))
    rn = udfl_node.train_local(new, x, y, **KW, generator=torch.Generator().manual_seed(5))
    assert ro == rn and _same_weights(old, new)
    assert _old_evaluate(old, x, y, CPU, 2048) == udfl_node.evaluate(new, x, y)


def test_tabular_pdp_loop_is_unchanged():
    x, _ = _data(n=19)
    y = x.sum(1) + 0.1
    old, new = tabular_model.build_model(3, 5), tabular_model.build_model(3, 5)
    kw = {"lr": 1e-2, "batch_size": 4, "epochs": 3, "device": CPU}
    ro = _old_tabular_train(old, x, y, **kw, generator=torch.Generator().manual_seed(9))
    rn = tabular_model.train_local(new, x, y, **kw, generator=torch.Generator().manual_seed(9))
    assert ro == rn and _same_weights(old, new)


def test_run_epochs_hand_checked_counts_and_losses():
    x, y = _data(n=10)
    model = _classifier()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: the loss is the same every epoch
    stats = run_epochs(model, x, y, opt, nn.CrossEntropyLoss(reduction="mean"), batch_size=10, epochs=2,
                       generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = float(nn.functional.cross_entropy(model(x), y))
    assert stats.examples == 20
    assert stats.last_epoch_loss == pytest.approx(expected) and stats.mean_loss == pytest.approx(expected)


def test_clipping_bounds_the_step_and_evaluate_counts_correct_predictions():
    x, y = _data(n=6)
    model = nn.Linear(5, 3, bias=False)
    before = model.weight.detach().clone()
    train_local(model, x, y, lr=1.0, momentum=0.0, weight_decay=0.0, batch_size=6, epochs=1,
                generator=torch.Generator().manual_seed(0), grad_clip=1e-3)
    assert float((model.weight - before).norm()) <= 1e-3 + 1e-9  # one SGD step of a clipped gradient
    with torch.no_grad():
        model.weight.copy_(torch.zeros(3, 5))
    acc, loss = evaluate(copy.deepcopy(model), x, y)
    assert acc == pytest.approx(float((y == 0).float().mean()))  # all-zero logits: argmax is class 0
    assert loss == pytest.approx(float(torch.log(torch.tensor(3.0))))
