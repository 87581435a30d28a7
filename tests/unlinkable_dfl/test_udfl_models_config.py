"""Model registry, shareable-state layout, payload table and config validation."""

import numpy as np
import pytest
import torch

from flower_apps.config import ConfigError
from flower_apps.router import prepare
from flower_apps.unlinkable_dfl.models import MODELS, build_model, load_vector, shareable_keys, state_vector
from flower_apps.unlinkable_dfl.node import choose_sends, fragment_layout
from flower_apps.unlinkable_dfl.payload import MODEL_INPUTS


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_model_round_trips_through_its_flat_state(name):
    c, size = MODEL_INPUTS.get(name, (3, 32))
    model = build_model(name, 0, c, 10, size)
    keys = shareable_keys(model)
    vec = state_vector(model.state_dict(), keys)
    state = load_vector(model.state_dict(), keys, vec + 1)
    assert np.array_equal(state_vector(state, keys), vec + 1)
    assert fragment_layout(len(vec), 10_240, "q8").count * 4 >= fragment_layout(len(vec), 10_240, "float32").count
    with pytest.raises(ValueError, match="too short"):
        load_vector(model.state_dict(), keys, vec[:-1])
    with pytest.raises(ValueError, match="shareable state"):
        load_vector(model.state_dict(), keys, np.concatenate([vec, vec[:1]]))


def test_lenet5_is_the_variant_with_the_papers_fragment_counts():
    model = build_model("lenet5", 0)
    n = len(state_vector(model.state_dict(), shareable_keys(model)))
    assert n == 61_706
    assert fragment_layout(n, 10_240, "float32").count == 26 and fragment_layout(n, 10_240, "q8").count == 7
    assert model(torch.zeros(2, 1, 28, 28)).shape == (2, 10)
    assert build_model("lenet5", 0, 3, 10, 32)(torch.zeros(2, 3, 32, 32)).shape == (2, 10)


def test_same_seed_same_initial_model():
    a, b = build_model("lenet5", 3), build_model("lenet5", 3)
    keys = shareable_keys(a)
    assert np.array_equal(state_vector(a.state_dict(), keys), state_vector(b.state_dict(), keys))
    assert not np.array_equal(state_vector(build_model("lenet5", 4).state_dict(), keys),
                              state_vector(a.state_dict(), keys))


def test_selective_transmission_sends_ceil_r_f_distinct_fragments_per_neighbour():
    sends = choose_sends([3, 5], 7, 0.25, np.random.default_rng(0))
    per = {d: sorted(i for dd, i in sends if dd == d) for d in (3, 5)}
    assert all(len(v) == 2 and len(set(v)) == 2 for v in per.values())  # ceil(0.25 * 7) = 2
    assert len(choose_sends([1], 7, 1.0, np.random.default_rng(0))) == 7


def test_presets_validate_and_paper_defaults():
    _, cfg = prepare({"study": "unlinkable-dfl"})
    assert (cfg.num_nodes, cfg.num_rounds, cfg.dataset, cfg.alpha, cfg.degree, cfg.topology) == \
        (32, 10, "mnist", 10.0, 4, "circulant")
    assert (cfg.max_hops, cfg.outbox, cfg.mu, cfg.transport, cfg.encoding) == (2, 100, 0.1, "mixnet", "q8")
    for preset in ("smoke", "reduced"):
        prepare({"study": "unlinkable-dfl", "preset": preset})


@pytest.mark.parametrize("bad, key, allowed", [
    ({"udfl-aggregator": "median"}, "udfl-aggregator", "krum"),
    ({"udfl-share-ratio": 0.0}, "udfl-share-ratio", "(0, 1]"),
    ({"udfl-topology": "ring"}, "udfl-topology", "circulant"),
    ({"udfl-degree": 3}, "udfl-degree", "even"),
    ({"udfl-model": "squeezenet"}, "udfl-model", "cifar10"),
    ({"udfl-max-hops": 6}, "udfl-max-hops", "[1, 5]"),
    ({"udfl-byzantine-fraction": 0.5}, "udfl-byzantine-fraction", "[0, 0.5)"),
    ({"udfl-mode": "central"}, "udfl-mode", "baseline"),
    ({"udfl-curious-node": 40}, "udfl-curious-node", "num-clients"),
])
def test_invalid_config_names_key_and_allowed_values(bad, key, allowed):
    with pytest.raises(ConfigError) as err:
        prepare({"study": "unlinkable-dfl", **bad})
    assert key in str(err.value) and allowed in str(err.value)
