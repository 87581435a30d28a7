"""privacy.dpsgd's fast samplers reach only the models made private with them; stock Opacus is left as it was.

The process-wide checks run in a fresh interpreter (``python -c``) so that Opacus is imported, and its
registries snapshot, before anything imports privacy.dpsgd (in the pytest process it already is).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[2]

# Snapshot of Opacus' process-wide state: every global of every loaded opacus module and every attribute
# of the classes they define (by object identity), and the sampler / validator registries entry by entry.
_STATE = textwrap.dedent("""
    import json, sys, types

    def opacus_state():
        from opacus.grad_sample import GradSampleHooks, GradSampleHooksFastGradientClipping
        from opacus.validators import ModuleValidator

        state = {}
        for name, mod in list(sys.modules.items()):
            if name != "opacus" and not name.startswith("opacus."):
                continue
            for key, value in vars(mod).items():
                if isinstance(value, types.ModuleType):
                    continue  # a submodule imported later appears as an attribute of its package
                state[f"{name}.{key}"] = id(value)
                if isinstance(value, type) and value.__module__ == name:
                    for attr, member in vars(value).items():
                        state[f"{name}.{key}.{attr}"] = id(member)
        tables = {"GRAD_SAMPLERS": GradSampleHooks.GRAD_SAMPLERS,
                  "FGC_GRAD_SAMPLERS": GradSampleHooksFastGradientClipping.GRAD_SAMPLERS,
                  "NORM_SAMPLERS": GradSampleHooksFastGradientClipping.NORM_SAMPLERS,
                  "VALIDATORS": ModuleValidator.VALIDATORS, "FIXERS": ModuleValidator.FIXERS}
        for table, entries in tables.items():
            for cls, fn in entries.items():
                state[f"{table}[{cls.__module__}.{cls.__qualname__}]"] = f"{fn.__module__}.{fn.__qualname__}"
        return state

    def changed(before, after):
        return sorted(k for k in before.keys() & after.keys() if before[k] != after[k]) + sorted(
            f"new: {k}" for k in after.keys() - before.keys() if "SAMPLERS[" in k or k.startswith(("VALI", "FIX")))
""")


def _run(code: str) -> dict:
    """Run ``code`` in a fresh interpreter at the repository root; it prints one JSON line last."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", _STATE + textwrap.dedent(code)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_importing_privacy_dpsgd_changes_nothing_in_opacus():
    out = _run("""
        import opacus
        before = opacus_state()
        import importlib, pkgutil
        import privacy.dpsgd
        for m in pkgutil.iter_modules(getattr(privacy.dpsgd, "__path__", [])):
            importlib.import_module(f"privacy.dpsgd.{m.name}")
        after = opacus_state()
        # the snapshot does see a registration (so an empty diff means something)
        from opacus.grad_sample import register_grad_sampler
        from timm.layers import GroupNormAct
        register_grad_sampler(GroupNormAct)(lambda layer, activations, backprops: {})
        print(json.dumps({"changed": changed(before, after), "entries": len(before),
                          "detects": changed(after, opacus_state())}))
    """)
    assert out["changed"] == []
    assert out["entries"] > 1000
    assert out["detects"] == ["new: FGC_GRAD_SAMPLERS[timm.layers.norm_act.GroupNormAct]",
                              "new: GRAD_SAMPLERS[timm.layers.norm_act.GroupNormAct]"]


def test_stock_opacus_in_the_same_process_is_untouched_by_a_model_made_private_with_fast_samplers():
    """Model A through privacy.dpsgd.make_private (fast samplers, hooks and ghost, one step each), then model B
    through a fresh stock ``opacus.PrivacyEngine``: B gets Opacus' own class, registries and store function."""
    out = _run("""
        import warnings
        warnings.simplefilter("ignore")
        import opacus
        import opacus.grad_sample.grad_sample_module as gsm_mod
        import opacus.grad_sample.grad_sample_module_fast_gradient_clipping as fgc_mod
        before = opacus_state()
        stock_store = (gsm_mod.create_or_accumulate_grad_sample, fgc_mod.create_or_accumulate_grad_sample)
        import torch
        from opacus.grad_sample import GradSampleHooks, GradSampleHooksFastGradientClipping as FgcHooks
        from timm.layers import GroupNormAct
        from torch import nn
        from privacy.dpsgd import ghost_clipping_backward, make_private

        def model():
            torch.manual_seed(0)
            return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), GroupNormAct(4, num_groups=2, inplace=False),
                                 nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3))

        x, y = torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 2, 0])
        res = {"fast": [], "stock": []}
        for mode in ("hooks", "ghost"):
            a = model()
            pt = make_private(a, torch.optim.SGD(a.parameters(), lr=0.1), 4, 4, noise_multiplier=1.0,
                              max_grad_norm=1.0, grad_sample_mode=mode, poisson_sampling=False)
            if mode == "ghost":
                xi = x.clone().requires_grad_(True)
                ghost_clipping_backward(pt.model, nn.functional.cross_entropy(pt.model(xi), y, reduction="none"), xi)
            else:
                pt.criterion(pt.model(x), y).backward()
            pt.optimizer.step()
            res["fast"].append([type(pt.model).__name__, hasattr(a[1], "ft_compute_sample_grad")])
        for mode in ("hooks", "ghost"):
            b = model()
            loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=4)
            out = opacus.PrivacyEngine().make_private(
                module=b, optimizer=torch.optim.SGD(b.parameters(), lr=0.1), data_loader=loader,
                criterion=nn.CrossEntropyLoss(), noise_multiplier=1.0, max_grad_norm=1.0, grad_sample_mode=mode)
            wrapped, opt, crit = out[0], out[1], out[2] if mode == "ghost" else nn.CrossEntropyLoss()
            crit(wrapped(x), y).backward()
            opt.step()
            res["stock"].append([type(wrapped).__name__, hasattr(b[1], "ft_compute_sample_grad"),
                                 wrapped.GRAD_SAMPLERS is GradSampleHooks.GRAD_SAMPLERS,
                                 mode == "hooks" or wrapped.NORM_SAMPLERS is FgcHooks.NORM_SAMPLERS,
                                 wrapped.GRAD_SAMPLERS[nn.Conv2d].__qualname__])
        res["store_is_opacus"] = [gsm_mod.create_or_accumulate_grad_sample is stock_store[0],
                                  fgc_mod.create_or_accumulate_grad_sample is stock_store[1]]
        res["changed"] = changed(before, opacus_state())
        print(json.dumps(res))
    """)
    # A: our classes; GroupNormAct has our sampler, so Opacus prepared no functorch fallback for it
    assert out["fast"] == [["FastGradSampleModule", False], ["FastGhostClippingModule", False]]
    # B: Opacus' classes and tables; GroupNormAct is not in Opacus' registry, so it falls back to functorch
    assert out["stock"] == [["GradSampleModule", True, True, True, "compute_conv_grad_sample"],
                            ["GradSampleModuleFastGradientClipping", True, True, True, "compute_conv_grad_sample"]]
    assert out["store_is_opacus"] == [True, True]
    assert out["changed"] == []


# Opacus sources that privacy/dpsgd/grad_sample.py and engine.py mirror or rely on (the capture_backprops_hook
# overrides copy Opacus 1.6's with one change, the store; the copy-free optimizer mirrors add_noise / accumulate),
# through privacy/dpsgd/opacus_adapter.py: (module, attribute) -> sha256 of the dedented source, 16 hex digits.
_GSM, _FGC = "opacus.grad_sample.grad_sample_module", "opacus.grad_sample.grad_sample_module_fast_gradient_clipping"
_OPT, _OFGC = "opacus.optimizers.optimizer", "opacus.optimizers.optimizer_fast_gradient_clipping"
PINNED_OPACUS_SOURCES = {
    (_OPT, "_check_processed_flag"): "cda9cba61a6691e1",
    (_OPT, "_mark_as_processed"): "ad66ff8bdcd4e049",
    (_OPT, "DPOptimizer._check_skip_next_step"): "c73cbcc24988f796",  # reads _step_skip_queue as the adapter does
    (_OFGC, "DPOptimizerFastGradientClipping.add_noise"): "3b2dd84dae60ac98",  # the copy-free add_noise mirrors it
    (_OFGC, "DPOptimizerFastGradientClipping.accumulate"): "a25cc598a9d27099",
    (_GSM, "GradSampleHooks.capture_backprops_hook"): "e0394d58c29eeda7",
    (_GSM, "GradSampleHooks.add_hooks"): "de548c12e867ccbe",  # hooks self.capture_backprops_hook, i.e. ours
    (_GSM, "create_or_accumulate_grad_sample"): "473937338191170b",  # what store_grad_sample replaces
    (_GSM, "promote_current_grad_sample"): "cfc497273ac218e4",
    (_FGC, "GradSampleHooksFastGradientClipping.capture_backprops_hook"): "d7d57580f0d26d92",
    (_FGC, "create_norm_sample"): "5af41debea820c9b",
}


@pytest.mark.parametrize("module_name, attribute", sorted(PINNED_OPACUS_SOURCES),
                         ids=[a for _, a in sorted(PINNED_OPACUS_SOURCES)])
def test_opacus_internals_mirrored_by_the_fast_modules_are_unchanged(module_name, attribute):
    import importlib

    import opacus

    obj = importlib.import_module(module_name)
    for part in attribute.split("."):
        obj = getattr(obj, part)
    digest = hashlib.sha256(textwrap.dedent(inspect.getsource(obj)).encode()).hexdigest()[:16]
    assert digest == PINNED_OPACUS_SOURCES[(module_name, attribute)], (
        f"Opacus {opacus.__version__} changed {module_name}.{attribute}: re-check FastGradSampleModule / "
        "FastGhostClippingModule / CopyFreeFastGradientClippingOptimizer / privacy/dpsgd/opacus_adapter.py against it, "
        "then update the pin and the adapter's gate")


def test_copy_free_store_agrees_with_opacus_store():
    """Full batch, short batch (zero-padded), and accumulation onto either: same tensors as Opacus' store."""
    from opacus.grad_sample import create_or_accumulate_grad_sample

    from privacy.dpsgd import store_grad_sample

    g = torch.Generator().manual_seed(0)
    full, short, more = (torch.randn(n, 2, 3, generator=g) for n in (4, 3, 4))
    for sequence in ([full], [short], [full, short], [short, full], [full, more]):
        ours, theirs = nn.Parameter(torch.zeros(2, 3)), nn.Parameter(torch.zeros(2, 3))
        for gs in sequence:
            store_grad_sample(param=ours, grad_sample=gs, max_batch_len=4)
            create_or_accumulate_grad_sample(param=theirs, grad_sample=gs, max_batch_len=4)
        assert ours._current_grad_sample.shape == (4, 2, 3)
        torch.testing.assert_close(ours._current_grad_sample, theirs._current_grad_sample, rtol=0, atol=1e-7)
    frozen = nn.Parameter(torch.zeros(2, 3), requires_grad=False)
    store_grad_sample(param=frozen, grad_sample=full, max_batch_len=4)
    assert not hasattr(frozen, "_current_grad_sample")
    kept, full_before = nn.Parameter(torch.zeros(2, 3)), full.clone()
    store_grad_sample(param=kept, grad_sample=full, max_batch_len=4)
    assert kept._current_grad_sample is full  # the point of the store: no copy for a full batch
    store_grad_sample(param=kept, grad_sample=more, max_batch_len=4)
    assert torch.equal(full, full_before)  # accumulation is out of place: the sampler's tensor is not modified


def test_tied_weights_accumulate_per_sample_gradients():
    """A layer used twice in one forward: its two hook calls accumulate (store path with an existing buffer)."""
    from privacy.dpsgd import FastGradSampleModule

    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 3, 1)  # pointwise: our sampler
            self.head = nn.Linear(3, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.conv(torch.tanh(self.conv(x))).mean((2, 3)))

    torch.manual_seed(0)
    model = Tied()
    x, y = torch.randn(4, 3, 5, 5), torch.tensor([0, 1, 1, 0])
    ref = []
    for i in range(4):
        model.zero_grad()
        nn.functional.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
        ref.append([p.grad.clone() for p in model.parameters()])
    gsm = FastGradSampleModule(model, loss_reduction="sum")
    nn.functional.cross_entropy(gsm(x), y, reduction="sum").backward()
    for j, p in enumerate(model.parameters()):
        torch.testing.assert_close(p.grad_sample, torch.stack([r[j] for r in ref]), rtol=1e-4, atol=1e-6)
