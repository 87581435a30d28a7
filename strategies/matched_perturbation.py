"""Matched perturbation: clip, then add one Gaussian draw per round (a DP wrapper).

Seed paper, Algorithm 1 (FL): each client update dw_i = w_i - w(t) is clipped to C, the
clipped updates are averaged (by the wrapped strategy), and one z ~ N(0, sigma_abs^2 I)
is added: w(t+1) = w(t) + mean + z.

Algorithm 2 (sequential DFL): the update accumulated over the round, v - w(t), is
clipped once to C and one z is added.

Composed like Flower's ``DifferentialPrivacyServerSideFixedClipping`` (wrap any strategy,
clip, delegate aggregation, add noise), with three differences: noise comes from an
explicit generator that no client can reproduce (privacy.randomness: OS entropy by default);
sigma_abs is computed from the clients the server *asked* this round whose replies arrived
valid (strategies.cohorts.check_replies: a reply that claims clients it was not asked for is
rejected and counted as a failure, so no participant can shrink sigma, and a failed client can
only *raise* the noise); and every clipping event is recorded.

Threat model: the noise hides each client's update from the other clients and from anyone who
sees the released models (the server is trusted to add it).

Client sampling (``sampler``, privacy.sampling; None = full participation, the seed paper's setting, and
the code path is then unchanged). *Fixed size* (m = round(q N) clients): the round is today's round over
the m sampled clients: the mean over the valid members, sigma_abs sized by them (C / m at full
attendance; replace-one sensitivity 2C/m). *Poisson* (each client with probability q), as DP-FedAvg
(McMahan et al. 2018): the sum of the members' clipped updates is divided by the fixed expected cohort
D = q x population, not by the draw's size, and sigma_abs = calibrate_sigma_abs(C, D, ...) is sized
for that fixed denominator (add/remove sensitivity C/D, whatever the draw, a failure or a rejection).
Every Poisson round releases, an empty or all-failed cohort included: w(t) + z (an unchanged model
would tell everyone that nobody was sampled). In sequential DFL the chain runs over the sampled
clients, its round update is clipped once as before, and sigma_abs is the same D-sized value as FL's
(matched). Amplification by sampling protects against whoever sees the releases but not the draw; the
draw is the server's secret (privacy.sampling).

Broken variants (issue 37, ``fault``; privacy/faults.py, refused unless ``PPFL_ALLOW_DP_FAULTS=1``)
change only what the mechanism *does*; what it reports (``sigma-abs``, the clip counters) stays what
the correct mechanism would report, as a real bug would: ``noise-div-k`` adds sigma_abs / k;
``wrong-cohort`` sizes sigma_abs for ``WRONG_COHORT_FACTOR`` x the cohort (and reports it);
``skip-clip`` leaves every update unclipped while the counters still count norm > C as clipped;
``clip-after-noise`` adds the noise to the unclipped aggregate and clips the round's update to C
afterwards.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from privacy.faults import FAULTS_BY_STUDY, WRONG_COHORT_FACTOR, check_fault, noise_divisor
from privacy.mechanisms import calibrate_sigma_abs, clip_by_l2, gaussian_noise_like
from privacy.randomness import STREAM_MATCHED_PERTURBATION, NoiseSource, generator_state, set_generator_state
from privacy.sampling import CohortSampler
from strategies.layer import layer_of
from strategies.records import client_arrays, client_key, from_numpy, number, to_numpy
from strategies.wrapper import StrategyWrapper

log = logging.getLogger(__name__)
CLIP_LEVELS = ("client", "aggregate")
#: the broken variants this mechanism can carry (privacy/faults.py; tests and benchmarks only)
FAULTS = FAULTS_BY_STUDY["dfl-dp"]
CANARY_PREFIX = "canary-"  # clip events of audit canaries (strategies.canaries): kept out of the clip counters


class MatchedPerturbation(StrategyWrapper):
    """Wrap ``strategy`` with update clipping at ``clip_norm`` and calibrated Gaussian noise.

    Parameters
    ----------
    strategy : the wrapped strategy (EqualWeightFedAvg or SequentialDFL, possibly inside CanaryInsertion or
        another wrapper); its ``member_weights`` must be "equal" (an example-weighted mean is refused: the
        noise would be miscalibrated).
    clip_norm : C.
    eps_cal, delta_cal : calibration of sigma_abs = (C / N) sqrt(2 ln(1.25/delta_cal)) / eps_cal.
    clip_at : "client" (Algorithm 1: every client update) or "aggregate" (Algorithm 2).
    noise : where the noise randomness comes from (default: secure, OS entropy).
    stream : labels mixed into a seeded noise source (e.g. the run seed), so runs differ.
    fault : '' (the mechanism) or one of :data:`FAULTS` (a deliberately broken one, see the module doc).
    sampler : the round's cohort draw (client sampling, see the module doc), shared with the strategy that
        plans the messages; None = full participation.
    """

    def __init__(
        self,
        strategy: Strategy,
        clip_norm: float,
        eps_cal: float,
        delta_cal: float,
        clip_at: str,
        noise: NoiseSource | None = None,
        stream: tuple[int, ...] = (),
        fault: str = "",
        sampler: CohortSampler | None = None,
    ) -> None:
        if clip_at not in CLIP_LEVELS:
            raise ValueError(f"clip_at must be one of {CLIP_LEVELS}, got {clip_at!r}")
        if fault and fault not in FAULTS:
            raise ValueError(f"fault must be '' or one of {FAULTS}, got {fault!r}")
        check_fault(fault)  # refused unless PPFL_ALLOW_DP_FAULTS=1 (never a production default)
        calibrate_sigma_abs(clip_norm, 1, eps_cal, delta_cal)  # validates the arguments
        weights = layer_of(strategy).member_weights
        if weights != "equal":
            # sigma_abs = (C / N) ...: the sensitivity of a mean of N equal-weight clipped updates. A weighted
            # mean's is C max_k p_k > C / N, so this noise would be too small for the epsilon it reports.
            raise ValueError(f"matched perturbation sizes its noise for a mean of equal-weight members; "
                             f"{type(strategy).__name__} weights them by {weights!r}")
        super().__init__(strategy)
        self.clip_norm = clip_norm
        self.eps_cal = eps_cal
        self.delta_cal = delta_cal
        self.clip_at = clip_at
        self.noise = noise or NoiseSource()
        self.rng = self.noise.numpy_generator(STREAM_MATCHED_PERTURBATION, *stream)
        self._current: OrderedDict[str, np.ndarray] | None = None
        self.fault = fault
        self.sampler = sampler
        self.clip_events: list[dict] = []  # one entry per clipped quantity, every round
        if clip_at == "client":
            # Audit canaries are cohort members: their models pass through this same client clip (a layer that
            # adds no members of its own ignores it: strategies.layer.Layer.clip_members_with).
            layer_of(strategy).clip_members_with(self._clip_model)

    def state(self) -> dict[str, Any]:
        """The layer's records and every clip event; the noise generator's state only for a seeded source (a
        secure source's state is a secret: a resumed run draws fresh entropy, as a new process does)."""
        out = {**super().state(), "clip_events": json.dumps(self.clip_events)}
        if self.noise.mode == "seeded":
            out["noise_state"] = generator_state(self.rng)
        return out

    def restore_state(self, state: dict[str, Any]) -> None:
        super().restore_state(state)
        self.clip_events = [{**e, "round": int(e["round"])} for e in json.loads(state["clip_events"])]
        if self.noise.mode == "seeded":
            if "noise_state" not in state:
                raise ValueError("the checkpoint holds no noise-generator state for this seeded matched perturbation")
            set_generator_state(self.rng, state["noise_state"])

    def summary(self) -> None:
        log.info("MatchedPerturbation(C=%g, eps_cal=%g, clip at %s) wrapping:", self.clip_norm, self.eps_cal,
                 self.clip_at)
        self.strategy.summary()

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self._current = to_numpy(arrays)
        return super().configure_train(server_round, arrays, config, grid)

    def _clip_model(self, server_round: int, who: str, model: OrderedDict[str, np.ndarray]) -> OrderedDict:
        assert self._current is not None
        keys = list(self._current)
        update = [model[k].astype(np.float64) - self._current[k] for k in keys]
        clipped, norm, was_clipped = clip_by_l2(update, self.clip_norm)
        self.clip_events.append({"round": server_round, "who": who, "norm": norm, "clipped": was_clipped})
        if self.fault in ("skip-clip", "clip-after-noise"):
            # The bug: the update goes on unclipped (clip-after-noise clips after the noise instead), while
            # the event above still says "clipped" whenever norm > C.
            return OrderedDict((k, model[k]) for k in keys)
        return OrderedDict((k, (self._current[k] + u).astype(self._current[k].dtype)) for k, u in zip(keys, clipped))

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        if self._current is None:
            raise RuntimeError("aggregate_train called before configure_train")
        checked = self.check(server_round, replies)
        n_events_before = len(self.clip_events)
        if self.clip_at == "client":
            for reply in checked.valid:
                for cid, rec in client_arrays(reply).items():
                    reply.content[client_key(cid)] = from_numpy(self._clip_model(server_round, f"client-{cid}",
                                                                                 to_numpy(rec)))
        arrays, metrics = self.strategy.aggregate_train(server_round, checked.replies)
        metrics = MetricRecord() if metrics is None else metrics
        # The cohort is the server's plan: planned clients whose replies arrived valid.
        contributors = len(checked.contributors)
        if int(number(metrics.get("num-contributors", contributors))) != contributors:
            raise RuntimeError(f"round {server_round}: the wrapped strategy counted "
                               f"{metrics.get('num-contributors')} contributors, the plan {contributors}")
        metrics["num-rejected"] = len(checked.rejected)
        poisson = self.sampler is not None and self.sampler.scheme == "poisson"
        if not poisson and (arrays is None or contributors == 0):
            # Nothing was released this round, so nothing needs noise.
            return None, metrics
        # Audit canaries (strategies.canaries) are cohort members like any client: they size the noise too.
        members = contributors + int(number(metrics.get("num-canaries", 0)))
        if poisson:
            assert self.sampler is not None  # typing: poisson implies a sampler
            # DP-FedAvg: the members' sum over the fixed expected cohort D (module doc); every round releases.
            model = self._over_fixed_denominator(None if arrays is None else to_numpy(arrays), members)
            cohort: float = self.sampler.cohort_size
        else:
            assert arrays is not None  # typing: checked above
            model = to_numpy(arrays)
            cohort = members
        if self.clip_at == "aggregate":
            model = self._clip_model(server_round, "round", model)
        if self.fault == "wrong-cohort":
            cohort *= WRONG_COHORT_FACTOR
        sigma_abs = calibrate_sigma_abs(self.clip_norm, cohort, self.eps_cal, self.delta_cal)
        keys = list(model)
        noise = gaussian_noise_like([model[k] for k in keys], sigma_abs / noise_divisor(self.fault), self.rng)
        noised = OrderedDict((k, (model[k].astype(np.float64) + z).astype(model[k].dtype)) for k, z in zip(keys, noise))
        if self.fault == "clip-after-noise":
            noised = self._clip_after_noise(noised)
        all_events = self.clip_events[n_events_before:]
        events = [e for e in all_events if not e["who"].startswith(CANARY_PREFIX)]
        if len(events) < len(all_events):
            metrics["canary-clip-count"] = sum(e["clipped"] for e in all_events) - sum(e["clipped"] for e in events)
        metrics["sigma-abs"] = sigma_abs
        clip_count = sum(e["clipped"] for e in events)
        metrics["clip-count"] = clip_count
        metrics["clip-total"] = len(events)
        metrics["clip-fraction"] = clip_count / max(len(events), 1)
        # Summed in client order, not in the order the replies arrived (which varies run to run and moved the
        # mean's last bit, e.g. between the in-process and the flwr-run engines); each norm is order-free.
        norms = [e["norm"] for e in sorted(events, key=lambda e: str(e["who"]))]
        metrics["update-norm-mean"] = float(np.mean(norms)) if norms else 0.0
        return from_numpy(noised), metrics

    def _over_fixed_denominator(self, model: OrderedDict[str, np.ndarray] | None,
                                members: int) -> OrderedDict[str, np.ndarray]:
        """Poisson sampling: the round's model before noise, w(t) + (sum of the members' updates) / D.

        ``model`` is what the wrapped strategy returned: for FL (clip at "client") the mean of the
        ``members`` clipped models, rescaled here by members / D; for sequential DFL the chain's token
        (clipped afterwards as a whole). No member: w(t) itself (the release is then noise only).
        """
        assert self._current is not None and self.sampler is not None
        if model is None or members == 0:
            return OrderedDict((k, v.copy()) for k, v in self._current.items())
        if self.clip_at == "aggregate":
            return model
        scale = members / self.sampler.cohort_size
        return OrderedDict((k, (self._current[k] + (model[k].astype(np.float64) - self._current[k]) * scale)
                            .astype(model[k].dtype)) for k in model)

    def _clip_after_noise(self, noised: OrderedDict[str, np.ndarray]) -> OrderedDict[str, np.ndarray]:
        """The clip-after-noise bug: the round's noised update projected onto the C-ball (no event recorded)."""
        assert self._current is not None
        keys = list(noised)
        update = [noised[k].astype(np.float64) - self._current[k] for k in keys]
        clipped, _, _ = clip_by_l2(update, self.clip_norm)
        return OrderedDict((k, (self._current[k] + u).astype(noised[k].dtype)) for k, u in zip(keys, clipped))

    def clip_summary(self) -> dict:
        """Clipping over the whole run: frequency (%) and what was clipped."""
        ev = [e for e in self.clip_events if not e["who"].startswith(CANARY_PREFIX)]
        return {"clip_frequency_pct": 100.0 * float(np.mean([e["clipped"] for e in ev])) if ev else 0.0,
                "clip_unit": "client updates" if self.clip_at == "client" else "rounds"}
