"""Fault runs at full size: the proofs of tests/acceptance, run longer."""
