"""The way in and out: node snapshots, install, the exit diff."""
