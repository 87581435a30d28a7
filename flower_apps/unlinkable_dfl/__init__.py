"""UnlinkableDFL: fragment-level decentralized FL over a simulated peer mixnet (see docs/unlinkable_dfl.md)."""
