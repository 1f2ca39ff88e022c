"""One run on several devices: data-parallel training with torch.distributed (DistributedDataParallel; gloo on
the CPU, NCCL on CUDA), in the one setup (runsetup) and the one loop (loop.Loop). One module per concern:

    place.py      where a process stands in its group (GroupPlace, from torchrun's or a Slurm step's
                  environment), joining the group (process_group), and whether an error says it lost a process
    batchnorm.py  BatchNorm over the global batch (AllReduceBatchNorm on the CPU, SyncBatchNorm on CUDA)
    engine.py     DeviceEngine: the loop's engine on one device, the model in DDP fed its share of each batch
    rank.py       run_rank: one process of the group (the setup, its member, DeviceEngine, the loop)
    launch.py     run_on_devices: start the processes here or as one Slurm job step, read their reports and
                  judge how the run ended
    launcher.py   the choice of launcher (processes or srun), read in one place; imports no torch
    __main__.py   `python -m bsresearch.devices FOLDER`: one task of a run's Slurm job step

The noise scale's communication hook and its callback live with the other estimators (noise/device.py).

What batch size means here: `batch_size` is the global batch of one optimizer update, whatever the number of
devices. Every process draws the same global batches from the run's seeded BatchSampler (the order does not
depend on the number of devices); each takes its share, and each accumulation step splits into one
per-device batch of batch_size / (devices x accumulation steps) examples per device (DeviceEngine.share).
Every device's loss is the mean over its share, micro-batches weighted as step.micro_batch_loss says, and DDP
averages the devices' gradients: the update is the global batch's mean-loss gradient, so a run on N devices
equals the run on one device at the same global batch to floating-point rounding (BatchNorm aside). The lr
follows the global batch (schedule.lr_at). Micro-batches before the last one skip the all-reduce (no_sync).

BatchNorm: each device normalises its own share (ghost BatchNorm at the per-device batch; the running
statistics are the first device's, which DDP broadcasts), or with sync_batchnorm the global batch (torch's
SyncBatchNorm on CUDA; on the CPU, AllReduceBatchNorm all-reduces the count, sum and sum of squares).

Rank 0 alone writes the run directory (Recording, Checkpointing); every rank runs the callbacks that decide
(Evaluation on identical weights, Divergence on the all-reduced batch loss), so all ranks stop together.
A collective waits at most place.COLLECTIVE_TIMEOUT seconds; a lost process ends the run `died`.

This package's __init__ imports nothing: the command line reads the launcher's choice without torch.
"""
