"""The CBS test of protocol v6 (findings/lm_cbs.py: v6_cbs_test, docs/protocols.md#v6-cbs) on made-up runs of a
version-6 sweep: wsd branches on a one-octave grid, a cooldown run per checkpoint (the annealed reference L_cool),
and the EWA arm; the runs are told apart by their variant names, as the spec names them."""
import numpy as np
import pandas as pd

from bsresearch.findings import lm_cbs
from bsresearch.findings.verdict import Verdict

CHECKPOINTS = (131072.0, 524288.0, 2097152.0, 8388608.0)
KS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
GROWS = {131072.0: 2, 524288.0: 8, 2097152.0: 32, 8388608.0: 32}    # the CBS / 8: growth, then a plateau


def sweep(keep_up=GROWS.get, cool=lambda c: 3.0, end=lambda c: 2.8, seeds=(50, 51, 52, 53, 54), b0=8,
          ewa_keep_up=None, states=None):
    """`keep_up(c)`: the largest k whose loss matches L_1 (ratio 1; above it 1.05), one octave more on odd
    seeds so the CBS varies over seeds; cooldown loss cool(c), the k = 1 branch's end loss end(c)."""
    rows = []
    states = states or {}
    for seed in seeds:
        for c in CHECKPOINTS:
            top = keep_up(c) * (2 if seed % 2 else 1)
            t = int(np.log2(c))
            for k in KS:
                for arm, limit in (("", top), ("_ewa", (ewa_keep_up or keep_up)(c))):
                    loss = end(c) * (1.0 if k <= limit else 1.05)
                    variant = f"t{t}_k{k}{arm}"
                    rows.append({"variant": variant, "batch_schedule": "tokens", "batch_at_tokens": (c,),
                                 "batch_sizes": (k * b0,), "batch_size": b0, "budget_amount": 1.5 * c,
                                 "seed": seed, "state": states.get((variant, seed), "ok"), "test_loss": loss})
            rows.append({"variant": f"t{t}_cool", "batch_schedule": "tokens", "batch_at_tokens": (c,),
                         "batch_sizes": (b0,), "batch_size": b0, "budget_amount": 1.1 * c, "seed": seed,
                         "state": "ok", "test_loss": cool(c)})
            rows.append({"variant": f"at{t}", "batch_schedule": "constant", "batch_at_tokens": (),
                         "batch_sizes": (), "batch_size": b0, "budget_amount": c, "seed": seed, "state": "ok",
                         "test_loss": 3.5})
    return pd.DataFrame(rows)


def test_the_kinds_are_told_apart_by_variant_and_the_cooldown_is_the_reference_of_the_stall():
    kinds = lm_cbs.v6_kinds(sweep())
    assert {k: len(v) for k, v in kinds.items()} == {"branches": 180, "cooldowns": 20, "ewa": 180, "other": 20}
    test = lm_cbs.v6_cbs_test(sweep())
    # improvement against L_cool = 3.0: 1 - 2.8 / 3.0, not against the trajectory's 3.5 at the checkpoint
    assert np.allclose(test.stall_seeds["improvement"], 1 - 2.8 / 3.0)
    assert not test.stalls["stalled"].any()


def test_growth_then_a_plateau_is_reproduced_with_the_ewa_arm_beside_it():
    test = lm_cbs.v6_cbs_test(sweep())
    assert test.verdict == Verdict.REPRODUCED, test.why
    assert test.long.test is not None and test.long.test.d > 0 and test.long.test.g_high < 1
    assert test.ewa is not None and test.ewa.d == np.log2(32 / 2)


def test_a_reference_whose_annealed_loss_it_barely_beats_is_stalled_only_when_the_interval_says_so():
    end = {c: 2.8 for c in CHECKPOINTS[:-1]} | {CHECKPOINTS[-1]: 2.99}   # 0.3% better than L_cool: stalled
    test = lm_cbs.v6_cbs_test(sweep(end=end.get))
    assert test.stalls.set_index("checkpoint")["stalled"].tolist() == [False, False, False, True]
    assert test.long.last_used == CHECKPOINTS[-2] and test.verdict == Verdict.PARTLY      # no plateau before it


def test_unfinished_runs_and_a_censored_last_checkpoint_are_not_testable():
    test = lm_cbs.v6_cbs_test(sweep(states={("t23_k4", 50): "failed"}))
    assert test.verdict == Verdict.NOT_TESTABLE and "1 branch or cooldown runs have not ended" in test.why
    wide = {c: 256 for c in CHECKPOINTS}
    test = lm_cbs.v6_cbs_test(sweep(keep_up=wide.get))
    assert test.extend_last and test.verdict == Verdict.NOT_TESTABLE and "k = 512 is added there" in test.why
