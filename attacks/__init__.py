"""Privacy attacks and their metrics.

Subpackages
-----------
membership
    Membership attacks by name (``run_membership_attack``: a model, member and
    non-member sets in, AUC / TPR at low FPR / advantage out): shadow-free scores
    (loss threshold, Yeom et al. 2018; confidence and entropy, Salem et al. 2019;
    modified entropy, Song & Mittal 2021) and shadow-model attacks (Shokri et al.
    2017) on three scalar output features; offline LiRA (Carlini et al. 2022) with
    reference models that never saw the candidates.
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
