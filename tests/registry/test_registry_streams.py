"""registry.streams: refusals, and draws bit-identical to the inline expressions the code used before.

The ``old`` expressions below are copied from the call sites as they were before the registry
(``np.random.default_rng([seed, tag])`` and the seed arithmetic); the published numbers were drawn
from them, so a stream that draws anything else changes a study's results.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from registry import streams
from registry.streams import ClientSeed, Offset, Scaled, Stream, StreamRegistry


def _same(a: np.random.Generator, b: np.random.Generator) -> bool:
    return bool(np.array_equal(a.integers(0, 2**62, 16), b.integers(0, 2**62, 16)))


# --- refusals (a fresh registry: the platform's own is not touched)

def test_a_taken_name_is_refused_and_the_same_declaration_again_is_a_no_op():
    reg = StreamRegistry()
    s = reg.register(Stream("study-a.split", ("seed", 1)))
    assert reg.register(Stream("study-a.split", ("seed", 1), doc="re-imported")) is s
    with pytest.raises(ValueError, match="'study-a.split' is already registered"):
        reg.register(Stream("study-a.split", ("seed", 2)))


def test_two_names_with_one_tag_are_refused_where_they_can_meet():
    reg = StreamRegistry()
    reg.register(Stream("study-a.split", ("seed", 1)))
    with pytest.raises(ValueError, match="key of 'study-a.split'"):
        reg.register(Stream("study-a.subset", ("seed", 1)))  # same study: same generator for two purposes
    reg.register(Stream("datasets.x", ("seed", 4)))
    with pytest.raises(ValueError, match="key of 'datasets.x'"):
        reg.register(Stream("study-b.y", ("seed", 4)))  # a shared stream meets every study
    with pytest.raises(ValueError, match="key of 'study-a.split'"):
        reg.register(Stream("study-a.per-seed", (1, "seed")))  # [1, seed] is [seed, 1] at seed 1
    with pytest.raises(ValueError, match="key of 'study-a.split'"):
        reg.register(Stream("study-a.untagged", ("seed", "client")))  # [seed, client] is [seed, 1] at client 1
    reg.register(Stream("study-a.tag-first", (2, "seed")))  # [2, seed] = [seed, 1] needs seed 2 and seed 1
    reg.register(Stream("study-b.split", ("seed", 1)))  # two studies never share a run
    reg.register(Stream("study-a.per-client", ("seed", "client", 1)))  # another key length: other keys
    reg.register(Stream("study-a.refs", ("seed", 1), kind="spawn"))  # SeedSequence children, not its stream


def test_legacy_derivations_and_declared_overlaps():
    reg = StreamRegistry()
    reg.register(Stream("study-a.aug", kind="int", derive=Offset(7)))
    with pytest.raises(ValueError, match="key of 'study-a.aug'"):
        reg.register(Stream("study-a.aug2", kind="int", derive=Offset(7)))
    reg.register(Stream("study-a.noise", kind="int", derive=Scaled(1000, "victim")))
    with pytest.raises(ValueError, match="key of 'study-a.noise'"):  # the field's name is not the numbers
        reg.register(Stream("study-a.noise2", kind="int", derive=Scaled(1000, "image")))
    reg.register(Stream("study-a.noise2", kind="int", derive=Scaled(1000, "image"), shares=("study-a.noise",)))
    with pytest.raises(ValueError, match="shares 'study-a.nope', which is not registered"):
        reg.register(Stream("study-a.x", ("seed", 9), shares=("study-a.nope",)))


@pytest.mark.parametrize("bad, match", [
    (lambda: Stream("nodot", ("seed", 1)), "'<scope>.<purpose>'"),
    (lambda: Stream("a.b", (1, 2)), "names 'seed' once"),
    (lambda: Stream("a.b", ("seed", "seed", 1)), "names 'seed' once"),
    (lambda: Stream("a.b", ("seed", "c", "c")), "distinct names"),
    (lambda: Stream("a.b", ("seed", True)), "distinct names or int tags"),
    (lambda: Stream("a.b", kind="int"), "has a derivation"),
    (lambda: Stream("a.b", ("seed",), kind="int", derive=Offset(1)), "no key template"),
])
def test_malformed_declarations_are_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        bad()


def test_lookups_check_the_name_kind_and_fields():
    with pytest.raises(KeyError, match="unknown random stream 'datasets.nope'"):
        streams.rng("datasets.nope", 0)
    with pytest.raises(TypeError, match=r"takes seed and \['victim'\], got 1 values"):
        streams.rng("attacks.victim-candidates", 0)
    with pytest.raises(TypeError, match="not an rng stream"):
        streams.rng("attacks.lira-references", 0)
    with pytest.raises(TypeError, match="use seed_int / torch_generator"):
        streams.stream("clients.sgd").seed_key(0, 1, 2)
    with pytest.raises(TypeError, match="use rng / spawn"):
        streams.seed_int("datasets.partition", 0)
    with pytest.raises(TypeError):
        streams.rng("datasets.partition", 1.5)  # a float seed is an error, not silently truncated


def test_every_platform_stream_is_documented_and_the_secret_ones_are_listed_apart():
    from privacy import randomness
    from privacy.audit.canaries import STREAM_AUDIT_CANARIES
    from privacy.sampling import STREAM_CLIENT_SAMPLING

    assert all(s.doc for s in streams.STREAMS.values())
    assert streams.NOISE_STREAMS == {"matched-perturbation": randomness.STREAM_MATCHED_PERTURBATION,
                                     "tabular-server": randomness.STREAM_TABULAR_SERVER,
                                     "dpsgd": randomness.STREAM_DPSGD, "audit-canaries": STREAM_AUDIT_CANARIES,
                                     "client-sampling": STREAM_CLIENT_SAMPLING}
    assert len(set(streams.NOISE_STREAMS.values())) == len(streams.NOISE_STREAMS)  # no two secret streams share a label


# --- the same numbers as the old inline expressions

RNG_CASES = [  # (stream, seed, extra, the old key written out by hand)
    ("datasets.partition", 5, (), [5, 3]),
    ("datasets.test-split", 0, (), [0, 7]),  # datasets/busi.py: [TEST_SPLIT_SEED, 7]
    ("attacks.victim-candidates", 3, (2,), [3, 2, 14]),
    ("tabular-pdp.client-table", 2015, (4,), [2015, 4]),  # flower_apps/tabular_pdp/data.py: [GENERATOR_SEED, cid]
    ("tabular-pdp.client-split", 1, (4,), [1, 4, 80]),
    ("ultrasound.audit-canaries", 9, (), [0xA0D17, 9]),
    ("ultrasound.audit-steps", 9, (3,), [0xA0D17, 9, 2, 3]),
    ("unlinkable-dfl.eval-order", 0, (), [0, 5]),
    ("unlinkable-dfl.byzantine-values", 2**40, (3, 1), [2**40, 3, 1, 3]),
]


@pytest.mark.parametrize("name, seed, extra, old", RNG_CASES)
def test_rng_streams_draw_what_the_inline_calls_drew(name, seed, extra, old):
    assert streams.stream(name).seed_key(seed, *extra) == old
    assert _same(streams.rng(name, seed, *extra), np.random.default_rng(old))


def test_the_callers_draw_what_they_drew():
    from attacks.inversion.registry import restart_seeds
    from attacks.membership.lira import reference_subsets
    from datasets.image_plan import DATA_PARTS
    from flower_apps.dfl_dp.victims import victim_clients

    assert victim_clients(4, 50, 5) == sorted(int(c) for c in np.random.default_rng([4, 17]).choice(50, 5, replace=False))
    assert restart_seeds(8, 3) == [int(s.generate_state(1)[0]) for s in np.random.SeedSequence(8).spawn(3)]
    old = [np.sort(np.random.default_rng(s).choice(40, size=10, replace=False))
           for s in np.random.SeedSequence([6, 17]).spawn(3)]
    assert all(np.array_equal(a, b) for a, b in zip(reference_subsets(40, 3, 0.25, 6), old))
    for part, tag in (("target", 3), ("shadow", 5)):  # the image plan's partition streams
        assert _same(streams.rng(DATA_PARTS[part], 11), np.random.default_rng([11, tag]))


def test_shadow_balancing_children_are_the_old_ones():
    new = [np.random.default_rng(s) for s in streams.spawn("attacks.shadow-balance", 7, 4)]
    old = [np.random.default_rng(s) for s in np.random.SeedSequence(7).spawn(4)]
    assert all(_same(a, b) for a, b in zip(new, old))


@pytest.mark.parametrize("name, seed, extra, old", [
    ("ultrasound.augmentation", 123, (), 123 + 7),  # flower_apps/ultrasound/train.py: seed + 7
    ("ultrasound.batches", 123, (), 123),
    ("dfl-dp.inversion-noise", 4, (17,), 4 * 1000 + 17),  # flower_apps/dfl_dp/attack_eval.py
    ("ultrasound.inversion-noise", 4, (2,), 4 * 1000 + 2),  # flower_apps/ultrasound/attacks.py
    ("ultrasound.client", 10**9, (500, 3), ((10**9 * 1_000_003 + 500) * 10_007 + 3) % 2**62),
])
def test_legacy_seed_arithmetic_lives_in_the_registry_with_its_old_numbers(name, seed, extra, old):
    assert streams.seed_int(name, seed, *extra) == old
    g, h = streams.torch_generator(name, seed, *extra), torch.Generator().manual_seed(old)
    assert torch.equal(torch.randperm(30, generator=g), torch.randperm(30, generator=h))


def test_client_seed_derivation_by_hand():
    assert ClientSeed()(2, 3, 4) == (2 * 1_000_003 + 3) * 10_007 + 4
    assert ClientSeed(1_000_003, 2**63)(2, 3, 4) == ((2 * 1_000_003 + 3) * 1_000_003 + 4) % 2**63
