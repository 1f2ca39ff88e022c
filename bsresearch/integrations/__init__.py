"""bsresearch's measurements inside a trainer of one's own: the gradient noise scale (for free under gradient
accumulation and DDP) and the curvature along training, as a Hugging Face Trainer callback
(`bsresearch.integrations.hf.BatchSizeCallback`, extra `bsresearch[hf]`), a Lightning callback
(`bsresearch.integrations.lightning.BatchSizeCallback`, extra `bsresearch[lightning]`) or in a plain loop
(`bsresearch.integrations.core.Meter`). docs/own-trainer.md.

Modules: core (the Meter, framework-free: rows, noise, curvature, files), gradients (each micro-batch's gradient
from parameter hooks), batches (units, parts and the probe batch of a batch), checks (what cannot be measured),
summary (summary.md and history.png), hf and lightning (the adapters; each imports its framework).
Nothing is imported here, so importing this package needs neither framework.
"""
