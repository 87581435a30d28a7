"""Generic Flower Message-API strategies, named by mechanism (study glue lives in flower_apps/<study>/).

- Addressing logical clients (one convention for every study): ``cohorts`` (plan cohorts, round-robin
  or from a node-local placement, build ``train`` / ``evaluate`` / ``query.<action>`` messages with
  ``client-ids``, check replies against the plan and their type, one exchange loop), ``transport``
  (fast polling), ``records`` (record keys), ``fixed_cohort`` (a fixed cohort for Flower's FedAvg
  family).
- Round patterns: ``base`` (``PatternStrategy``: the grid view a round uses), ``fedavg_equal``
  (FL, equal client weights), ``fedavg_examples`` (FedAvg weighted by examples), ``sequential``
  (token passing); ``registry`` maps framework names to them. Every plan-checked layer keeps the
  per-client metrics of the replies that passed (``client_metrics``, strategies.cohorts).
- Wrappers (composition, like Flower's DP wrappers): ``matched_perturbation``,
  ``server_fixed_clipping``, ``personalized_clipping``, ``drift_guard``, ``observer``, ``canaries``
  (audit canary clients inside the trusted aggregation, issue 13) and resume's round offset, all on
  the one base ``wrapper.StrategyWrapper``, which delegates the protocol every layer speaks
  (``layer``: grid view, round limits, array claims, member weights, the member clip, per-layer
  records; ``layers()`` walks a composition); the server-side clip-and-noise ones on
  ``clipping_wrapper.ClippingWrapper``, a StrategyWrapper.
  Other algorithms: ``fedadam_buffers``.
- ``flwr_adapter``: every non-public piece of Flower the project uses (the FedAvg mean, the FedOpt mean
  hook, DP clip / sigma, logger name, run-config parsing, task identity), gated on flwr 1.42.0.
"""
