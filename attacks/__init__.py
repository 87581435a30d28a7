"""Privacy attacks and their metrics.

Subpackages
-----------
membership
    Shadow-model membership inference (Shokri et al. 2017) on three scalar output
    features, the loss-threshold baseline (Yeom et al. 2018), and offline LiRA
    (Carlini et al. 2022) with reference models that never saw the candidates.
attribute
    Model-based attribute inference (Fredrikson et al. 2014) against a prior baseline.
inversion
    Gradient inversion (DLG, iDLG, Inverting Gradients) against a single-example
    gradient or a clipped and noised model update. Attacks receive only an
    :class:`~attacks.inversion.view.AdversaryView`; ground truth meets the
    reconstruction only in :mod:`attacks.inversion.metrics`.

Modules
-------
stats
    Mean, sample SD and 95 % Student-t interval over seeds.
"""
