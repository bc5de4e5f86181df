"""Tie-aware comparison of one denoising step against the reference."""

from __future__ import annotations

import numpy as np


def assert_step_matches(prev, ours, ref, conf, mask_id, what):
    """Committed sets equal up to ties at the boundary of the reference's top-k; tokens equal."""
    for b in range(prev.shape[0]):
        was_mask = prev[b] == mask_id
        ours_set = set(np.flatnonzero(was_mask & (ours[b] != mask_id)))
        ref_set = set(np.flatnonzero(was_mask & (ref[b] != mask_id)))
        assert len(ours_set) == len(ref_set), (
            f"{what} row {b}: committed {len(ours_set)} vs reference {len(ref_set)}"
        )
        assert not np.any(ours[b][~was_mask] != prev[b][~was_mask]), (
            f"{what} row {b}: a committed token changed"
        )
        if ours_set != ref_set:
            kth = min(conf[b, p] for p in ref_set)
            tol = 1e-4 * max(1.0, abs(kth))
            for p in ours_set ^ ref_set:
                assert abs(conf[b, p] - kth) <= tol, (
                    f"{what} row {b}: position {p} (confidence {conf[b, p]:.6g}) differs from the reference, "
                    f"whose boundary confidence is {kth:.6g}: not a tie"
                )
        for p in ours_set & ref_set:
            assert ours[b, p] == ref[b, p], f"{what} row {b} position {p}: token {ours[b, p]} vs {ref[b, p]}"
