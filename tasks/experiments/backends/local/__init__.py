"""The stages' side of the local backend: overhead and cold start on a local slot."""
