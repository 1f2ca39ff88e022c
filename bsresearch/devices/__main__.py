"""`python -m bsresearch.devices FOLDER`: one task of a run's Slurm job step, as the srun launcher starts it
(launch.srun_command); FOLDER is the step's folder in the run directory (what to train, where to meet, where
to report). Not a command for people: `bsresearch train` and `bsresearch sweep` with `--launcher srun` start it."""
import sys

from .launch import step_task_main
from .place import leave_process

if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m bsresearch.devices FOLDER (started by the srun launcher)")
    step_task_main(sys.argv[1])
    leave_process(0)
