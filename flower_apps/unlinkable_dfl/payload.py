"""Experiment 3's payload table: fragments and bytes per update for each model and encoding.

For each registered model (randomly initialised, 10 classes) and each encoding, the
table gives the shareable values, the values per fragment, the fragments per update,
the encoded bytes (measured: the model's initial state run through the real encoder),
and per node and round with ``degree`` neighbours and share ratio 1: data packets,
meaningful packets (data + acknowledgements, one ack per fragment received), and the
bytes those packets put on the wire (every packet is padded to the Sphinx size).
"""

from __future__ import annotations

import numpy as np

from flower_apps.unlinkable_dfl.models import MODELS, build_model, shareable_keys, state_vector
from flower_apps.unlinkable_dfl.node import encode_state, fragment_layout
from mixnet.constants import PacketFormat

MODEL_INPUTS = {"lenet5": (1, 28), "squeezenet": (3, 32), "mobilenetv2": (3, 32)}
ENCODING_LABEL = {"float32": "32-bit", "q8": "8-bit"}


def payload_rows(payload_size: int = 10_240, degree: int = 4, header_hops: int = 5, seed: int = 0) -> list[dict]:
    """One row per (model, encoding)."""
    frame = PacketFormat(header_hops, payload_size).packet_size + 1  # + the link frame's type byte
    rows = []
    for name in MODELS:
        channels, size = MODEL_INPUTS.get(name, (3, 32))
        model = build_model(name, seed, channels, 10, size)
        vector = state_vector(model.state_dict(), shareable_keys(model))
        for encoding in ("float32", "q8"):
            layout = fragment_layout(len(vector), payload_size, encoding)
            encoded = encode_state(vector, layout, 1, encoding, np.random.default_rng(seed))
            data_packets = layout.count * degree
            rows.append({
                "model": name, "encoding": ENCODING_LABEL[encoding], "values": len(vector),
                "raw_update_MB": len(vector) * 4 / 1e6,
                "values_per_fragment": layout.values_per_fragment, "fragments": layout.count,
                "encoded_MB": sum(len(e) for e in encoded) / 1e6,
                "data_packets_per_node_round": data_packets,
                "meaningful_packets_per_node_round": 2 * data_packets,
                "wire_MB_per_node_round": 2 * data_packets * frame / 1e6,
            })
    return rows
