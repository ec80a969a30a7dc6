"""The page cache before a timed start: dropped (globally, or the files the start reads),
warm when the plan asks, not_allowed when no drop can be made; and the plan's conditions."""

from __future__ import annotations

import os

from tasks.engine import page_cache
from tasks.engine.page_cache import prepare_cache
from tests.unit.test_page_cache import _resident_pages


def test_a_refused_global_drop_drops_the_files_the_start_reads(tmp_path, monkeypatch) -> None:
    weights = tmp_path / "prepared" / "weights.bin"
    weights.parent.mkdir()
    weights.write_bytes(os.urandom(4 << 20))
    os.sync()
    weights.read_bytes()  # in the cache now
    assert _resident_pages(weights) > 0
    # A host that refuses /proc/sys/vm/drop_caches (not root, a container): a folder here.
    monkeypatch.setattr(page_cache, "DROP_CACHES", tmp_path)

    cache = prepare_cache("dropped", [weights.parent])

    assert (cache.state, cache.drop) == ("dropped", "files")
    assert cache.files > 1  # the weights and the interpreter's own files
    assert _resident_pages(weights) == 0
