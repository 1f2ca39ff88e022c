"""The published findings bsresearch reproduces, one module each; a finding has one name everywhere:
bsresearch/findings/<name>.py (its analysis), bsresearch/plots/findings/<name>.py (its figures),
tests/test_findings_<name>.py, notebooks/NN_<name>*.py (the analysis notebook, NN from 20),
experiments/<name>*.yaml (its sweeps) and reports/<name>*/.

    keskar           Keskar et al. 2017: large batches find sharper minima and generalize worse
    dinh             Dinh et al. 2017: sharpness is not reparameterisation-invariant
    hoffer           Hoffer et al. 2017: train longer (regime adaptation, ghost BN, sqrt scaling)
    goyal            Goyal et al. 2017: linear lr scaling with warmup, and where it breaks
    steps_to_target  Shallue et al. 2019 / McCandlish et al. 2018: steps to a target vs batch size, B_crit
    smith_le         Smith & Le 2018 / Jastrzebski et al. 2017: the optimal batch size follows lr N
    nqm              Zhang et al. 2019: the noisy quadratic model's critical batch
    adam_vs_sgd      Zhang et al. 2019 / Nado et al. 2021: B_crit of Adam against momentum SGD
    ghost_batch      Hoffer et al. 2017: test accuracy against the ghost batch size at one large batch
    smith_kindermans Smith, Kindermans, Ying & Le 2018: grow the batch instead of decaying the lr
    masters_luschi   Masters & Luschi 2018: the range of stable learning rates narrows as the batch grows
    sharpness_generalization  Jiang et al. 2020 / Andriushchenko et al. 2023: sharpness measures against the gap
    lm_cbs           Merrill et al. 2025: a language model's critical batch size measured by branching
    lm_batch_warmup  Merrill et al. 2025: batch-size warmup following that critical batch size
    lm_small_batch   Marek et al. 2025: small batches, Adam's beta2 at a fixed half-life, plain SGD
    bn_budget        B/N, B/B_crit or the step budget: which one predicts Goyal's break and Hoffer's gap
    lr_over_b        Smith & Le 2018 / Jastrzebski et al. 2017: test accuracy at a common train loss against lr/B
    eoss             Andreyev & Beneventano 2024 / Cohen et al. 2021, 2022: the edge of (stochastic) stability

What several findings share:

    runs             a measurement applied to every finished run's weights
    verdict          the one verdict type every pre-registered test returns (reproduced, partly, not reproduced, ...)
    protocol         the protocol version each report is judged by (report folder -> docs/protocols.md version)
    power            how many seeds a pre-registered test needs: the power of its interval at a measured variance

Settings and pre-registered tests: docs/protocols.md. Analysis only: no module here imports matplotlib or
seaborn (the figures import the analysis, never the other way round). keskar, dinh and runs import torch
(they load trained weights); the others are torch-free.
"""
