"""The whole PoC: where it stands (progress) and the decision record."""
