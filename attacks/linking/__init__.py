"""Linking attacks on UnlinkableDFL.

timing
    Passive global adversary on the mixnet trace: flow-correlation (timing) attack and
    trace-consistent candidate sets (input: ``mixnet.AdversaryView`` only).
scoring
    Ground truth of fragment packets and the scores (accuracy, 1/|U_T| baseline, advantage).
content
    Curious-recipient content linking of decrypted fragments by cosine similarity
    (a boundary test outside the network-layer guarantee).
"""
